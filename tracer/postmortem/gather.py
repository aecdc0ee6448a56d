"""Gathering what persists after a restart: the kernel log ring, the target's memory cgroups
and their ancestors now, and the runtime's record. This module owns every read post-mortem
makes; each source sits behind an injectable root or callable so tests run it on fixtures.

A source that cannot be read is a fact too (``KernelLog.readable`` False, with the reason):
the report says what is missing because of it. Bad targets (no such container, unit, pod,
pid) raise ``UsageError`` naming what was looked for and where.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracer import clock
from tracer.analysis.units import unit_of_cgroup
from tracer.errors import UsageError, WhyrestartError
from tracer.events import CgroupSample
from tracer.parse import cgpath
from tracer.parse.kmsg import KmsgRecord
from tracer.postmortem.correlate import (
    CgroupNow,
    ContainerLogs,
    Facts,
    KernelLog,
    LoggedOom,
    RuntimeState,
    Target,
    read_kernel_log,
)
from tracer.runtimes.base import Runtime
from tracer.sources.cgroupfs import CgroupLayout, CgroupResolver
from tracer.sources.kmsg import DEFAULT_PATH, KmsgReader
from tracer.sources.samplers import CgroupSampler


def read_ring(path: str = DEFAULT_PATH) -> list[KmsgRecord]:
    """Every record the kernel log ring still holds, oldest first (``/dev/kmsg`` read from its
    start). Raises ``PermissionProblem`` when it is restricted (``kernel.dmesg_restrict``)."""
    with KmsgReader(path, from_end=False) as reader:
        return reader.read_available()


@dataclass
class World:
    """Where the facts come from. Defaults read this machine; tests replace any part."""

    layout: CgroupLayout = field(default_factory=CgroupLayout.from_system)
    proc_root: str = "/proc"
    kmsg: Callable[[], list[KmsgRecord]] = read_ring
    runtimes: Sequence[Runtime] | None = None  # None: podman, then Docker (containers)
    systemd: Runtime | None = None  # None: systemctl (units)
    pods_log_root: str = "/var/log/pods"
    boottime: Callable[[], int] = clock.boottime_ns
    realtime_offset: Callable[[], int] = clock.realtime_offset_ns
    monotonic_offset: Callable[[], int] = clock.monotonic_offset_ns
    agent_state: str | None = None  # the agent's state dir (None: the agent's default)


def _container_runtimes(world: World) -> Sequence[Runtime]:
    """podman, a Kubernetes node's CRI runtime, then every Docker daemon a docker client here
    would use (DOCKER_HOST, the current context, the system socket...): the container runtimes
    ``record`` asks too."""
    if world.runtimes is not None:
        return world.runtimes
    from tracer.runtimes import probe
    from tracer.runtimes.cri import CriRuntime

    found, missing = probe()
    return [
        rt
        for rt in (*found, *missing)
        if rt.name in ("podman", "docker") or (isinstance(rt, CriRuntime) and rt in found)
    ]


def resolve(kind: str, spec: str, world: World, now: int) -> tuple[Target, RuntimeState | None]:
    """The target named on the command line, and its runtime's record. UsageError when
    nothing by that name exists (an exited container still exists until it is removed)."""
    if kind == "container":
        tried = []
        for rt in _container_runtimes(world):
            if not rt.available():
                tried.append(f"{rt.name}: not available here")
                continue
            info = rt.find(spec)
            if info is not None:
                label = f"{info.runtime} {info.name or info.id[:12]}"
                if info.pod and info.namespace:  # (as a recording names it: units.from_info)
                    label = f"pod {info.namespace}/{info.pod} container {info.name}"
                paths = (info.cgroup_path,) if info.cgroup_path else ()
                return Target(kind, spec, label, ids=(info.id,), paths=paths), RuntimeState(
                    info, now
                )
            tried.append(rt.last_error or f"{rt.name}: no container {spec!r}")
        raise UsageError(
            f"--container {spec}: no such container ({'; '.join(tried)})",
            "list them with `podman ps -a` / `docker ps -a`; a removed container's kills can "
            "still be found with --all or --cgroup",
        )
    if kind == "unit":
        from tracer.runtimes.systemd import SystemdRuntime

        srt = world.systemd or SystemdRuntime()
        if not srt.available():
            raise UsageError(
                f"--unit {spec}: systemd is not running here",
                "use --cgroup with the unit's cgroup path, or --all",
            )
        unit = srt.find(spec)
        if unit is None:
            raise UsageError(f"--unit {spec}: {srt.last_error or 'no such unit'}")
        paths = (unit.cgroup_path,) if unit.cgroup_path else ()
        return Target(kind, spec, unit.id, ids=(unit.id,), paths=paths), RuntimeState(unit, now)
    if kind == "pod":
        from tracer.runtimes.kubernetes import parse_pod

        _namespace, _name, uid = parse_pod(spec, world.pods_log_root)
        # the pod's cgroup is named by its uid, with "_" for "-" under the systemd driver
        ids = (f"pod{uid}", f"pod{uid.replace('-', '_')}")
        return Target(kind, spec, f"pod {spec}", ids=ids), None
    if kind == "cgroup":
        path = cgpath.relative(spec, world.layout.memory_root)
        return Target(kind, spec, path, paths=(path,)), None
    if kind == "pid":
        try:
            pid = int(spec)
        except ValueError:
            raise UsageError(f"--pid {spec}: not a process id") from None
        if pid <= 0:
            raise UsageError(f"--pid {spec}: not a process id")
        return Target(kind, spec, f"pid {pid}", pid=pid), None
    return Target("all", "", "this host"), None


def kubelet_logs(pod_dir: str, realtime_offset: int) -> tuple[ContainerLogs, ...]:
    """Per container of a pod: the restart count the kubelet's log file names give, and the
    previous container's log (when it was last written, and its last line, CRI format
    ``<time> <stream> <tag> <text>``)."""
    out = []
    try:
        containers = sorted(os.listdir(pod_dir))
    except OSError:
        return ()
    for name in containers:
        try:
            runs = sorted(
                int(f[: -len(".log")])
                for f in os.listdir(os.path.join(pod_dir, name))
                if f.endswith(".log") and f[: -len(".log")].isdigit()
            )
        except OSError:
            continue
        if not runs:
            continue
        prev = [n for n in runs if n < runs[-1]]
        path = os.path.join(pod_dir, name, f"{prev[-1]}.log") if prev else ""
        mtime = last = None
        if path:
            try:
                mtime = os.stat(path).st_mtime_ns
                last = _last_line(path)
            except OSError:
                path = ""
        out.append(
            ContainerLogs(
                container=name,
                restarts=runs[-1],
                previous_log=path,
                previous_ns=None if mtime is None else mtime - realtime_offset,
                last_line=last or "",
            )
        )
    return tuple(out)


def _last_line(path: str, tail: int = 4096) -> str:
    """The last line of a CRI log file, without its time, stream and tag."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - tail))
        lines = f.read().decode("utf-8", errors="replace").splitlines()
    line = lines[-1] if lines else ""
    parts = line.split(" ", 3)
    return parts[3] if len(parts) == 4 and parts[2] in ("F", "P") else line


