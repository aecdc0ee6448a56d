"""Building a recording's pipeline (tracer.pipeline.core) from its targets and profile: the
sources, the enrichers, and the watched set seeded, in the order that loses nothing. The
recorder (tracer/pipeline/record.py) runs what this builds."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tracer.bpf import hooks
from tracer.clock import boottime_ns
from tracer.gpu.side import SCAN_INTERVAL_NS, GpuSide
from tracer.pipeline.core import Enricher, Pipeline, Source
from tracer.pipeline.enrich import CgroupNamer, Follow, SenderExe, TmpfsAtFault, WatchSet
from tracer.pipeline.follow import Follower
from tracer.pipeline.sources import (
    POLL_MS,
    FollowerSource,
    GpuSource,
    KernelCounters,
    KmsgSource,
    RingSource,
    SamplerSource,
)
from tracer.sources.cgroupfs import CgroupLayout, CgroupResolver
from tracer.sources.samplers import DEFAULT_INTERVAL_NS, SamplerSet

if TYPE_CHECKING:
    from tracer.pipeline.record import Targets

DEFAULT_STALL_THRESHOLD_NS = 10_000_000


@dataclass(frozen=True, slots=True)
class Profile:
    """How a recording runs, apart from what it watches: an interactive one (``record``,
    ``tail``, ``repro``: the defaults) or the always-on agent (``tracer.agent.run.PROFILE``).

    ``agent``: the kernel counts clean exits outside a unit's main process instead of sending
    them (bpf/whyrestart.bpf.c), an OOM kill is judged as soon as its evidence is in, and no
    verdict is kept (the agent's sinks take each one as it comes). The rest is the loop's pace:
    how long a step waits for the ring (``idle_poll_ms`` once quiet for 3 polls), how often the
    cgroups are sampled (a quiet one in full only every ``quiet_interval_ns``), the longest gap
    between two GPU rescans of a process, and the reclaim stall worth an event of its own.

    ``self_guard``: the recorder bounds its own memory and lowers its OOM score
    (tracer.selfguard) while it runs. Those are its whole process's, so a program that runs a
    recording in a thread beside other work (the tests, which start containers while one
    records) turns it off: whatever it starts meanwhile would inherit them."""

    agent: bool = False
    poll_ms: int = POLL_MS
    idle_poll_ms: int | None = None
    sample_interval_ns: int = DEFAULT_INTERVAL_NS
    quiet_interval_ns: int | None = None
    gpu_rescan_max_gap_ns: int = SCAN_INTERVAL_NS
    stall_threshold_ns: int = DEFAULT_STALL_THRESHOLD_NS
    self_guard: bool = True


INTERACTIVE = Profile()  # record, tail, repro


def assemble(
    kernel: hooks.KernelHooks,
    resolver: CgroupResolver,
    follower: Follower,
    cg_layout: CgroupLayout,
    t: Targets,
    cgroup_ids: list[int],
    profile: Profile,
    extra_sources: Sequence[Source],
) -> tuple[Pipeline, WatchSet, GpuSide, KernelCounters]:
    """Attach the hooks, seed the watched set and build the pipeline, in the order that
    loses nothing: the kernel filters are filled before the samplers and the GPU side
    look at the watched set. The sinks are the caller's to add."""
    attached = kernel.attach()
    samplers = SamplerSet(
        cg_layout,
        resolver,
        interval_ns=profile.sample_interval_ns,
        quiet_interval_ns=profile.quiet_interval_ns,
    )
    watch = WatchSet(kernel, samplers, resolver, every=t.all, pids=t.pids, cgroup_paths=t.cgroups)
    sampler_source = SamplerSource(samplers, cg_layout.memory_version)
    opened: list[Source] = [sampler_source]  # closed again if the set-up fails half-way
    try:
        ring = RingSource(
            kernel,
            attached,
            hooks.ENRICHING,
            wait_ms=profile.poll_ms,
            idle_wait_ms=profile.idle_poll_ms,
        )
        opened.append(ring)
        kmsg = KmsgSource(watch.wants_kmsg)
        opened.append(kmsg)
        _seed(kernel, resolver, watch, samplers, t, cgroup_ids)
        # GPU evidence (tracer/gpu/side.py): its own BPF object and NVML, never fatal.
        gpu = GpuSide(
            filter_all=t.all,
            memcg_v1=cg_layout.memory_version == 1,
            # the kernel's watched set: a new process is watched by the GPU programs from
            # its fork, not ~10 ms later when its Fork event is decoded
            shared_maps={
                "watched_pids": kernel.watched_pids.fd,
                "watched_cgroups": kernel.watched_cgroups.fd,
            },
            watch_cgroups=bool(kernel.config.watch_cgroups),
            rescan_max_gap_ns=profile.gpu_rescan_max_gap_ns,
        )
        gpu_source = GpuSource(gpu)
        opened.append(gpu_source)
        gpu.watch(watch.known_pids)
        follower_source = FollowerSource(follower)
        opened.append(follower_source)
        for path in follower.follow_paths():
            kernel.follow_path(path)
        follower.start()
    except BaseException:
        for src in reversed(opened):
            with contextlib.suppress(Exception):
                src.close()
        raise
    counters = KernelCounters(kernel)
    # (the order of polling; the samplers last, so that what the enrichers learned from
    # this step's events is sampled in the same step)
    sources: list[Source] = [
        ring,
        kmsg,
        gpu_source,
        counters,
        follower_source,
        *extra_sources,
        sampler_source,
    ]
    enrichers: list[Enricher] = [
        watch,
        gpu_source,
        Follow(follower, kernel, watch),
        SenderExe(),
        TmpfsAtFault(),
        CgroupNamer(resolver, follower),
    ]
    pipeline = Pipeline(sources, enrichers, [], clock=boottime_ns)
    return pipeline, watch, gpu, counters


def _seed(
    kernel: hooks.KernelHooks,
    resolver: CgroupResolver,
    watch: WatchSet,
    samplers: SamplerSet,
    t: Targets,
    cgroup_ids: list[int],
) -> None:
    """The targets into the kernel's filter, the watched set and the samplers: the
    watched cgroups, the processes already in them, the watched pids."""
    for cid in cgroup_ids:
        kernel.watch_cgroup(cid)
    for path in t.cgroups:
        for pid in resolver.procs(path):
            watch.seed_pid(pid)
    for pid in t.pids:
        watch.seed_pid(pid)
    for path in t.cgroups:
        samplers.watch_cgroup(path)
    for pid in watch.known_pids:
        samplers.watch_pid(pid)
