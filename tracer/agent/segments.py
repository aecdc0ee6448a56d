"""The agent's ring of recent trace segments (a `tracer.pipeline.core.Sink`).

Every segment is a whole trace on its own (header, events, footer), so any one replays without
the others, and an incident is cut from them (tracer/agent/incidents.py). A segment begins with
the naming records (``CgroupInfo``, ``UnitInfo``) of every cgroup the agent has named and still
holds: the recorder writes one once per cgroup, and a segment that lacked it would show bare ids.

A new segment starts every ``segment_s`` seconds. Segments older than ``retain_s`` go, and the
state directory's budget is enforced after each rotation (tracer/agent/state.py).

A full disk never stops the agent: a failed write leaves the segment cut at its last whole
record (the writer rolls back), the events of that batch and of every batch until a new segment
can be opened are counted in ``unwritten``, and a new segment is tried every ``retry_s``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import msgspec

from tracer.agent.state import Evicted, StateDir
from tracer.errors import OutputError
from tracer.events import CgroupInfo, Event, UnitInfo
from tracer.trace.format import ZSTD_SUFFIX, TraceFooter, TraceHeader
from tracer.trace.writer import TraceWriter

DEFAULT_SEGMENT_S = 60.0
DEFAULT_RETAIN_S = 30 * 60.0
RETRY_S = 5.0
FLUSH_S = 1.0  # what a SIGKILLed agent can lose
MAX_NAMES = 8192  # naming records carried from segment to segment (the most recent)


def zstd_available() -> bool:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


def segment_name(boot: str, first_ts: int, suffix: str) -> str:
    """``seg-<boot id prefix>-<first ts, zero-padded>``: sorts in time order within a boot."""
    return f"seg-{boot[:8]}-{first_ts:020d}.trace{suffix}"


def parse_segment_name(name: str) -> tuple[str, int] | None:
    """(boot id prefix, first ts) of a segment file name, or None for anything else."""
    if not name.startswith("seg-"):
        return None
    parts = name.split(".", 1)[0].split("-")
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


class SegmentSink:
    def __init__(
        self,
        state: StateDir,
        header: Callable[[], TraceHeader | None],
        boot: str,
        *,
        segment_s: float = DEFAULT_SEGMENT_S,
        retain_s: float = DEFAULT_RETAIN_S,
        max_bytes: int,
        on_evict: Callable[[list[Evicted]], None] = lambda _e: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self._header = header
        self.boot = boot
        self.segment_s = segment_s
        self.retain_s = retain_s
        self.max_bytes = max_bytes
        self.on_evict = on_evict
        self.clock = clock
        self.suffix = ZSTD_SUFFIX if zstd_available() else ""
        self.writer: TraceWriter | None = None
        self.names: OrderedDict[tuple[str, int], Event] = OrderedDict()
        self.unwritten = 0  # events that could not be written (disk full, I/O error)
        self.last_error: str | None = None
        self._rotate_at = 0.0
        self._retry_at = 0.0
        self._flush_at = 0.0
        self._last_ts = 0
        self._handed = 0  # events handed to the current writer (on disk or buffered)

    # -- the Sink contract ------------------------------------------------------------------

    def write(self, events: Sequence[Event]) -> None:
        now = self.clock()
        for ev in events:
            if type(ev) is CgroupInfo or type(ev) is UnitInfo:
                key = (ev.KIND, ev.cgroup_id)
                self.names[key] = ev
                self.names.move_to_end(key)
                if len(self.names) > MAX_NAMES:
                    self.names.popitem(last=False)
        if events:
            self._last_ts = events[-1].ts
        if self.writer is not None and (
            now >= self._rotate_at or self.writer.bytes_written >= self.max_bytes // 8
        ):
            # (by size too: under a flood one segment must not eat the whole budget)
            self._finish_segment("rotated")
        if self.writer is None and events and now >= self._retry_at:
            self._start_segment(events[0].ts, now)
        if self.writer is None:
            self.unwritten += len(events)
            return
        try:
            if events:
                self._handed += len(events)
                self.writer.write_many(events)
            if now >= self._flush_at:
                self.writer.flush()
                self._flush_at = now + FLUSH_S
        except OutputError as exc:
            self._failed(exc, 0, now)

    def close(self, footer: TraceFooter, complete: bool) -> None:
        if self.writer is not None:
            self._finish_segment(footer.exit, footer)

    # -- segments ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Everything handed over so far on disk (before an incident is cut)."""
        if self.writer is not None:
            try:
                self.writer.flush()
            except OutputError as exc:
                self._failed(exc, 0, self.clock())

    @property
    def current(self) -> str | None:
        return self.writer.path if self.writer is not None else None

    def _start_segment(self, first_ts: int, now: float) -> None:
        header = self._header()
        if header is None:
            return
        header = dataclasses.replace(header, extra={**header.extra, "agent_segment": True})
        path = os.path.join(self.state.segments, segment_name(self.boot, first_ts, self.suffix))
        self._housekeeping(path)
        try:
            writer = TraceWriter.open(path, header, overwrite=True)
        except OutputError as exc:
            self.last_error = exc.message
            self._retry_at = now + RETRY_S
            return
        self.writer = writer
        self._handed = 0
        self._rotate_at = now + self.segment_s
        self._flush_at = now + FLUSH_S
        if self.names:
            # stamped at the segment's start: the file stays in time order
            names = [msgspec.structs.replace(ev, ts=first_ts) for ev in self.names.values()]
            self._handed += len(names)
            try:
                writer.write_many(names)
            except OutputError as exc:
                self._failed(exc, 0, now)

    def _finish_segment(self, why: str, footer: TraceFooter | None = None) -> None:
        writer, self.writer = self.writer, None
        if writer is None:
            return
        # this segment's own counts; the run's exit and warnings when the run ends
        footer = writer.make_footer(
            why,
            ended_ns=footer.ended_ns if footer else self._last_ts,
            warnings=footer.warnings if footer else (),
        )
        try:
            writer.close(footer)
        except OutputError as exc:
            self.last_error = exc.message
            with contextlib.suppress(Exception):
                writer.abort()
        self._housekeeping(None)

    def _failed(self, exc: OutputError, pending: int, now: float) -> None:
        """A write failed: the file is cut back to its last whole record by the writer, and
        what it still buffered is gone with it (``pending``: events not handed to it)."""
        self.last_error = exc.message
        self.unwritten += pending
        writer, self.writer = self.writer, None
        if writer is not None:
            self.unwritten += max(0, self._handed - writer.events_written)
            with contextlib.suppress(Exception):
                writer.abort()
        self._retry_at = now + RETRY_S
        self._housekeeping(None)

    def _housekeeping(self, keep: str | None) -> None:
        evicted = self.state.expire_segments(time.time() - self.retain_s, keep=keep)
        evicted += self.state.enforce(self.max_bytes, keep=keep)
        if evicted:
            self.on_evict(evicted)
