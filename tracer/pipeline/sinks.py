"""Where ordered events go (`tracer.pipeline.core.Sink`).

* `TraceSink`: the trace file (flushed at least once a second, so a quiet recording still
  reaches the disk: ``tail -f``, crashes).
* `AnalyzerSink`: the live analysis; with ``on_event`` (a live tail) every event is handed on
  with the verdicts it made due, and the verdicts still open at the end with ``None``.

The very events written are the ones analysed, so replaying the file gives the same verdicts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.events import Event
from tracer.trace.format import TraceFooter
from tracer.trace.writer import TraceWriter

__all__ = ["AnalyzerSink", "TraceSink"]

FLUSH_S = 1.0


class TraceSink:
    def __init__(self, writer: TraceWriter) -> None:
        self.writer = writer
        self._next_flush = time.monotonic() + FLUSH_S

    def write(self, events: Sequence[Event]) -> None:
        if events:
            self.writer.write_many(events)
        now = time.monotonic()
        if now >= self._next_flush:
            self.writer.flush()
            self._next_flush = now + FLUSH_S

    def close(self, footer: TraceFooter, complete: bool) -> None:
        if not self.writer.closed:
            self.writer.close(footer)


class AnalyzerSink:
    def __init__(
        self,
        analyzer: Analyzer,
        on_event: Callable[[Event | None, list[Verdict]], None] | None = None,
    ) -> None:
        self.analyzer = analyzer
        self.on_event = on_event

    def write(self, events: Sequence[Event]) -> None:
        if not events:
            return
        if self.on_event is None:
            self.analyzer.feed_many(events)  # (kept verdicts: the end-of-run table reads them)
            return
        on_event, feed = self.on_event, self.analyzer.feed
        for ev in events:
            on_event(ev, feed(ev))

    def close(self, footer: TraceFooter, complete: bool) -> None:
        if not complete:
            return  # a failed run concludes nothing
        final = self.analyzer.finish()
        if self.on_event is not None and final:
            self.on_event(None, final)
