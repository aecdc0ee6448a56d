"""The runtime interface and what every runtime client shares.

This module owns:

* ``ContainerInfo``: what one runtime says about one container (or systemd unit), normalised;
* ``Runtime``: the small interface the recorder and the CLI use (``available``, ``find``,
  ``by_id``, ``restart_count``), whichever supervisor answers (podman, Docker, systemd);
* the shared plumbing: running a command with a timeout (``run_command``), reading a process's
  memory-cgroup path from ``/proc/PID/cgroup`` (``cgroup_path_of_pid``; the text is parsed by
  ``tracer.parse.cgroup``), Kubernetes names from Docker-style labels and names
  (``k8s_names``), and saying each failure once (``ReasonLog``).

Contract with the recorder: a runtime lookup never raises. A supervisor that is slow, gone,
confused or lying is the normal case when a host is in trouble (which is when whyrestart runs),
so every failure becomes ``None`` plus a reason in ``Runtime.last_error`` and the log, and the
recorder turns reasons into ``SampleError`` events ("nothing silent").
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracer.parse.cgroup import memory_path

__all__ = [
    "ContainerInfo",
    "LookupFailed",
    "ReasonLog",
    "Runtime",
    "cgroup_path_of_pid",
    "k8s_names",
    "run_command",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """One container (or unit) as its supervisor describes it at the time of the lookup.

    ``restart_count``, ``oom_killed`` and ``state`` are the supervisor's own claims: they are
    recorded beside whyrestart's evidence, not trusted over it (podman 4.3, for one, reports
    ``OOMKilled: false`` after a real cgroup OOM kill).
    """

    runtime: str  # "podman", "docker", "systemd"
    id: str  # full container id (systemd: the unit name)
    name: str  # without Docker's leading "/"
    cgroup_path: str | None  # memory-hierarchy path as in /proc/PID/cgroup; None when unknown
    pid: int  # main process (host pid namespace), 0 when not running
    restart_count: int | None  # the supervisor's count; None when it does not keep one
    restart_policy: str  # "no", "always", "unless-stopped", "on-failure", "on-failure:2"...
    healthcheck: tuple[str, ...] | None  # configured test, e.g. ("CMD-SHELL", "curl -f ...")
    image: str  # image name when known, else the image id ("" for units)
    state: str  # runtime's word: "running", "exited", "created" / systemd ActiveState
    oom_killed: bool | None  # the runtime's claim; None when it makes none
    pod: str | None = None  # Kubernetes pod name (podman: the pod id) when there is one
    namespace: str | None = None  # Kubernetes namespace
    # How the main process last ended and when it last started, as the supervisor keeps it
    # (read by post-mortem). exit_code: 128 + n for signal n, as runtimes report it; None when
    # it never ended. Times are ns on ``times_clock``: "realtime" (podman/docker FinishedAt,
    # RFC 3339) or "monotonic" (systemd's *TimestampMonotonic); None when unknown.
    exit_code: int | None = None
    exit_pid: int = 0  # the process that ended (systemd keeps it; runtimes do not: 0)
    started_ns: int | None = None
    finished_ns: int | None = None
    times_clock: str = "realtime"
    command: str = ""  # the main program's name, as configured ("" when unknown)
    # where the supervisor puts its cgroup when it runs (systemd: the unit's slice path + the
    # unit, also while it is stopped or between restarts, when ControlGroup is empty); None
    # when not known ahead
    cgroup_when_started: str | None = None
    health: tuple[tuple[int, int, int], ...] = ()  # health log: (start ns, end ns, exit code)
    # the Kubernetes pod's uid where the runtime keeps it (CRI: the kubelet's
    # io.kubernetes.pod.uid label); None elsewhere
    pod_uid: str | None = None


class LookupFailed(Exception):
    """Internal: a query to a supervisor failed. Runtimes catch it and return None."""


class ReasonLog:
    """Log each distinct failure once per runtime client, then only at debug level.

    A poller asks every second; a container that is gone would otherwise repeat one warning
    forever and drown what is new.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()

    def __call__(self, reason: str) -> None:
        if reason in self._seen:
            self._logger.debug("%s", reason)
            return
        if len(self._seen) < 1024:  # bounded: reasons can embed ids of many containers
            self._seen.add(reason)
        self._logger.warning("%s", reason)