def agent_journal(world: World, target: Target) -> tuple[str | None, tuple[dict[str, Any], ...]]:
    """The agent's verdict journal, when an agent ran here: its path and its verdicts about
    the target (read as `whyrestart history` reads it; unreadable or absent: none)."""
    from tracer.agent.journal import read_journal, select
    from tracer.agent.state import StateDir, default_state_dir

    sd = StateDir(world.agent_state or default_state_dir())
    if not (os.path.exists(sd.journal) or os.path.exists(sd.journal_old)):
        return None, ()
    try:
        entries = read_journal(sd.journal_old, sd.journal)
    except OSError:
        return sd.journal, ()
    return sd.journal, tuple(e for e in select(entries) if target.owns(e))


def kernel_log(world: World, monotonic_offset: int) -> KernelLog:
    try:
        records = world.kmsg()
    except WhyrestartError as exc:
        return KernelLog(readable=False, error=exc.message, fix=exc.fix or "")
    return read_kernel_log(records, monotonic_offset)


def cgroups_now(world: World, paths: Iterable[str], now: int) -> tuple[CgroupNow, ...]:
    """Each path and every ancestor, as it is now: limit, usage, peak, failure and OOM
    counters (the project's cgroup sampler, read once); a cgroup that is gone says so."""
    layout = world.layout
    if layout.memory_root is None:
        return ()
    resolver = CgroupResolver(layout, world.proc_root)
    seen: dict[str, CgroupNow] = {}
    for p in paths:
        for path in cgpath.ancestors(p):
            if path in seen:
                continue
            try:
                cid = resolver.id_of(path)
            except UsageError:
                seen[path] = CgroupNow(path, 0, exists=False)
                continue
            sampler = CgroupSampler(layout, path)
            try:
                got = [e for e in sampler.sample(now, cid) if isinstance(e, CgroupSample)]
            finally:
                sampler.close()
            if not got:
                seen[path] = CgroupNow(path, 0, exists=False)
                continue
            s = got[-1]
            seen[path] = CgroupNow(
                path,
                cid,
                exists=True,
                limit_bytes=s.limit_bytes,
                usage_bytes=s.usage_bytes,
                peak_bytes=s.peak_bytes,
                failcnt=s.failcnt,
                events=dict(s.events),
                psi_some_total_us=s.psi_some_total_us,
                psi_full_total_us=s.psi_full_total_us,
            )
    # deepest first: the target before its ancestors
    return tuple(sorted(seen.values(), key=lambda c: (-c.path.rstrip("/").count("/"), c.path)))


