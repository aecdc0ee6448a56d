"""Time-ordered merge of the event sources: a small reorder window, pure.

Ring-buffer records from different CPUs, kernel-log records and cgroup names reach user space
slightly out of order (each CPU reserves and commits on its own; /dev/kmsg is read on its own
schedule). The trace promises time order, so events wait in a heap until nothing older can
still arrive: everything more than ``window_ns`` older than the newest timestamp seen is
released.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from tracer.events import Event

# 50 ms: five 10 ms drain periods, far longer than the commit skew between CPUs.
DEFAULT_WINDOW_NS = 50_000_000


class Reorder:
    def __init__(self, window_ns: int = DEFAULT_WINDOW_NS) -> None:
        self.window_ns = window_ns
        self._heap: list[tuple[int, int, Event]] = []
        self._seq = itertools.count()  # ties keep arrival order
        self._newest = 0
        self._released = 0  # timestamp of the last released event
        self.late = 0  # events that arrived after newer ones were released

    def push(self, events: Iterable[Event]) -> None:
        for ev in events:
            if ev.ts < self._released:
                self.late += 1
            heapq.heappush(self._heap, (ev.ts, next(self._seq), ev))
            if ev.ts > self._newest:
                self._newest = ev.ts

    def pop_ready(self, now_ns: int | None = None) -> list[Event]:
        """Events older than the window, in time order. ``now_ns`` (the current time on the
        same clock) lets events out even when no newer event arrives."""
        horizon = max(self._newest, now_ns or 0) - self.window_ns
        out = []
        while self._heap and self._heap[0][0] <= horizon:
            ts, _, ev = heapq.heappop(self._heap)
            self._released = ts
            out.append(ev)
        return out

    def flush(self) -> list[Event]:
        out = [ev for _, _, ev in sorted(self._heap)]
        self._heap.clear()
        if out:
            self._released = out[-1].ts
        return out

    def __len__(self) -> int:
        return len(self._heap)