class Runtime(abc.ABC):
    """A supervisor that can name containers/units and count their restarts.

    Implementations never raise from ``find``/``by_id``/``restart_count``: a failure returns
    ``None`` and sets ``last_error`` (None after a successful lookup; "not found" is a failure
    with a reason too, since the caller may want to say why a name did not resolve).
    """

    name: str = ""

    def __init__(self) -> None:
        self.last_error: str | None = None
        self._say = ReasonLog(logging.getLogger(f"tracer.runtimes.{self.name or 'runtime'}"))

    @abc.abstractmethod
    def available(self) -> bool:
        """Whether this supervisor can be asked on this host now (cheap; never raises)."""

    @abc.abstractmethod
    def find(self, name_or_id: str) -> ContainerInfo | None:
        """Look up by name, full id or unique id prefix."""

    def by_id(self, container_id: str) -> ContainerInfo | None:
        """Look up by id (full or unique prefix) only: a container *named* like the id of
        another one must not answer."""
        info = self.find(container_id)
        if info is not None and not info.id.startswith(container_id):
            self._fail(f"{self.name}: {container_id!r} names container {info.id[:12]}, not an id")
            return None
        return info

    def restart_count(self, container_id: str) -> int | None:
        """The supervisor's restart count for this container, None when unknown or gone."""
        info = self.by_id(container_id)
        return None if info is None else info.restart_count

    # -- helpers for implementations

    def _fail(self, reason: str, *, quiet: bool = False) -> None:
        """Record a failed lookup: ``last_error`` always, the log unless ``quiet``."""
        self.last_error = reason
        if quiet:
            log.debug("%s", reason)
        else:
            self._say(reason)

    def _found(self, info: ContainerInfo, proc_root: str) -> ContainerInfo:
        """A successful lookup. /proc/PID/cgroup is the kernel's word on the memory hierarchy,
        so it wins over the runtime's cgroup path (the path it asked for: on a systemd-managed
        v2 host podman's may lack the "/container" leaf the process really sits in). The pid
        read can race with an exit; then the runtime's path stays."""
        self._ok()
        proc_path = cgroup_path_of_pid(info.pid, proc_root)
        return info if proc_path is None else dataclasses.replace(info, cgroup_path=proc_path)

    def _ok(self) -> None:
        self.last_error = None


# ---------------------------------------------------------------------------------------------
# Commands


