"""Incidents: for every notable verdict, its evidence window kept as a replayable trace.

When a verdict other than a clean exit is reached, an incident id is given at once (the journal
names it) and the window [exit - before, exit + after] is cut from the segments once the stream
has passed its end (or when the agent stops). A verdict whose exit falls inside a window still
open joins that incident and stretches its end (up to ``MAX_WINDOW_S`` in all): a crash loop or a
burst of failing scripts is one incident holding every verdict, not one copy per exit.

The cut copies the window's events and, stamped at its start, the naming records (cgroup paths,
units) the segments hold, under the segment's header with an ``incident`` entry:
``whyrestart replay/explain/report ID`` judge it with the same analyzer as any trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from tracer.agent.segments import SegmentSink, parse_segment_name
from tracer.agent.state import PARTIAL
from tracer.analysis.findings import APP_EXIT, Verdict
from tracer.clock import wall_time
from tracer.errors import OutputError, TraceFileError
from tracer.events import CgroupInfo, Event, UnitInfo
from tracer.trace.format import TraceFooter, TraceHeader
from tracer.trace.reader import TraceReader
from tracer.trace.writer import TraceWriter

DEFAULT_BEFORE_S = 120.0
DEFAULT_AFTER_S = 30.0
MAX_WINDOW_S = 600.0
# Text decoded at once while cutting: the default 1 MiB block is fastest for a replay, but made
# an always-on agent's RSS 11 MB higher for the minute after an incident cut from a storm.
CUT_READ_BLOCK = 128 * 1024


def notable(v: Verdict, in_unit: bool = True) -> bool:
    """Worth a journal entry and an incident: every kill (OOM, GPU, probe, signal, device,
    unknown), and a unit's main process ending on its own with a failure (a restart's cause).
    Not: clean exits, and the failures of helper processes (a health-check script's grep that
    found nothing, a compiler's error), which a host runs by the thousand; those are counted in
    whyrestart_exits_total only. ``in_unit``: the process belongs to a container or service
    (not the host's own processes)."""
    if v.cause != APP_EXIT:
        return True
    return in_unit and v.main and (v.exit_code != 0 or v.signal is not None)


def incident_id(v: Verdict, clock_offset_ns: int) -> str:
    """``<UTC time of the exit>-<pid>``: sorts in time order, says what it is about."""
    return f"{wall_time(v.ts, clock_offset_ns).strftime('%Y%m%dT%H%M%SZ')}-{v.pid}"


@dataclass(slots=True)
class Pending:
    id: str
    verdicts: list[Verdict]
    start: int
    end: int


class IncidentStore:
    """A `tracer.pipeline.core.Sink` placed after the `SegmentSink` it cuts from."""

    def __init__(
        self,
        segments: SegmentSink,
        clock_offset_ns: Callable[[], int],
        *,
        before_s: float = DEFAULT_BEFORE_S,
        after_s: float = DEFAULT_AFTER_S,
        on_cut: Callable[[str, str | None, str | None], None] = lambda _i, _p, _e: None,
    ) -> None:
        self.segments = segments
        self.state = segments.state
        self.clock_offset_ns = clock_offset_ns
        self.before_ns = int(before_s * 1e9)
        self.after_ns = int(after_s * 1e9)
        self.max_window_ns = max(int(MAX_WINDOW_S * 1e9), self.before_ns + self.after_ns)
        self.on_cut = on_cut  # (id, path or None, error or None)
        self.pending: list[Pending] = []
        self.written = 0
        self.failed = 0
        self._ids: set[str] = set()
        self._remove_partials()

    def _remove_partials(self) -> None:
        """What an agent killed while cutting left: half an incident, never listed."""
        with contextlib.suppress(OSError):
            for name in os.listdir(self.state.incidents):
                if name.startswith(PARTIAL):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.state.incidents, name))

    def add(self, v: Verdict) -> str:
        """The incident ``v`` belongs to (a window still open, or a new one); its id at once."""
        for p in self.pending:
            if p.start <= v.ts <= p.end and v.ts + self.after_ns - p.start <= self.max_window_ns:
                p.verdicts.append(v)
                p.end = max(p.end, v.ts + self.after_ns)
                return p.id
        base = incident_id(v, self.clock_offset_ns())
        iid, n = base, 1
        while iid in self._ids or self.state.incident_path(iid) is not None:
            n += 1
            iid = f"{base}.{n}"
        self._ids.add(iid)
        self.pending.append(Pending(iid, [v], v.ts - self.before_ns, v.ts + self.after_ns))
        return iid

    # -- the Sink contract ------------------------------------------------------------------

    def write(self, events: Sequence[Event]) -> None:
        if events and self.pending:
            self._cut_due(events[-1].ts)

    def close(self, footer: TraceFooter, complete: bool) -> None:
        self._cut_due(None)

    # -- cutting ----------------------------------------------------------------------------

    def _cut_due(self, stream_ts: int | None) -> None:
        due = [p for p in self.pending if stream_ts is None or p.end <= stream_ts]
        if not due:
            return
        self.pending = [p for p in self.pending if p not in due]
        self.segments.flush()
        for p in due:
            self._ids.discard(p.id)
            try:
                path = self._cut(p)
            except (OutputError, TraceFileError, OSError) as exc:
                self.failed += 1
                self.on_cut(p.id, None, str(exc))
                continue
            self.written += 1
            self.on_cut(p.id, path, None)

    def _segments_for(self, p: Pending) -> list[str]:
        """This boot's segments that can hold events of [start, end], oldest first."""
        found: list[tuple[int, str]] = []
        for path, _size, _mtime in self.state.segment_files():
            parsed = parse_segment_name(os.path.basename(path))
            if parsed is not None and parsed[0] == self.segments.boot[:8]:
                found.append((parsed[1], path))
        found.sort()
        out: list[str] = []
        for i, (first, path) in enumerate(found):
            nxt = found[i + 1][0] if i + 1 < len(found) else None
            if first <= p.end and (nxt is None or nxt >= p.start):
                out.append(path)
        return out

    def _cut(self, p: Pending) -> str:
        """Copy the window into an incident trace, streamed: a window after an exit storm
        holds a hundred thousand events, and a list of them cost the agent 14 MB of RSS per
        cut. The naming records read before the window's first event go first, stamped at
        its time; those that come inside the window stay where they are (in time order)."""
        names: dict[tuple[str, int], Event] = {}
        name = p.id + ".trace" + self.segments.suffix
        path, partial = (os.path.join(self.state.incidents, n) for n in (name, PARTIAL + name))
        writer: TraceWriter | None = None
        header: TraceHeader | None = None

        def open_at(start: int) -> TraceWriter:
            assert header is not None
            extra = {k: v for k, v in header.extra.items() if k != "agent_segment"}
            extra["incident"] = {
                "id": p.id,
                "verdicts": [{"pid": v.pid, "ts": v.ts, "cause": v.cause} for v in p.verdicts],
                "window_ns": [p.start, p.end],
            }
            w = TraceWriter.open(
                partial, dataclasses.replace(header, extra=extra, started_ns=start)
            )
            w.write_many([msgspec.structs.replace(ev, ts=start) for ev in names.values()])
            return w

        try:
            for seg in self._segments_for(p):
                with TraceReader(seg, CUT_READ_BLOCK) as reader:
                    header = header or reader.header
                    for ev in reader:
                        if ev.ts > p.end:
                            continue
                        if writer is None and (type(ev) is CgroupInfo or type(ev) is UnitInfo):
                            names[(ev.KIND, ev.cgroup_id)] = ev
                        elif ev.ts < p.start:
                            continue
                        else:
                            if writer is None:
                                writer = open_at(ev.ts)
                            writer.write(ev)
            if header is None:
                raise OutputError(f"incident {p.id}: no segment holds its window (evicted?)")
            if writer is None:
                writer = open_at(p.start)
            writer.close(writer.make_footer(f"incident {p.id}", ended_ns=p.end))
            os.replace(partial, path)
        except BaseException:
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.abort()
                with contextlib.suppress(Exception):
                    os.unlink(partial)  # no half incident: it is listed as failed instead
            raise
        return path
