"""Containers, supervisors and probes during a recording: names, restarts, health.

The recorder hands this module the events it decodes; it answers with events of its own
(``UnitInfo``, ``RuntimeSample``, ``ProbeSample``, ``SampleError``) and with cgroup ids to add
to the kernel's watched set. It owns:

* naming: a cgroup whose path looks like a container or a systemd unit gets a ``UnitInfo``,
  with the runtime's name for it when a runtime answers (cached; a container that is already
  gone is still named by its id);
* following: ``--container`` and ``--unit`` targets stay watched across restarts. Runtimes
  recreate a container's cgroup on restart (same path, new id), so cgroup_mkdir events whose
  path belongs to a followed container (its id, or its name via the runtime) put the new id in
  the watched map; a systemd unit is followed at the path its slice gives it, from before it
  first starts (systemd removes a unit's cgroup when it stops and may between restarts);
* restart counts from the supervisors (a background poller, never blocking the recorder);
* Kubernetes identity: for a unit a node's CRI runtime named, its pod's uid, its container's
  id, the runtime's name and restart count (``identity``: the agent's OpenTelemetry
  attributes and its info series; no such identity for units named any other way);
* health: ``--probe`` probers, and a runtime's exec health checks seen in the kernel: a process
  exec'd into a followed container that does not descend from its main process (``podman
  healthcheck run``, ``docker exec``) becomes a probe sample with its duration and exit code.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tracer.analysis import units as unit_names
from tracer.errors import UsageError
from tracer.events import (
    CgroupMkdir,
    Event,
    Exec,
    Exit,
    Fork,
    ProbeSample,
    RuntimeSample,
    SampleError,
    UnitInfo,
)
from tracer.runtimes import RestartCountPoller, Runtime, probe
from tracer.runtimes.base import ContainerInfo
from tracer.runtimes.cri import CriRuntime
from tracer.sources.probes import Prober, ProbeSpec


@dataclass
class Followed:
    """A --container target: what the runtime said, and which processes are its own."""

    runtime: Runtime
    info: ContainerInfo
    label: str
    main_pid: int = 0
    members: set[int] = field(default_factory=set)  # the main process and its descendants
    cgroup_ids: set[int] = field(default_factory=set)
    checks: dict[int, int] = field(default_factory=dict)  # exec'd-in pid -> exec ts


@dataclass(frozen=True, slots=True)
class RuntimeIdentity:
    """A unit's container as a Kubernetes node's CRI runtime described it when it was named:
    the newest container under the unit's label (a restart is a new container, new id, the
    kubelet's attempt + 1). The facts OpenTelemetry names ``container.runtime.name``,
    ``container.id``, ``k8s.pod.uid`` and ``k8s.container.restart_count``."""

    runtime: str  # what the runtime's Version says it is: "containerd", "cri-o"
    container_id: str
    pod_uid: str | None  # None when the container carries no io.kubernetes.pod.uid label
    restart_count: int | None


# labels whose identity is kept: the newest first out (a node's jobs make pods by the thousand;
# the agent names each at most once, and a unit gone this long has no verdict left to come)
MAX_IDENTITIES = 65536


@dataclass
class ProbeSetup:
    specs: list[ProbeSpec]
    interval_s: float
    timeout_s: float


class Follower:
    def __init__(
        self,
        containers: Sequence[str],
        probes: ProbeSetup | None,
        path_of: Callable[[int], str | None],
        runtimes: list[Runtime] | None = None,
        units: Sequence[str] = (),
        id_now: Callable[[str], int | None] | None = None,
        cri_endpoint: str | None = None,
    ) -> None:
        """``id_now``: the id of the cgroup at a path now (``CgroupResolver.id_now``), to
        check that a runtime's answer still describes the cgroup being named."""
        self.path_of = path_of
        self.id_now = id_now
        # asking which runtimes answer costs a podman call or two: only when a container
        # is targeted or seen
        self._runtimes = runtimes
        self._cri_endpoint = cri_endpoint
        self.followed: list[Followed] = []
        self._named: dict[int, UnitInfo | None] = {}
        # (runtime index or "main", container id) -> what it answered
        self._lookups: dict[tuple[int | str, str], ContainerInfo | None] = {}
        self._answered_by: dict[str, Runtime] = {}  # container id -> the runtime that knew it
        self._unavailable: list[Runtime] = []
        # cgroup id -> (label, runtime, container id): containers named, not yet polled
        self.unpolled: dict[int, tuple[str, Runtime, str]] = {}
        self.poller = RestartCountPoller(interval_s=1.0)
        # label -> the container polled for it (a Kubernetes restart is a new container under
        # the same label: the newest one is polled, its count the kubelet's attempt)
        self._polled: dict[str, str] = {}
        self._identities: dict[str, RuntimeIdentity] = {}  # unit label -> its CRI identity
        self.probers: list[Prober] = []
        self._probe_specs: list[ProbeSpec] = []
        for name in containers:
            self.followed.append(self._resolve(name))
        for name in units:
            self.followed.append(self._resolve_unit(name))
        self._units_followed = bool(units)
        if probes is not None:
            for spec in probes.specs:
                self.probers.append(Prober(spec, probes.interval_s, probes.timeout_s))
                self._probe_specs.append(spec)

    @property
    def runtimes(self) -> list[Runtime]:
        if self._runtimes is None:
            self._runtimes, self._unavailable = probe(cri_endpoint=self._cri_endpoint)
        return self._runtimes

    def _why_not(self) -> list[str]:
        """Why the runtimes that did not answer did not (a dead dockerd, a DOCKER_HOST that
        points nowhere): only those with a reason to show."""
        return [rt.last_error for rt in self._unavailable if rt.last_error]

    # -- set-up ------------------------------------------------------------------------------

    def _resolve(self, name: str) -> Followed:
        if not self.runtimes:
            why = "; ".join(self._why_not())
            raise UsageError(
                f"--container {name}: no container runtime answers on this host"
                + (f" ({why})" if why else ""),
                "start the runtime (dockerd, podman), or point DOCKER_HOST at the Docker "
                "daemon's socket (unix:///PATH)",
            )
        for rt in self.runtimes:
            info = rt.find(name)
            if info is not None:
                label = unit_names.from_info(info.runtime, info.id, info.name, _pod(info)).label
                f = Followed(rt, info, label, main_pid=info.pid)
                if info.pid:
                    f.members.add(info.pid)
                self._answered_by[info.id] = rt
                self._learn(label, rt, info)
                return f
        reasons = "; ".join(
            [rt.last_error or f"{rt.name}: not found" for rt in self.runtimes] + self._why_not()
        )
        raise UsageError(
            f"--container {name}: no such container ({reasons})",
            "list containers with `docker ps -a` or `podman ps -a` (a Compose service can be "
            "named by its service name when it has one container)",
        )

    def _resolve_unit(self, name: str) -> Followed:
        rt = next((r for r in self.runtimes if r.name == "systemd"), None)
        if rt is None:
            raise UsageError(
                f"--unit {name}: systemd is not running here (it is not PID 1)",
                "use --cgroup with the unit's cgroup path, or --pid",
            )
        info = rt.find(name)
        if info is None or not info.cgroup_when_started:
            raise UsageError(
                f"--unit {name}: " + (rt.last_error or "no such unit"),
                "list units with `systemctl list-units --all`; give the full name (x.service)",
            )
        label = unit_names.from_info(info.runtime, info.id, info.name).label
        return Followed(rt, info, label, main_pid=info.pid)

    def start(self) -> None:
        for f in self.followed:
            self.poller.watch(f.label, f.runtime, f.info.id)
            self._polled[f.label] = f.info.id
        self.poller.start()
        for p in self.probers:
            p.start()

    def follow_paths(self) -> list[str]:
        """Cgroup paths the kernel should watch as soon as they are (re)created."""
        out = []
        for f in self.followed:
            if f.info.cgroup_path:
                out.append(f.info.cgroup_path)
            elif f.info.cgroup_when_started:
                out.append(f.info.cgroup_when_started)
            elif f.info.runtime == "podman":
                # podman (cgroupfs manager) puts a container at a fixed path; systemd-managed
                # hosts use machine.slice/libpod-<id>.scope instead
                out += [
                    f"/libpod_parent/libpod-{f.info.id}",
                    f"/machine.slice/libpod-{f.info.id}.scope",
                ]
            elif f.info.runtime == "docker":
                out += [f"/docker/{f.info.id}", f"/system.slice/docker-{f.info.id}.scope"]
        return out

    def initial_cgroups(self) -> list[str]:
        """Cgroup paths to watch from the start (followed containers that are running; a
        Kubernetes container's pod: the kubelet restarts it as a new container whose cgroup,
        named by the new id, the kernel cannot be told ahead, and whose first exec follows the
        mkdir too closely to be watched after it; its pod's cgroup holds every attempt)."""
        out = [f.info.cgroup_path for f in self.followed if f.info.cgroup_path]
        for f in self.followed:
            where = f.info.cgroup_when_started
            if isinstance(f.runtime, CriRuntime) and where and posixpath.dirname(where) != "/":
                out.append(posixpath.dirname(where))
        return out

    @property
    def following(self) -> bool:
        return bool(self.followed)

    # -- per batch ---------------------------------------------------------------------------

    def name(
        self, cgroup_id: int, path: str | None, ts: int, created: bool = False
    ) -> UnitInfo | None:
        """The UnitInfo for a newly seen cgroup, or None when it is no unit. ``created``: seen
        only being made (cgroup_mkdir, which the kernel reports for every cgroup on the host
        while containers are followed): its restart count is polled once a process of ours
        runs in it (``running_in``), not for every container another user starts."""
        if cgroup_id in self._named:
            return None
        unit = unit_names.unit_of_cgroup(path)
        info: UnitInfo | None = None
        if unit is not None and unit.kind in unit_names.CONTAINER_KINDS:
            found = self._lookup(unit.key)
            name = found.name if found else ""
            pod = _pod(found) if found else ""
            kind = found.runtime if found else unit.kind
            # the runtime's main pid is only this cgroup's if the container has not been
            # restarted since (a running container's cgroup is the one we see first), and
            # only for a cgroup that was there before we looked: one seen being created gets
            # its main process from the kernel (its first exec). A crash-looping container
            # makes a new cgroup at the same path for every run, and the runtime, asked a
            # moment after the mkdir, can already describe the next run: its pid would make
            # this run's own main process look exec'd in from outside (a main exit and a
            # restart link missing)
            # And the runtime is asked only now, a poll or more after the cgroup was first seen
            # (a run that dies within 100 ms, an OOM at start): its pid is this cgroup's only
            # if the cgroup at the path is still this one once it has answered.
            main = (
                found.pid
                if found
                and not created
                and found.cgroup_path == path
                and (self.id_now is None or (path is not None and self.id_now(path) == cgroup_id))
                and self._fresh(found)
                else 0
            )
            info = UnitInfo(
                ts=ts,
                cgroup_id=cgroup_id,
                kind=kind,
                unit_id=unit.key,
                name=name,
                pod=pod,
                main_pid=main,
            )
            label = unit_names.from_info(kind, unit.key, name, pod).label
            if found is not None:
                self._learn(label, self._answered_by.get(found.id), found)
            if found is not None and self._polled.get(label) != found.id:
                rt = self._answered_by.get(found.id)
                if rt is not None and created:
                    self.unpolled[cgroup_id] = (label, rt, found.id)
                elif rt is not None:
                    self.poller.watch(label, rt, found.id)
                    self._polled[label] = found.id
        elif unit is not None and unit.kind == "systemd":
            info = UnitInfo(
                ts=ts, cgroup_id=cgroup_id, kind="systemd", unit_id=unit.key, name=unit.key, pod=""
            )
        self._named[cgroup_id] = info
        return info

    def identity(self, label: str | None) -> RuntimeIdentity | None:
        """The CRI identity of the unit labelled ``label``; None for a unit no CRI runtime
        named (Docker, podman, systemd, a pod named from its cgroup and the kubelet's files)."""
        return self._identities.get(label) if label else None

    def _learn(self, label: str, rt: Runtime | None, info: ContainerInfo) -> None:
        if not isinstance(rt, CriRuntime):
            return
        self._identities.pop(label, None)  # (re-inserted: the newest last, the oldest dropped)
        self._identities[label] = RuntimeIdentity(
            runtime=info.runtime,
            container_id=info.id,
            pod_uid=info.pod_uid,
            restart_count=info.restart_count,
        )
        if len(self._identities) > MAX_IDENTITIES:
            del self._identities[next(iter(self._identities))]

    def forget_cgroups(self, ids: Iterable[int]) -> None:
        """Cgroups that are gone (``Recorder.forget_cgroups``)."""
        for cid in ids:
            self._named.pop(cid, None)
            self.unpolled.pop(cid, None)

    def running_in(self, cgroup_id: int) -> None:
        """A process event in a cgroup ``name`` saw only being created: poll its restarts."""
        label, rt, container_id = self.unpolled.pop(cgroup_id)
        if self._polled.get(label) != container_id:
            self.poller.watch(label, rt, container_id)
            self._polled[label] = container_id

    def _fresh(self, found: ContainerInfo) -> bool:
        key = ("main", found.id)
        if key in self._lookups:
            return False
        self._lookups[key] = found
        return True

    def _lookup(self, container_id: str) -> ContainerInfo | None:
        for i, rt in enumerate(self.runtimes):
            key = (i, container_id)
            if key not in self._lookups:
                found = self._lookups[key] = rt.by_id(container_id)
                if found is not None:
                    self._answered_by[found.id] = rt
            if self._lookups[key] is not None:
                return self._lookups[key]
        return None

    def on_events(self, events: Sequence[Event]) -> tuple[list[Event], list[int]]:
        """New events (probe samples from exec'd-in checks) and cgroup ids to watch."""
        out: list[Event] = []
        watch: list[int] = []
        for ev in events:
            if isinstance(ev, CgroupMkdir):
                f = self._owner_of_path(ev.path)
                if f is not None:
                    f.cgroup_ids.add(ev.cgroup_id)
                    f.main_pid = 0  # a new incarnation: its first process is the main one
                    f.members.clear()
                    watch.append(ev.cgroup_id)
            elif isinstance(ev, Exec):
                f = self._owner_of_cgroup(ev.cgroup_id)
                # (systemd runs no health checks in a unit: every exec there is the unit's)
                if f is None or f.info.runtime == "systemd" or ev.pid in f.members:
                    continue
                if not f.main_pid:
                    f.main_pid = ev.pid
                    f.members.add(ev.pid)
                elif ev.pid not in f.checks:
                    f.checks[ev.pid] = ev.ts  # exec'd into the container from outside
            elif isinstance(ev, Fork):
                for f in self.followed:
                    if ev.parent_pid in f.members:
                        f.members.add(ev.child_pid)
                    elif ev.parent_pid in f.checks:
                        f.checks[ev.child_pid] = -1  # part of a check, not a check itself
            elif isinstance(ev, Exit):
                if self._units_followed and self._owner_of_cgroup(ev.cgroup_id) is not None:
                    # a process of a followed unit ended: systemd's record of it (Result=oom-kill,
                    # its exit status) is read now, while the verdict on it is still open
                    self.poller.poll_soon()
                elif any(ev.pid == f.main_pid for f in self.followed):
                    # a followed container's main process ended: the runtime's record of it
                    # (CRI's exit code and reason, Docker's OOMKilled), the same
                    self.poller.poll_soon()
                for f in self.followed:
                    start = f.checks.pop(ev.pid, None)
                    f.members.discard(ev.pid)
                    if start is not None and start >= 0:
                        ws = ev.wait
                        code = ws.code if ws.code is not None else 128 + (ws.signal or 0)
                        out.append(
                            ProbeSample(
                                ts=start,
                                target="healthcheck",
                                unit=f.label,
                                latency_ns=ev.ts - start,
                                ok=code == 0,
                                timed_out=False,
                                status=code,
                                error="" if code == 0 else f"exit {code}",
                                pid=ev.pid,
                            )
                        )
        return out, watch

    def _owner_of_path(self, path: str) -> Followed | None:
        unit = unit_names.unit_of_cgroup(path)
        if unit is not None and unit.kind == "systemd":
            return next(
                (f for f in self.followed if f.info.runtime == "systemd" and f.info.id == unit.key),
                None,
            )
        if unit is None or unit.kind not in unit_names.CONTAINER_KINDS:
            return None
        for f in self.followed:
            if unit.key == f.info.id:
                return f
        found = self._lookup(unit.key)  # a new id: the same container by name (docker, k8s)
        if found is None:
            return None
        # (a Kubernetes container's name is its pod's: "hog" of another pod is not ours)
        return next(
            (f for f in self.followed if (f.info.name, _pod(f.info)) == (found.name, _pod(found))),
            None,
        )

    def _owner_of_cgroup(self, cgroup_id: int) -> Followed | None:
        for f in self.followed:
            if cgroup_id in f.cgroup_ids:
                return f
        path = self.path_of(cgroup_id)
        owner = self._owner_of_path(path) if path else None
        if owner is not None:
            owner.cgroup_ids.add(cgroup_id)
        return owner

    def poll(self) -> list[Event]:
        out: list[Event] = []
        for s in self.poller.poll():
            out.append(
                RuntimeSample(
                    ts=s.ts,
                    unit=s.unit,
                    source=s.source,
                    restart_count=s.restart_count,
                    state="",
                    exit_code=s.exit_code,
                    oom_killed=s.oom_killed,
                )
            )
        for e in self.poller.errors():
            out.append(SampleError(ts=e.ts, source=e.source, target=e.unit, message=e.message))
        unit = self.followed[0].label if len(self.followed) == 1 else ""
        for spec, prober in zip(self._probe_specs, self.probers, strict=True):
            out += [r.sample(spec.text, unit) for r in prober.poll()]
        return out

    def close(self) -> None:
        self.poller.stop()
        for p in self.probers:
            p.stop()


def _pod(info: ContainerInfo | None) -> str:
    if info is None or not info.pod or not info.namespace:
        return ""
    return f"{info.namespace}/{info.pod}"