# --all asks the runtimes about this many containers at most (an inspect costs ~0.1 s)
MAX_NAMED = 32


def _named_containers(
    world: World, ooms: Sequence[LoggedOom], now: int
) -> tuple[RuntimeState, ...]:
    """The runtimes' records of the containers whose cgroups the kernel log's reports name
    (newest first; a removed container has none and stays known by its id)."""
    wanted: dict[tuple[str, str], None] = {}
    for o in reversed(ooms):
        unit = unit_of_cgroup(o.oom.task_memcg or o.oom.oom_memcg)
        if unit is not None and unit.kind in ("podman", "docker"):
            wanted[(unit.kind, unit.key)] = None
    runtimes = {rt.name: rt for rt in _container_runtimes(world)}
    out = []
    for kind, cid in list(wanted)[:MAX_NAMED]:
        rt = runtimes.get(kind)
        info = rt.by_id(cid) if rt is not None and rt.available() else None
        if info is not None:
            out.append(RuntimeState(info, now))
    return tuple(out)


def _exists(world: World, path: str) -> bool:
    return CgroupResolver(world.layout, world.proc_root).exists(path)


def gather(kind: str, spec: str, since_s: float | None, world: World | None = None) -> Facts:
    """Everything post-mortem knows about one target, on CLOCK_BOOTTIME."""
    world = world or World()
    now = world.boottime()
    mono, real = world.monotonic_offset(), world.realtime_offset()
    target, runtime = resolve(kind, spec, world, now)
    log = kernel_log(world, mono)
    since = max(0, now - int(since_s * 1e9)) if since_s is not None else 0
    matched = [o for o in log.ooms if target.matches(o.oom) and o.oom.ts >= since]
    if kind == "pid" and not matched:
        alive = os.path.isdir(os.path.join(world.proc_root, str(target.pid)))
        if not alive:
            where = (
                "the kernel log holds no OOM kill of it"
                if log.readable
                else f"the kernel log cannot be read ({log.error})"
            )
            raise UsageError(
                f"--pid {spec}: no such process, and {where}",
                "a pid names a process only while it runs; ask about its container "
                "(--container), unit (--unit) or cgroup (--cgroup) instead",
            )
    paths: list[str] = list(target.paths)
    for o in matched:
        paths += [p for p in (o.oom.task_memcg, o.oom.oom_memcg) if p]
    if kind == "cgroup" and not matched and not _exists(world, target.paths[0]):
        raise UsageError(
            f"--cgroup {spec}: no such cgroup now"
            + (", and the kernel log holds no OOM kill in it" if log.readable else ""),
            f"give a path relative to {world.layout.memory_root or 'the memory hierarchy'}"
            ", as in /proc/PID/cgroup",
        )
    others = _named_containers(world, matched, now) if kind == "all" else ()
    journal_path, journal = agent_journal(world, target)
    kubelet: tuple[ContainerLogs, ...] = ()
    if kind == "pod":
        namespace, name = spec.split("/")
        uid = target.ids[0][len("pod") :]
        kubelet = kubelet_logs(os.path.join(world.pods_log_root, f"{namespace}_{name}_{uid}"), real)
    return Facts(
        target=target,
        now_ns=now,
        since_ns=since,
        realtime_offset=real,
        monotonic_offset=mono,
        hierarchy=world.layout.hierarchy or "memory",
        kernel_log=log,
        cgroups=cgroups_now(world, dict.fromkeys(paths), now),
        runtime=runtime,
        kubelet=kubelet,
        others=others,
        journal_path=journal_path,
        journal=journal,
    )
