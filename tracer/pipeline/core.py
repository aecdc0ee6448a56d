"""The pipeline: sources -> enrichment -> time order -> sinks, one step at a time.

Every command that watches the live system (``record``, ``tail``, ``repro``) is this flow with
different ends; the recorder only chooses the sources, the enrichers and the sinks. The final
drain after a recording runs the very same ``step`` as the loop (with the sources stopped, so
they hand over what is in flight and start nothing new), so nothing is enriched, ordered or
counted differently at the end.

Contracts (structural, so a new source or sink is a class, not an edit of the loop):

* a `Source` hands over events from ``poll(now_ns, behind)``. The first source paces the loop
  (the ring buffer: it waits up to a few ms for data) and says whether it is ``behind`` (it
  holds more than one batch, all older than "now"); while it is, the other sources hold their
  events back, since anything stamped "now" would overtake the backlog and break the trace's
  time order. ``stop()`` ends new work (threads, scans) while keeping what is pending for the
  next polls; ``header()`` is what the source adds to the trace header (the hooks it attached
  and their rung; extra facts); ``warnings()`` is read once, at the end.
* an `Enricher` sees each source's events in turn, before they are ordered: it may watch new
  pids and cgroups (in the kernel and the samplers), name cgroups (inserting ``CgroupInfo``
  and ``UnitInfo`` records before the first event that mentions one), and add events of its
  own. The sources polled after it see what it learned (a new pid is sampled in the same step).
* a `Sink` receives every released batch, in time order, and is closed with the footer.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracer.events import Event
from tracer.pipeline.reorder import Reorder
from tracer.trace.format import TraceFooter

__all__ = ["Enricher", "HeaderPart", "Pipeline", "Sink", "Source"]


@dataclass
class HeaderPart:
    """What a source adds to the trace header: ``hooks`` (hook -> rung, None: not attached; a
    rung fills a hook only where no earlier source attached it, so a fallback source such as
    the kernel log is listed after the kernel hooks) and ``extra`` facts."""

    hooks: dict[str, str | None] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class Source(Protocol):
    @property
    def behind(self) -> bool: ...

    def poll(self, now_ns: int, behind: bool) -> list[Event]: ...

    def header(self) -> HeaderPart: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...

    def warnings(self) -> list[str]: ...


class Enricher(Protocol):
    def enrich(self, events: list[Event]) -> list[Event]: ...


class Sink(Protocol):
    def write(self, events: Sequence[Event]) -> None:
        """A released batch (often empty: a sink may use the call to flush on a timer)."""

    def close(self, footer: TraceFooter, complete: bool) -> None:
        """The end: ``complete`` is False when the run failed (the footer says why)."""


def header_parts(sources: Sequence[Source]) -> HeaderPart:
    """The sources' contributions merged in their order (see `HeaderPart`)."""
    out = HeaderPart()
    for src in sources:
        part = src.header()
        for hook, rung in part.hooks.items():
            if out.hooks.get(hook) is None:
                out.hooks[hook] = rung
        out.extra.update(part.extra)
    return out


class Pipeline:
    def __init__(
        self,
        sources: Sequence[Source],
        enrichers: Sequence[Enricher],
        sinks: Sequence[Sink],
        *,
        clock: Callable[[], int],
    ) -> None:
        self.sources = list(sources)
        self.enrichers = list(enrichers)
        self.sinks = list(sinks)
        self.clock = clock
        self.reorder = Reorder()
        self.counts: Counter[str] = Counter()
        self.behind = False
        self._closed = False

    def step(self, catch_up: bool = False) -> None:
        """Poll every source once, enrich, order, and hand what is ready to the sinks.
        ``catch_up``: every source is polled even if the first is still behind (the last step
        of a drain that ran out of time)."""
        batch: list[Event] = []
        behind = self.behind
        now_ns = self.clock()
        for i, src in enumerate(self.sources):
            events = src.poll(now_ns, behind)
            if i == 0:
                behind = src.behind and not catch_up
                now_ns = self.clock()  # after the wait for data: what "now" is for the others
            for e in self.enrichers:
                events = e.enrich(events)
            batch += events
        self.behind = behind
        self.reorder.push(batch)
        self._emit(self.reorder.pop_ready(None if behind else now_ns))

    def drain(self, within_s: float) -> None:
        """The end of a run: stop the sources, step until the first one has caught up (a flood
        that goes on is cut after ``within_s``: what it leaves in the ring is not in the
        trace, and not lost), then release everything still in the reorder window."""
        for src in self.sources:
            src.stop()
        until = time.monotonic() + within_s
        while True:
            last = time.monotonic() >= until
            self.step(catch_up=last)
            if last or not self.behind:
                break
        self._emit(self.reorder.flush())

    def _emit(self, events: list[Event]) -> None:
        counts = self.counts
        for ev in events:
            counts[ev.KIND] += 1
        for sink in self.sinks:
            sink.write(events)

    def warnings(self) -> list[str]:
        out = [w for src in self.sources for w in src.warnings()]
        if self.reorder.late:
            out.append(f"{self.reorder.late} events arrived later than the reorder window")
        return out

    def close_sources(self) -> None:
        """Close every source (whatever happened); the first failure is raised after all."""
        if self._closed:
            return
        self._closed = True
        first: BaseException | None = None
        for src in reversed(self.sources):
            try:
                src.close()
            except Exception as exc:  # each source is closed whatever the others do
                first = first or exc
        if first is not None:
            raise first

    def close_sinks(self, footer: TraceFooter, complete: bool) -> None:
        for sink in self.sinks:
            sink.close(footer, complete)
