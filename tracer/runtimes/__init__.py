"""Supervisors that name containers and count restarts: podman, Docker, CRI, systemd.

This package owns asking supervisors about what they run. ``base`` has the interface
(``Runtime``, ``ContainerInfo``); ``podman``, ``docker``, ``cri`` and ``systemd`` are the
clients. This module adds:

* ``detect()``: the runtimes that can be asked on this host now (``probe()``: and why each
  of the others cannot);
* ``RestartCountPoller``: a background thread that asks each watched container's runtime for
  its restart count every ``interval_s`` (and at once when ``poll_soon`` is called: a watched
  unit's main process just ended) and queues ``RestartCountSample`` tuples ``(ts, unit,
  source, count, exit_code, oom_killed)`` (``ts`` on CLOCK_BOOTTIME ns, the trace's clock;
  the last two are the supervisor's own record of its last exit) for the recorder to drain
  with ``poll()``; failed lookups queue ``RestartCountError`` tuples.

No runtime is a hard dependency: none installed, none running, or one hanging all give fewer
names and counts, never an exception or a stall in the recorder.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from tracer.clock import boottime_ns
from tracer.runtimes.base import ContainerInfo, Runtime
from tracer.runtimes.cri import CriRuntime, cri_endpoints
from tracer.runtimes.docker import DockerRuntime, docker_hosts
from tracer.runtimes.podman import PodmanRuntime
from tracer.runtimes.systemd import SystemdRuntime

__all__ = [
    "ContainerInfo",
    "DockerRuntime",
    "PodmanRuntime",
    "RestartCountError",
    "RestartCountPoller",
    "RestartCountSample",
    "Runtime",
    "SystemdRuntime",
    "detect",
    "probe",
]

log = logging.getLogger(__name__)


def detect(
    *,
    docker_socket: str | None = None,
    podman_args: Sequence[str] = (),
    podman_env: Mapping[str, str] | None = None,
) -> list[Runtime]:
    """The runtimes that answer on this host, in the order a name is best looked up."""
    return probe(docker_socket=docker_socket, podman_args=podman_args, podman_env=podman_env)[0]


def probe(
    *,
    docker_socket: str | None = None,
    podman_args: Sequence[str] = (),
    podman_env: Mapping[str, str] | None = None,
    cri_endpoint: str | None = None,
) -> tuple[list[Runtime], list[Runtime]]:
    """(the runtimes that answer, the ones that do not: each with ``last_error`` saying why
    when it has a reason worth showing).

    Podman before Docker: where both are installed, podman's CLI answers for its own
    containers and Docker's socket for dockerd's; a name is tried in each in turn. Docker is
    every daemon a docker client here would use (``docker_hosts``: ``DOCKER_HOST``, the
    current context, the system socket, rootless sockets) unless ``docker_socket`` pins one;
    CRI is ``cri_endpoint`` when given (--runtime-endpoint), else ``cri_endpoints()``.
    """
    hosts = [f"unix://{docker_socket}"] if docker_socket else docker_hosts()
    candidates: list[Runtime] = [
        PodmanRuntime(global_args=podman_args, env=podman_env),
        # a Kubernetes node's runtime (CONTAINER_RUNTIME_ENDPOINT, else containerd's or CRI-O's
        # socket): before Docker, whose own containerd (no CRI plugin) does not answer here
        *(CriRuntime(s) for s in cri_endpoints(given=cri_endpoint)),
        *(DockerRuntime.for_host(h) for h in hosts),
        SystemdRuntime(),
    ]
    found: list[Runtime] = []
    missing: list[Runtime] = []
    for rt in candidates:
        try:
            ok = rt.available()
        except Exception:  # available() promises not to raise; a bug here must not stop a run
            log.exception("runtime %s: availability check failed", rt.name)
            ok = False
        (found if ok else missing).append(rt)
    return found, missing


class RestartCountSample(NamedTuple):
    ts: int  # CLOCK_BOOTTIME ns when the answer came back
    unit: str  # the label the recorder watches the container under
    source: str  # runtime name: "podman", "docker", "systemd"
    restart_count: int  # the supervisor's restart count ("count" would shadow tuple.count)
    # its record of the main process's last exit: the code as runtimes say it (128 + n for
    # signal n; None before any exit) and its OOM flag (systemd Result=oom-kill, Docker
    # OOMKilled; None when it keeps none)
    exit_code: int | None = None
    oom_killed: bool | None = None


class RestartCountError(NamedTuple):
    ts: int
    unit: str
    source: str
    message: str  # why no count came back (container gone, runtime timed out...)


_T = TypeVar("_T", RestartCountSample, RestartCountError)


@dataclass(slots=True)
class _Watch:
    unit: str
    runtime: Runtime
    container_id: str
    last_count: int | None = None
    last_exit: tuple[int | None, bool | None] = (None, None)
    last_error: str | None = None


class RestartCountPoller:
    """Poll restart counts in a background thread; ``poll()`` drains, ``stop()`` ends.

    * ``changes_only`` (default): a sample is queued the first time a count is read and when it
      changes, not every interval (the trace records changes; the last sample is the final count
      because ``stop()`` makes one last pass);
    * errors are queued once per unit and message, again only when the message changes, so a
      container that disappears gives one error, not one per second; it stays watched (a
      runtime that timed out under memory pressure answers again later);
    * queues are bounded (``max_queue``); the oldest entries are dropped and counted in
      ``dropped``.

    The caller's thread never waits on a runtime: ``watch``/``unwatch``/``poll``/``errors`` only
    take a short lock, and ``stop()`` waits at most ``timeout_s`` for the thread (which is a
    daemon, so an interpreter exit never hangs on a stuck runtime).
    """

    BURST = 4  # passes after a poll_soon, BURST_INTERVAL_S apart (then the interval again)
    BURST_INTERVAL_S = 0.1

    def __init__(
        self,
        interval_s: float = 1.0,
        *,
        changes_only: bool = True,
        max_queue: int = 10_000,
        clock: Callable[[], int] = boottime_ns,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self.changes_only = changes_only
        self._clock = clock
        self._lock = threading.Lock()
        self._watches: dict[str, _Watch] = {}
        self._samples: collections.deque[RestartCountSample] = collections.deque(maxlen=max_queue)
        self._errors: collections.deque[RestartCountError] = collections.deque(maxlen=max_queue)
        self.dropped = 0
        self._stop = threading.Event()
        self._wake = threading.Event()  # poll_soon: the next pass now, not at the interval
        self._burst = 0  # passes left at BURST_INTERVAL_S after a poll_soon
        self._thread: threading.Thread | None = None

    # -- caller side

    def watch(self, unit: str, runtime: Runtime, container_id: str) -> None:
        """Poll ``container_id``'s count from ``runtime`` under the label ``unit`` (re-watching
        a unit replaces its container: a recreated container has a new id)."""
        with self._lock:
            self._watches[unit] = _Watch(unit, runtime, container_id)

    def unwatch(self, unit: str) -> None:
        with self._lock:
            self._watches.pop(unit, None)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="restart-counts", daemon=True)
        self._thread.start()

    def poll(self) -> list[RestartCountSample]:
        """Samples queued since the last call, oldest first (never blocks on a runtime)."""
        with self._lock:
            out = list(self._samples)
            self._samples.clear()
        return out

    def errors(self) -> list[RestartCountError]:
        """Lookup failures queued since the last call, oldest first."""
        with self._lock:
            out = list(self._errors)
            self._errors.clear()
        return out

    def poll_soon(self) -> None:
        """Make the next pass now, and a few more soon after (a watched unit's main process
        ended: the supervisor's record of that exit is wanted while the verdict on it is still
        open, and a runtime learns of the exit a little after the kernel: containerd once its
        shim has reaped the process and sent it the exit event)."""
        self._burst = self.BURST
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the thread after one last pass; wait for it at most ``timeout_s``."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("restart-count poller still busy after %.1f s; left behind", timeout_s)

    def poll_once(self) -> None:
        """One pass over every watched container, in the calling thread (for tests and for a
        recorder that wants a count at a precise moment)."""
        with self._lock:
            watches = list(self._watches.values())
        for w in watches:
            self._query(w)

    def __enter__(self) -> RestartCountPoller:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- thread side

    def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                self.poll_once()
            except Exception:  # a bug in a runtime client must not end polling silently
                log.exception("restart-count poll failed")
            if self._stop.is_set():
                return  # that was the final pass
            # Wait out the rest of the interval (a slow pass shortens the wait, never overlaps);
            # stop() wakes the wait and one final pass follows.
            interval = self.interval_s
            if self._burst > 0:
                self._burst -= 1
                interval = min(interval, self.BURST_INTERVAL_S)
            self._wake.wait(max(0.0, interval - (time.monotonic() - started)))
            self._wake.clear()

    def _query(self, w: _Watch) -> None:
        rt = w.runtime
        last_exit: tuple[int | None, bool | None] = (None, None)
        try:
            info = rt.by_id(w.container_id)
            count = None if info is None else info.restart_count
            if info is not None:
                last_exit = (info.exit_code, info.oom_killed)
            reason = rt.last_error
        except Exception as exc:  # runtimes promise not to raise; keep polling if one does
            count, reason = None, f"{type(exc).__name__}: {exc}"
        ts = self._clock()
        with self._lock:
            if self._watches.get(w.unit) is not w:
                return  # unwatched or replaced while we were asking
            if count is None:
                message = reason or f"{rt.name}: no restart count for {w.container_id[:12]}"
                if message != w.last_error:
                    w.last_error = message
                    self._put(self._errors, RestartCountError(ts, w.unit, rt.name, message))
                return
            w.last_error = None
            if self.changes_only and (count, last_exit) == (w.last_count, w.last_exit):
                return
            w.last_count, w.last_exit = count, last_exit
            self._put(self._samples, RestartCountSample(ts, w.unit, rt.name, count, *last_exit))

    def _put(self, queue: collections.deque[_T], item: _T) -> None:
        if queue.maxlen is not None and len(queue) == queue.maxlen:
            self.dropped += 1  # deque(maxlen) drops the oldest by itself; count it
        queue.append(item)
