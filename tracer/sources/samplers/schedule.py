"""The samplers of one recording on their schedules: `SamplerSet` (which cgroups, processes
and the host are due, at the normal, fast or quiet interval, and the effective limits)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass

from tracer.errors import UsageError
from tracer.events import EffectiveLimit, Event, SampleError
from tracer.parse import cgpath
from tracer.sources.cgroupfs import CgroupLayout, CgroupResolver
from tracer.sources.samplers.cgroup import NEAR_LIMIT_PERCENT, CgroupSampler
from tracer.sources.samplers.files import ProblemLog, SourceStats
from tracer.sources.samplers.host import HostSampler
from tracer.sources.samplers.process import ProcessSampler

DEFAULT_INTERVAL_NS = 100_000_000  # 100 ms
DEFAULT_FAST_INTERVAL_NS = 20_000_000  # 20 ms, near a limit: an OOM builds up in well under 1 s
# Sampled cgroups (watched ones and their ancestors, counted once). At ~50 µs a cgroup, 256 of
# them cost ~13% of a core at 10 Hz, and more than half a core if all were near a limit (50 Hz).
MAX_CGROUPS = 256


@dataclass(slots=True)
class _Watch:
    """A watched cgroup: its id, its ancestors (itself first), its schedule, and the effective
    limit last emitted for it."""

    cgroup_id: int
    paths: list[str]
    next_ns: int | None = None
    effective: tuple[int | None, str | None] | None = None
    fast: bool = False


@dataclass(slots=True)
class _Sampled:
    cgroup_id: int
    sampler: CgroupSampler


@dataclass(slots=True)
class _Proc:
    sampler: ProcessSampler
    next_ns: int | None = None


@dataclass(slots=True)
class _Pending:
    source: str
    target: str
    message: str


def _next_due(prev: int | None, now_ns: int, interval_ns: int) -> int:
    """The next sampling time: on the previous cadence, skipping ticks that were missed."""
    if prev is None:
        return now_ns + interval_ns
    nxt = prev + interval_ns
    return nxt if nxt > now_ns else now_ns + interval_ns


class SamplerSet:
    """The memory samplers of one recording, on their schedules.

    ``watch_cgroup(path)`` samples that cgroup and each ancestor up to the root (each sampled
    cgroup once, however many watched cgroups share it; at most ``max_cgroups`` of them).
    ``watch_pid(pid)`` adds a process; the host is sampled unless ``host=False``.

    ``due(now_ns)`` samples what is due and returns the events, in this order: problems noted
    since the last call (the cap), the host, the cgroups sorted by path (so ancestors come
    before their descendants), one ``EffectiveLimit`` per watched cgroup whose effective limit
    is new or changed (in watch order), then the processes by pid. A watched cgroup and its
    ancestors are due every ``interval_ns``, or every ``fast_interval_ns`` while any of them
    uses at least ``NEAR_LIMIT_PERCENT`` % of its own limit (that includes a watched cgroup
    within 10% of its effective limit, since usage counts the subtree); the host and the
    processes every ``interval_ns``. The first call samples everything.

    With ``quiet_interval_ns`` (the always-on agent's: a node runs a hundred idle containers,
    and sampling each in full once a second cost 1% of a core), a due cgroup that is not near a
    limit and whose usage has not moved (``CgroupSampler.unchanged``) is sampled in full only
    once that interval has passed since its last full sample; what it said still stands.

    A removed cgroup or an exited process gives one ``SampleError`` and is dropped (a removed
    cgroup takes the watched cgroups below it along). Watching it again starts afresh.
    """

    def __init__(
        self,
        layout: CgroupLayout,
        resolver: CgroupResolver,
        proc_root: str = "/proc",
        interval_ns: int = DEFAULT_INTERVAL_NS,
        fast_interval_ns: int = DEFAULT_FAST_INTERVAL_NS,
        *,
        host: bool = True,
        max_cgroups: int = MAX_CGROUPS,
        quiet_interval_ns: int | None = None,
    ) -> None:
        if interval_ns <= 0 or fast_interval_ns <= 0:
            raise UsageError(
                f"sampling intervals must be positive (got {interval_ns} and {fast_interval_ns} ns)"
            )
        self.layout = layout
        self.resolver = resolver
        self.proc_root = proc_root
        self.interval_ns = interval_ns
        self.fast_interval_ns = fast_interval_ns
        self.max_cgroups = max_cgroups
        self.quiet_interval_ns = quiet_interval_ns
        self._problems = ProblemLog()
        self._host = HostSampler(proc_root, problems=self._problems) if host else None
        self._host_next: int | None = None
        self._watched: dict[str, _Watch] = {}
        self._sampled: dict[str, _Sampled] = {}
        self._procs: dict[int, _Proc] = {}
        self._pending: list[_Pending] = []
        self._capped = False
        self._stats = {k: SourceStats() for k in ("cgroup", "host", "process")}

    # -- what is watched -----------------------------------------------------------------------

    @property
    def watched_cgroups(self) -> list[str]:
        return list(self._watched)

    @property
    def sampled_cgroups(self) -> list[str]:
        return sorted(self._sampled)

    @property
    def fast_cgroups(self) -> list[str]:
        """The watched cgroups now sampled every ``fast_interval_ns`` (near a limit)."""
        return [rel for rel, w in self._watched.items() if w.fast]

    @property
    def watched_pids(self) -> list[int]:
        return sorted(self._procs)

    @property
    def stats(self) -> dict[str, SourceStats]:
        """Per source ("cgroup", "host", "process"): calls, errors and time spent (copies)."""
        return {k: dataclasses.replace(v) for k, v in self._stats.items()}

    def watch_cgroup(self, path: str) -> bool:
        """Sample ``path`` (relative to the memory hierarchy, or under its mount point) and its
        ancestors. False when that would pass ``max_cgroups`` (reported once, at the next
        ``due``); True when watched (or already watched).

        Raises:
            UsageError: no memory hierarchy, or no such cgroup.
        """
        rel = cgpath.relative(path, self.layout.memory_root)
        if rel in self._watched:
            return True
        paths = cgpath.ancestors(rel)
        new = [p for p in paths if p not in self._sampled]
        if len(self._sampled) + len(new) > self.max_cgroups:
            if not self._capped:
                self._capped = True
                self._pending.append(
                    _Pending(
                        "cgroup",
                        rel,
                        f"not sampled: more than {self.max_cgroups} cgroups to sample "
                        "(this and later refusals are reported only once)",
                    )
                )
            return False
        ids = {p: self.resolver.id_of(p) for p in new}  # raises before anything changes
        own_id = ids[rel] if rel in ids else self._sampled[rel].cgroup_id
        for p in new:
            self._problems.forget("cgroup", p)
            self._sampled[p] = _Sampled(
                ids[p], CgroupSampler(self.layout, p, problems=self._problems)
            )
        self._watched[rel] = _Watch(own_id, paths)
        return True

    def sample_soon(self, cgroup_id: int) -> None:
        """Make the watched cgroups sampled with this one due at the next ``due``: an OOM kill
        there moved its counters (the OOM count the verdict quotes, usage freed), and the
        verdict waits for a sample after the kill rather than the next tick, a second away."""
        paths = {p for p, s in self._sampled.items() if s.cgroup_id == cgroup_id}
        if not paths:
            return
        for w in self._watched.values():
            if not paths.isdisjoint(w.paths):
                w.next_ns = None

    def unwatch_cgroup(self, path: str) -> None:
        """Stop sampling ``path`` (and ancestors no other watched cgroup needs)."""
        self._watched.pop(cgpath.relative(path, self.layout.memory_root), None)
        self._drop_unneeded()

    def watch_pid(self, pid: int) -> None:
        """Sample process ``pid``. One that does not exist gives one error at the next ``due``."""
        if pid in self._procs:
            return
        self._problems.forget("process", str(pid))
        self._procs[pid] = _Proc(ProcessSampler(pid, self.proc_root, problems=self._problems))

    def unwatch_pid(self, pid: int) -> None:
        proc = self._procs.pop(pid, None)
        if proc is not None:
            proc.sampler.close()

    def _drop_unneeded(self) -> None:
        needed = {p for w in self._watched.values() for p in w.paths}
        for p in [p for p in self._sampled if p not in needed]:
            self._sampled.pop(p).sampler.close()

    def close(self) -> None:
        """Close every kept-open file; the set samples nothing afterwards."""
        if self._host is not None:
            self._host.close()
            self._host = None
        self._watched.clear()
        self._drop_unneeded()
        for pid in list(self._procs):
            self.unwatch_pid(pid)

    def __enter__(self) -> SamplerSet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- sampling ------------------------------------------------------------------------------

    def _timed(self, source: str, events: Iterable[Event], started_ns: int) -> list[Event]:
        out = list(events)
        stats = self._stats[source]
        stats.calls += 1
        stats.total_ns += time.perf_counter_ns() - started_ns
        stats.errors += sum(1 for e in out if isinstance(e, SampleError))
        return out

    def _effective(self, watch: _Watch) -> tuple[int | None, str | None]:
        """The limit that applies and who sets it, from the latest samples."""
        return cgpath.effective_limit(
            (p, last.limit_bytes if (last := self._sampled[p].sampler.last) is not None else None)
            for p in watch.paths
        )

    def _quiet(self, sampler: CgroupSampler, now_ns: int) -> bool:
        """Skip this full sample: the quiet interval is on, the last full one is younger than
        it, and nothing moved (``CgroupSampler.unchanged``)."""
        q = self.quiet_interval_ns
        last = sampler.last
        return bool(q and last is not None and now_ns - last.ts < q and sampler.unchanged())

    def _near_limit(self, watch: _Watch) -> bool:
        for p in watch.paths:
            last = self._sampled[p].sampler.last
            if last is None or last.usage_bytes is None or last.limit_bytes is None:
                continue
            if last.usage_bytes * 100 >= last.limit_bytes * NEAR_LIMIT_PERCENT:
                return True
        return False

    def due(self, now_ns: int) -> list[Event]:
        """Sample what is due at ``now_ns`` (CLOCK_BOOTTIME ns) and return the events."""
        out: list[Event] = []
        for pending in self._pending:
            err = self._problems.once(now_ns, pending.source, pending.target, pending.message)
            if err is not None:
                out.append(err)
        self._pending.clear()

        host = self._host
        if host is not None and (self._host_next is None or now_ns >= self._host_next):
            started = time.perf_counter_ns()
            out += self._timed("host", host.sample(now_ns), started)
            self._host_next = _next_due(self._host_next, now_ns, self.interval_ns)

        due = [w for w in self._watched.values() if w.next_ns is None or now_ns >= w.next_ns]
        if due:
            gone: set[str] = set()
            # (a first sample, or one asked for by sample_soon, is always a full one)
            forced = {p for w in due if w.next_ns is None or w.fast for p in w.paths}
            for p in sorted({p for w in due for p in w.paths}):
                entry = self._sampled[p]
                if p not in forced and self._quiet(entry.sampler, now_ns):
                    continue
                started = time.perf_counter_ns()
                out += self._timed("cgroup", entry.sampler.sample(now_ns, entry.cgroup_id), started)
                if entry.sampler.gone:
                    gone.add(p)
            for rel, w in list(self._watched.items()):
                if any(p in gone for p in w.paths):
                    del self._watched[rel]
                    continue
                if w.next_ns is not None and now_ns < w.next_ns:
                    continue  # not due this time
                effective = self._effective(w)
                if effective != w.effective:
                    w.effective = effective
                    out.append(
                        EffectiveLimit(
                            ts=now_ns,
                            cgroup_id=w.cgroup_id,
                            path=rel,
                            limit_bytes=effective[0],
                            set_by=effective[1],
                        )
                    )
                w.fast = self._near_limit(w)
                interval = self.fast_interval_ns if w.fast else self.interval_ns
                w.next_ns = _next_due(w.next_ns, now_ns, interval)
            if gone:
                self._drop_unneeded()

        for pid in sorted(self._procs):
            proc = self._procs[pid]
            if proc.next_ns is not None and now_ns < proc.next_ns:
                continue
            started = time.perf_counter_ns()
            out += self._timed("process", proc.sampler.sample(now_ns), started)
            if proc.sampler.gone:
                self.unwatch_pid(pid)
            else:
                proc.next_ns = _next_due(proc.next_ns, now_ns, self.interval_ns)
        return out
