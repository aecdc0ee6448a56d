"""Reclaim thrash of page cache: a cgroup whose limit leaves no room for the files it reads
keeps re-reading them from disk. Pure.

The case it exists for: a model server maps its weights (llama.cpp's default ``--mmap``) and
its cgroup's limit is below the weights plus its own memory. The kernel charges the mapped
pages to the cgroup, reclaims them at the limit and reads them back on the next token, so the
server lives on, every request re-reads the model, and nothing dies: no OOM, `/health` fast
(measured here: a 272 MiB model under 200 MiB re-read at 150-730 MiB/s, a 24-token completion
taking 4-19 s instead of 0.4 s, ``pgmajfault`` barely moving because readahead brings the pages
in). What shows it is the kernel's ``workingset_refault_file`` in memory.stat: pages read back
that were evicted recently enough for their shadow entry to be remembered, i.e. pages the
cgroup needed again soon after it lost them.

``detect(samples)`` says a window of samples is thrash when, over at least ``MIN_SPAN_NS``,
file pages were refaulted at ``MIN_RATE`` or more, the bytes refaulted are at least the file
cache the cgroup holds now (it re-read the whole of what it can keep, which a working set that
fits never does: its refaults are a trickle against its cache), and the cgroup sits at its
limit (``NEAR_LIMIT`` of it): the limit is what evicts. An ancestor without a limit of its own
counts its children's refaults too, and is not the cgroup to blame. ``Thrashing`` keeps the
current state per watched cgroup as the Analyzer is fed, so ``tail``, the agent and ``replay``
say the same; the probe-kill rule reads the same ``detect`` over the minute before a kill.

The counter is in pages; this assumes 4 KiB pages (x86_64, and arm64's default kernels): on a
64 KiB-page kernel the rate is under-reported sixteen-fold, which can miss thrash, never invent
it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tracer.events import CgroupSample, EffectiveLimit

NS = 1_000_000_000
MiB = 1024 * 1024
PAGE_SIZE = 4096
WINDOW_NS = 5 * NS  # the rate is taken over this much of the newest samples
MIN_SPAN_NS = 2 * NS  # ... spanning at least this much
MIN_RATE = 16 * MiB  # bytes per second re-read
NEAR_LIMIT = 0.9  # of the effective limit: reclaim by the cgroup's own limit
EVERY_NS = NS // 2  # a watched cgroup's state is worked out at most this often
MAX_WATCHED = 4096
REFAULTS = "workingset_refault_file"

# (cgroup id, start, end) -> that cgroup's kept samples in [start, end], in time order
SamplesOf = Callable[[int, int, int], Sequence[CgroupSample]]


@dataclass(frozen=True, slots=True)
class Thrash:
    """A cgroup re-reading its file pages from disk."""

    ts: int  # the newest sample's time
    since: int  # the oldest sample of the window
    path: str
    rate: float  # bytes of file pages refaulted per second
    cache: int  # the file pages (page cache, not tmpfs) it holds now, bytes
    mapped: int  # of them mapped into processes (a model's weights under --mmap), bytes
    usage: int | None
    limit: int | None

    @property
    def refaulted(self) -> float:
        """Bytes re-read over the window."""
        return self.rate * (self.ts - self.since) / NS

    def to_json(self) -> dict[str, object]:
        return {
            "ts": self.ts,
            "since": self.since,
            "path": self.path,
            "refault_bytes_per_s": round(self.rate),
            "cache_bytes": self.cache,
            "mapped_bytes": self.mapped,
            "usage_bytes": self.usage,
            "limit_bytes": self.limit,
        }


def detect(samples: Sequence[CgroupSample], limit: int | None = None) -> Thrash | None:
    """Thrash over these samples of one cgroup (time order), taken over their newest
    ``WINDOW_NS``; None when they do not show it (module docstring). ``limit``: the effective
    limit over the cgroup, when known (else its own, from the samples)."""
    with_counter = [s for s in samples if REFAULTS in s.stat]
    if len(with_counter) < 2:
        return None
    last = with_counter[-1]
    first = next(s for s in with_counter if s.ts >= last.ts - WINDOW_NS)
    span = last.ts - first.ts
    if span < MIN_SPAN_NS:
        return None
    pages = last.stat[REFAULTS] - first.stat[REFAULTS]
    if pages <= 0:  # (a counter that went back: another cgroup at the same path)
        return None
    refaulted = pages * PAGE_SIZE
    rate = refaulted * NS / span
    st = last.stat
    cache = max(0, st.get("file", 0) - st.get("shmem", 0))
    if rate < MIN_RATE or refaulted < cache:
        return None
    limit = limit if limit is not None else last.limit_bytes
    if not limit or last.usage_bytes is None or last.usage_bytes < NEAR_LIMIT * limit:
        return None
    return Thrash(
        ts=last.ts,
        since=first.ts,
        path=last.path,
        rate=rate,
        cache=cache,
        mapped=min(st.get("file_mapped", 0), cache),
        usage=last.usage_bytes,
        limit=limit,
    )


class Thrashing:
    """The current ``Thrash`` of each watched cgroup (one the recorder sent an
    ``EffectiveLimit`` for), updated at its samples from the Analyzer's store."""

    def __init__(self, samples_of: SamplesOf) -> None:
        self.samples_of = samples_of
        self._watched: dict[int, int | None] = {}  # cgroup id -> its effective limit
        self._current: dict[int, Thrash] = {}
        self._looked: dict[int, int] = {}  # cgroup id -> when it was last worked out

    def current(self, cgroup_id: int) -> Thrash | None:
        return self._current.get(cgroup_id)

    def limit(self, ev: EffectiveLimit) -> None:
        self._watched[ev.cgroup_id] = ev.limit_bytes
        if len(self._watched) > MAX_WATCHED:
            self.forget([next(iter(self._watched))])

    def forget(self, cgroup_ids: Sequence[int]) -> None:
        for cid in cgroup_ids:
            self._watched.pop(cid, None)
            self._current.pop(cid, None)
            self._looked.pop(cid, None)

    def sample(self, ev: CgroupSample) -> None:
        """Take a sample (already in the store) of a cgroup."""
        if ev.cgroup_id not in self._watched or REFAULTS not in ev.stat:
            return
        when = self._looked.get(ev.cgroup_id)
        if when is not None and when <= ev.ts < when + EVERY_NS:
            return
        self._looked[ev.cgroup_id] = ev.ts
        samples = self.samples_of(ev.cgroup_id, ev.ts - WINDOW_NS, ev.ts)
        found = detect(samples, self._watched[ev.cgroup_id])
        if found is None:
            self._current.pop(ev.cgroup_id, None)
        else:
            self._current[ev.cgroup_id] = found