def run_command(
    argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a supervisor's CLI with a timeout; raise ``LookupFailed`` naming what went wrong.

    A non-zero exit is returned, not raised: "no such container" is an answer. ``env`` is
    *added* to the environment (tests set ``CONTAINERS_CONF``), and ``LC_ALL=C`` keeps the
    messages we show in one language.
    """
    full_env = dict(os.environ)
    full_env["LC_ALL"] = "C"
    if env:
        full_env.update(env)
    try:
        # subprocess.run kills the child when the timeout expires, so a hung CLI (a podman
        # waiting on a lock held by a stuck podman) cannot hang the recorder.
        return subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            env=full_env,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LookupFailed(f"`{_short(argv)}` timed out after {timeout_s:g} s") from exc
    except OSError as exc:
        raise LookupFailed(f"`{_short(argv)}` could not run: {exc.strerror or exc}") from exc


def _short(argv: Sequence[str]) -> str:
    text = " ".join(argv)
    return text if len(text) <= 200 else text[:197] + "..."


def first_line(text: str) -> str:
    """The first non-empty line of a CLI's stderr, for a one-line reason."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


# ---------------------------------------------------------------------------------------------
# /proc/PID/cgroup


def cgroup_path_of_pid(pid: int, proc_root: str = "/proc") -> str | None:
    """The memory-cgroup path of a live process, None when it is gone or unreadable."""
    if pid <= 0:
        return None
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8") as f:
            return memory_path(f.read())
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# Shared JSON helpers (runtime JSON is untrusted: any field may be missing or null)


def get_dict(obj: Mapping[str, Any] | None, key: str) -> Mapping[str, Any]:
    value = obj.get(key) if obj is not None else None
    return value if isinstance(value, Mapping) else {}


def get_str(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def get_int(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    # bool is an int subclass; a JSON true is not a count
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def inspect_sections(
    obj: Mapping[str, Any],
) -> tuple[str, Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]] | None:
    """A Docker-style inspect object (Docker's API and podman inspect share the layout): its
    Id and its State, Config and HostConfig sections; None when it has no Id (no container)."""
    cid = get_str(obj, "Id")
    if not cid:
        return None
    return cid, get_dict(obj, "State"), get_dict(obj, "Config"), get_dict(obj, "HostConfig")


def get_bool(obj: Mapping[str, Any], key: str) -> bool | None:
    value = obj.get(key)
    return value if isinstance(value, bool) else None


def restart_policy_text(policy: Mapping[str, Any]) -> str:
    """Docker/podman ``HostConfig.RestartPolicy`` → ``"on-failure:2"``, ``"always"``, ``"no"``.

    Both leave ``Name`` empty when no policy was given; that means "no".
    """
    name = get_str(policy, "Name") or "no"
    retries = get_int(policy, "MaximumRetryCount") or 0
    return f"{name}:{retries}" if name == "on-failure" and retries > 0 else name


def exit_state(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The exit state of a Docker-shaped inspect document (Docker and podman share these
    names): ``State.ExitCode``, ``State.StartedAt``/``FinishedAt`` (RFC 3339, Go's zero time
    for "never"), ``State.Health.Log`` (podman 4.3: also ``State.Healthcheck``) and the main
    program (``Path``, else ``Config.Cmd[0]``), as ``ContainerInfo`` keyword arguments."""
    from tracer.clock import parse_rfc3339_ns

    state = get_dict(obj, "State")
    started = parse_rfc3339_ns(get_str(state, "StartedAt"))
    finished = parse_rfc3339_ns(get_str(state, "FinishedAt"))
    running = get_bool(state, "Running") or get_str(state, "Status") == "running"
    # (not finished >= started: podman 4.3 stamps StartedAt after start returns, so a process
    # that exits at once has its FinishedAt a few ms *before* its StartedAt)
    ended = finished is not None and not running
    command = get_str(obj, "Path")
    if not command:
        cmd = get_dict(obj, "Config").get("Cmd")
        command = cmd[0] if isinstance(cmd, list) and cmd and isinstance(cmd[0], str) else ""
    health = get_dict(state, "Health") or get_dict(state, "Healthcheck")
    log_entries = health.get("Log")
    checks: list[tuple[int, int, int]] = []
    for entry in log_entries if isinstance(log_entries, list) else []:
        if not isinstance(entry, Mapping):
            continue
        start = parse_rfc3339_ns(get_str(entry, "Start"))
        end = parse_rfc3339_ns(get_str(entry, "End"))
        code = get_int(entry, "ExitCode")
        if start is not None and end is not None and code is not None:
            checks.append((start, end, code))
    return {
        "exit_code": get_int(state, "ExitCode") if ended else None,
        "started_ns": started,
        "finished_ns": finished if ended else None,
        "command": command.rsplit("/", 1)[-1][:64],
        "health": tuple(checks),
    }


def healthcheck_test(config: Mapping[str, Any]) -> tuple[str, ...] | None:
    """``Config.Healthcheck.Test`` as a tuple; None when absent or disabled (``["NONE"]``)."""
    test = get_dict(config, "Healthcheck").get("Test")
    if not isinstance(test, list) or not test or not all(isinstance(t, str) for t in test):
        return None
    if test[0] == "NONE":
        return None
    return tuple(test)


# Kubernetes' dockershim (and cri-dockerd) name containers
# k8s_<container>_<pod>_<namespace>_<pod uid>_<attempt>.
_K8S_NAME = re.compile(r"^k8s_([^_]+)_([^_]+)_([^_]+)_([^_]+)_(\d+)$")


def k8s_names(name: str, labels: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """(pod, namespace) of a Kubernetes-managed container, from its labels or its name."""
    if labels:
        pod = labels.get("io.kubernetes.pod.name")
        ns = labels.get("io.kubernetes.pod.namespace")
        if isinstance(pod, str) and pod:
            return pod, ns if isinstance(ns, str) and ns else None
    m = _K8S_NAME.match(name)
    if m:
        return m.group(2), m.group(3)
    return None, None
