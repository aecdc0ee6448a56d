"""The live sources a recording polls (`tracer.pipeline.core.Source`), in the order they run.

Each wraps one owner of a kind of evidence and adds nothing but the contract: when to hold
back (the first source is ``behind``), what goes into the header, what is warned about.

* `RingSource`: the kernel hooks' ring buffer, decoded in batches; it paces the loop.
* `KernelCounters`: what the kernel side aggregates instead of sending (reclaim summaries per
  cgroup, kswapd wake-ups) and its count of records it could not hand over.
* `KmsgSource`: the kernel log: OOM reports (the fallback rung of the ``oom`` hook, kept when
  they concern the watched set) and GPU driver Xid lines.
* `GpuSource`: ``tracer.gpu.side.GpuSide`` (also an enricher: it learns the watched pids).
* `FollowerSource`: restart counts and ``--probe`` results (``tracer.pipeline.follow.Follower``).
* `SamplerSource`: the cgroupfs and /proc samplers that are due.
* `ProbeResultsSource`: health-probe results produced by someone else's thread (repro).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from tracer.bpf import layout, libbpf
from tracer.bpf.decode import Decoder
from tracer.bpf.libbpf import RingBuffer
from tracer.clock import boottime_ns, monotonic_offset_ns
from tracer.events import Event, KmsgOom, Lost, ReclaimSummary
from tracer.parse import xid
from tracer.parse.kmsg import OomAssembler
from tracer.pipeline.core import HeaderPart
from tracer.sources.kmsg import KmsgReader, record_ts_ns

if TYPE_CHECKING:
    from tracer.bpf import hooks
    from tracer.gpu.side import GpuSide
    from tracer.pipeline.follow import Follower
    from tracer.sources.probes import ProbeResult
    from tracer.sources.samplers import SamplerSet

__all__ = [
    "FollowerSource",
    "GpuSource",
    "KernelCounters",
    "KmsgSource",
    "ProbeResultsSource",
    "RingSource",
    "SamplerSource",
]

POLL_MS = 10
# Empty polls in a row before RingSource waits its idle_wait_ms. Three, not ten: each OOM kill
# kept the agent at ten wake-ups a second for a second after its last record, a quarter of
# what a paced OOM kill cost it (9-10 ticks of CPU for 10 kills instead of 12-13), and the
# kill's verdict needs nothing that comes later than that (kill to /metrics stayed 0.21 s).
IDLE_POLLS = 3
# Reclaim aggregates are read from the kernel this often (one summary per cgroup and kind).
RECLAIM_DRAIN_NS = 1_000_000_000


class _Quiet:
    """Defaults of the contract for sources that have nothing to say there."""

    behind = False

    def header(self) -> HeaderPart:
        return HeaderPart()

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass

    def warnings(self) -> list[str]:
        return []


class RingSource(_Quiet):
    """The kernel hooks' ring buffer. Records are submitted without wake-ups (except urgent
    ones), so a poll waits up to POLL_MS for one and then takes whatever is pending, up to a
    batch; a full batch means the ring holds more (``behind``)."""

    def __init__(
        self,
        kernel: hooks.KernelHooks,
        attached: hooks.Attached,
        enriching: tuple[str, ...],
        wait_ms: int = POLL_MS,
        idle_wait_ms: int | None = None,
    ) -> None:
        """``idle_wait_ms``: the wait once IDLE_POLLS polls in a row found nothing (the agent
        on a quiet host wakes twice a second instead of ten times; a record that wakes the
        ring, an OOM kill, still ends the wait at once, and any record brings ``wait_ms``
        back)."""
        self.kernel = kernel
        self.attached = attached
        self.enriching = enriching
        self.decoder = Decoder(page_size=os.sysconf("SC_PAGE_SIZE"))
        self.rb: RingBuffer | None = RingBuffer(kernel.events)
        self.behind = False
        self._wait_ms = wait_ms
        self._idle_wait_ms = idle_wait_ms or wait_ms
        self._empty_polls = 0

    def poll(self, now_ns: int, behind: bool) -> list[Event]:
        assert self.rb is not None
        if behind:
            wait = 0
        elif self._empty_polls >= IDLE_POLLS:
            wait = self._idle_wait_ms
        else:
            wait = self._wait_ms
        events = self.decoder.decode_batch(self.rb.drain(wait))
        self._empty_polls = 0 if events else self._empty_polls + 1
        self.behind = self.rb.full
        return events

    def header(self) -> HeaderPart:
        return HeaderPart(
            hooks=dict(self.attached.rungs),
            extra={
                "hook_failures": self.attached.failures,
                "page_size": self.decoder.page_size,
                "libbpf": libbpf.version(),
            },
        )

    def stop(self) -> None:
        self._wait_ms = 0  # draining: take what is there, wait for nothing more

    def close(self) -> None:
        if self.rb is not None:
            self.rb.free()
            self.rb = None

    def warnings(self) -> list[str]:
        out = [
            f"hook {hook} did not attach: " + "; ".join(self.attached.failures.get(hook, []))
            for hook, rung in self.attached.rungs.items()
            if rung is None and hook not in self.enriching
        ]
        d = self.decoder
        if d.unknown or d.malformed:
            out.append(
                f"{d.unknown} records of unknown type and {d.malformed} short records were skipped"
            )
        return out


class KernelCounters(_Quiet):
    """Reclaim summaries (every RECLAIM_DRAIN_NS, and at the end) and lost records."""

    def __init__(self, kernel: hooks.KernelHooks, clock: Callable[[], int] = boottime_ns) -> None:
        self.kernel = kernel
        self.lost = 0  # what the kernel could not hand over so far (the footer's count)
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._kswapd_seen = 0
        self._last_drain_ns = clock()
        self._next_ns = self._last_drain_ns + RECLAIM_DRAIN_NS
        self._final = False
        self._full = 0

    def poll(self, now_ns: int, behind: bool) -> list[Event]:
        if behind:
            return []
        out: list[Event] = []
        if now_ns >= self._next_ns or self._final:
            out += self._reclaim_summaries(now_ns)
            self._next_ns = now_ns + RECLAIM_DRAIN_NS
        lost = self.kernel.lost_count()
        if lost > self.lost:
            out.append(Lost(ts=now_ns, count=lost - self.lost))
            self.lost = lost
        return out

    def stop(self) -> None:
        self._final = True  # the last aggregates, whenever the last poll comes

    def signals_unsent(self) -> dict[str, int]:
        """Signal name -> signals to watched processes the kernel counted and did not send
        (handled or ignored, so they could neither end a process nor explain its end)."""
        return self.kernel.signals_unsent()

    def _reclaim_summaries(self, now_ns: int) -> list[Event]:
        interval = now_ns - self._last_drain_ns
        self._last_drain_ns = now_ns
        out: list[Event] = []
        for cgroup_id, kind, st in sorted(self.kernel.drain_reclaim(), key=lambda x: (x[0], x[1])):
            out.append(
                ReclaimSummary(
                    ts=now_ns,
                    cgroup_id=cgroup_id,
                    kind=layout.STALL_KINDS.get(kind, str(kind)),
                    count=st.count,
                    total_ns=st.total_ns,
                    max_ns=st.max_ns,
                    reclaimed_bytes=st.reclaimed_pages * self._page_size,
                    interval_ns=interval,
                )
            )
        wakeups = self.kernel.kswapd_wakeups()
        if wakeups > self._kswapd_seen:
            out.append(
                ReclaimSummary(
                    ts=now_ns,
                    cgroup_id=0,
                    kind="kswapd",
                    count=wakeups - self._kswapd_seen,
                    total_ns=0,
                    max_ns=0,
                    reclaimed_bytes=0,
                    interval_ns=interval,
                )
            )
            self._kswapd_seen = wakeups
        if not self._full:
            self._full = self.kernel.reclaim_table_full()
        return out

    def warnings(self) -> list[str]:
        out = []
        if self._full:
            out.append(
                f"reclaim aggregation table full: {self._full} stalls were not counted in summaries"
            )
        refused = self.kernel.watched_cgroups_refused()
        if refused:
            out.append(
                f"watched cgroup table full: {refused} cgroups of followed containers were not "
                "watched (their processes' exits are missing)"
            )
        return out


class KmsgSource(_Quiet):
    """/dev/kmsg: OOM reports that ``wants`` (the watched set) and GPU Xid lines. Without the
    kernel log the recording goes on (OOM kills still come from the kernel hooks)."""

    def __init__(
        self, wants: Callable[[KmsgOom], bool], open_reader: Callable[[], KmsgReader] = KmsgReader
    ) -> None:
        self.wants = wants
        self.reader: KmsgReader | None = None
        self._warnings: list[str] = []
        try:
            self.reader = open_reader()
        except Exception as exc:
            self._warnings.append(f"kernel log unavailable ({exc}): OOM reports come from BPF only")
        self.assembler = OomAssembler()
        self.monotonic_offset = monotonic_offset_ns()

    def poll(self, now_ns: int, behind: bool) -> list[Event]:
        if behind or self.reader is None:
            return []
        out: list[Event] = []
        for rec in self.reader.read_available():
            ts = record_ts_ns(rec, self.monotonic_offset)
            out.extend(k for k in self.assembler.feed(rec, ts) if self.wants(k))
            gpu = xid.event_from_kmsg(rec, ts)
            if gpu is not None:
                out.append(gpu)
        return out

    def header(self) -> HeaderPart:
        # the fallback rung of the oom hook: it fills the hook only when BPF attached nothing
        return HeaderPart(hooks={"oom": "kmsg"} if self.reader is not None else {})

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()

    def warnings(self) -> list[str]:
        return list(self._warnings)


class GpuSource(_Quiet):
    """The GPU side as a source, and as the enricher that tells it which pids to watch."""

    def __init__(self, gpu: GpuSide) -> None:
        self.gpu = gpu
        self._final = False

    def poll(self, now_ns: int, behind: bool) -> list[Event]:
        if behind:
            # a held process waits for us, however far behind the ring is: resume it now and
            # hand its events over with the next poll
            self.gpu.resume_held(now_ns)
            return []
        return self.gpu.poll(now_ns, final=self._final)

    def enrich(self, events: list[Event]) -> list[Event]:
        self.gpu.track(events)
        return events

    def header(self) -> HeaderPart:
        return HeaderPart(hooks={"gpu_alloc": self.gpu.rung}, extra={"gpu": self.gpu.describe()})

    def stop(self) -> None:
        self._final = True  # no more scanning of new processes

    def close(self) -> None:
        self.gpu.close()

    def warnings(self) -> list[str]:
        return list(self.gpu.warnings)


class FollowerSource(_Quiet):
    """Restart counts and probe results of ``--container`` / ``--probe``."""

    def __init__(self, follower: Follower) -> None:
        self.follower = follower

    def poll(self, now_ns: int, behind: bool) -> list[Event]:
        return [] if behind else self.follower.poll()

    def stop(self) -> None:
        self.follower.close()  # the threads end; what they found still comes out of poll

    def close(self) -> None:
        self.follower.close()


class SamplerSource(_Quiet):
    """The samplers that are due (their timestamps are "now": held back while behind)."""

    def __init__(self, samplers: SamplerSet, memory_version: int | None) -> None:
        self.samplers = samplers
        self.memory_version = memory_version

    def poll(self, now_ns: int, behind: bool) -> list[Event]:
        return [] if behind else self.samplers.due(now_ns)

    def header(self) -> HeaderPart:
        # cgroup v2 without a memory.high hook: memory.events "high" deltas + memory.pressure
        return HeaderPart(hooks={"memory_high": "cgroupfs"} if self.memory_version == 2 else {})

    def close(self) -> None:
        self.samplers.close()


class ProbeResultsSource(_Quiet):
    """Health-probe results that another thread produces (repro's liveness prober), as
    ``ProbeSample`` events: a run's trace holds every probe that judged it. The producer starts
    at the first poll (``on_start``: the recording has begun and its command is started) and
    ends at ``stop`` (``on_stop``), so that its last results make it into the trace."""

    def __init__(
        self,
        target: str,
        on_start: Callable[[], None] = lambda: None,
        on_stop: Callable[[], None] = lambda: None,
    ) -> None:
        self.target = target
        self.on_start: Callable[[], None] | None = on_start
        self.on_stop = on_stop
        self._lock = threading.Lock()
        self._pending: list[ProbeResult] = []

    def put(self, result: ProbeResult) -> None:
        with self._lock:
            self._pending.append(result)

    def poll(self, now_ns: int, behind: bool) -> list[Event]:
        if self.on_start is not None:
            start, self.on_start = self.on_start, None
            start()
        if behind:
            return []
        with self._lock:
            pending, self._pending = self._pending, []
        return [r.sample(self.target) for r in pending]

    def stop(self) -> None:
        self.on_start = None  # (a run that ended before its first poll probes nothing)
        self.on_stop()
