"""The pipeline's contract, with stand-in sources, enrichers and sinks (no kernel, no root)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from tracer.events import Event, Exit, GpuXid, Lost, ProbeSample
from tracer.parse.kmsg import KmsgRecord
from tracer.pipeline import sources
from tracer.pipeline.core import HeaderPart, Pipeline, header_parts
from tracer.pipeline.reorder import DEFAULT_WINDOW_NS
from tracer.pipeline.sources import KmsgSource, ProbeResultsSource
from tracer.sources.kmsg import KmsgReader
from tracer.sources.probes import ProbeResult
from tracer.trace.format import TraceFooter

MS = 1_000_000


def _exit(ts: int, pid: int) -> Exit:
    return Exit(ts=ts, pid=pid, ppid=1, comm="x", cgroup_id=0, status=0, start_ns=0)


class Ring:
    """The first source: hands over prepared batches; ``full`` batches mean it is behind."""

    def __init__(self, batches: list[tuple[list[Event], bool]]) -> None:
        self.batches = batches
        self.behind = False
        self.polls: list[bool] = []
        self.stopped = False
        self.closed = False

    def poll(self, now_ns: int, behind: bool) -> list[Event]:
        self.polls.append(behind)
        if not self.batches:
            self.behind = False
            return []
        events, self.behind = self.batches.pop(0)
        return list(events)

    def header(self) -> HeaderPart:
        return HeaderPart(hooks={"exit": "tp_btf", "oom": None}, extra={"a": 1})

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        self.closed = True

    def warnings(self) -> list[str]:
        return ["ring warning"]


class Timed:
    """A later source: one event stamped "now" per poll, none while the ring is behind."""

    behind = False

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool]] = []
        self.stopped = False
        self.closed = False

    def poll(self, now_ns: int, behind: bool) -> list[Event]:
        self.seen.append((now_ns, behind))
        return [] if behind else [Lost(ts=now_ns, count=1)]

    def header(self) -> HeaderPart:
        return HeaderPart(hooks={"oom": "kmsg", "exit": "other"}, extra={"b": 2})

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        self.closed = True

    def warnings(self) -> list[str]:
        return []


class Tagger:
    """An enricher that adds one event per exit it sees (like a follower's probe sample)."""

    def __init__(self) -> None:
        self.seen = 0

    def enrich(self, events: list[Event]) -> list[Event]:
        extra: list[Event] = []
        for ev in events:
            if isinstance(ev, Exit):
                self.seen += 1
                ok = ProbeResult(
                    ev.ts, latency_ns=0, ok=True, timed_out=False, status=None, error=""
                )
                extra.append(ok.sample("t"))
        return events + extra


class Collect:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.writes = 0
        self.footer: TraceFooter | None = None
        self.complete: bool | None = None

    def write(self, events: Sequence[Event]) -> None:
        self.writes += 1
        self.events += events

    def close(self, footer: TraceFooter, complete: bool) -> None:
        self.footer, self.complete = footer, complete


class Clock:
    def __init__(self, start: int) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += MS
        return self.now


def test_behind_holds_back_the_other_sources_and_the_window() -> None:
    t0 = 1_000 * MS
    ring = Ring([([_exit(t0 + MS, 1)], True), ([_exit(t0 + 2 * MS, 2)], False)])
    timed, sink = Timed(), Collect()
    p = Pipeline([ring, timed], [Tagger()], [sink], clock=Clock(t0 + 3 * MS))
    p.step()
    # behind: the timed source was asked with behind=True and gave nothing; nothing released
    assert timed.seen[0][1] is True
    assert sink.events == []
    assert p.behind
    p.step()
    assert ring.polls == [False, True]  # the second poll knew the ring was behind
    assert timed.seen[1][1] is False
    assert not p.behind
    # released: what is older than the window at "now" (nothing yet: the clock is 5 ms in)
    assert sink.events == []
    assert len(p.reorder) == 5  # 2 exits, 2 tags, 1 Lost


def test_drain_stops_every_source_and_releases_everything_in_time_order() -> None:
    t0 = 1_000 * MS
    ring = Ring([([_exit(t0 + 9 * MS, 1)], True), ([_exit(t0 + 2 * MS, 2)], False)])
    timed, sink = Timed(), Collect()
    p = Pipeline([ring, timed], [Tagger()], [sink], clock=Clock(t0 + 10 * MS))
    p.drain(within_s=60.0)
    assert ring.stopped and timed.stopped
    assert ring.polls == [False, True]
    assert [ev.ts for ev in sink.events] == sorted(ev.ts for ev in sink.events)
    kinds = [ev.KIND for ev in sink.events]
    assert kinds.count("exit") == 2 and kinds.count("probe") == 2 and kinds.count("lost") == 1
    assert p.counts == {"exit": 2, "probe": 2, "lost": 1}
    assert len(p.reorder) == 0


def test_a_drain_out_of_time_still_polls_every_source_once() -> None:
    t0 = 1_000 * MS
    ring = Ring([([_exit(t0 + MS, 1)], True)] * 3)
    timed, sink = Timed(), Collect()
    p = Pipeline([ring, timed], [], [sink], clock=Clock(t0))
    p.drain(within_s=0.0)
    assert timed.seen == [(timed.seen[0][0], False)]
    assert [ev.KIND for ev in sink.events] == ["exit", "lost"]


def test_header_parts_fill_a_hook_only_where_no_earlier_source_attached_it() -> None:
    parts = header_parts([Ring([]), Timed()])
    assert parts.hooks == {"exit": "tp_btf", "oom": "kmsg"}
    assert parts.extra == {"a": 1, "b": 2}


def test_close_sources_closes_all_and_warnings_come_from_sources() -> None:
    ring, timed = Ring([]), Timed()
    p = Pipeline([ring, timed], [], [], clock=Clock(0))
    p.close_sources()
    assert ring.closed and timed.closed
    assert p.warnings() == ["ring warning"]


def test_probe_results_source_turns_results_into_probe_samples() -> None:
    stopped: list[bool] = []
    src = ProbeResultsSource("http://x/health", on_stop=lambda: stopped.append(True))
    src.put(ProbeResult(start_ns=5, latency_ns=7, ok=False, timed_out=True, status=None, error="t"))
    assert src.poll(10, behind=True) == []
    (sample,) = src.poll(10, behind=False)
    assert isinstance(sample, ProbeSample)
    assert (sample.ts, sample.target, sample.latency_ns, sample.ok, sample.timed_out) == (
        5,
        "http://x/health",
        7,
        False,
        True,
    )
    assert src.poll(11, behind=False) == []
    src.stop()
    assert stopped == [True]


def test_window_releases_what_is_old_enough() -> None:
    t0 = 1_000 * MS
    ring = Ring([([_exit(t0, 1)], False)])
    sink = Collect()
    p = Pipeline([ring], [], [sink], clock=Clock(t0 + DEFAULT_WINDOW_NS))
    p.step()
    assert [ev.KIND for ev in sink.events] == ["exit"]


class FakeKmsg:
    """A kernel log that holds prepared records."""

    def __init__(self, records: list[KmsgRecord]) -> None:
        self.records = records
        self.closed = False

    def read_available(self) -> list[KmsgRecord]:
        out, self.records = self.records, []
        return out

    def close(self) -> None:
        self.closed = True


def test_kernel_log_source_turns_xid_lines_into_gpu_events_and_waits_while_behind() -> None:
    log = FakeKmsg(
        [
            KmsgRecord(3, 0, 7, 1, "NVRM: Xid (PCI:0000:3b:00): 79, pid=100, name=python3, x"),
            KmsgRecord(6, 0, 8, 2, "eth0: link up"),
        ]
    )
    src = KmsgSource(lambda _oom: True, open_reader=lambda: log)  # type: ignore[arg-type,return-value]
    assert src.header().hooks == {"oom": "kmsg"}
    assert src.poll(10, behind=True) == []  # held back: the records stay in the kernel log
    [ev] = src.poll(10, behind=False)
    assert isinstance(ev, GpuXid) and (ev.xid, ev.pid) == (79, 100)
    assert ev.ts == 1_000 - src.monotonic_offset  # the record's time (1 µs) on CLOCK_BOOTTIME
    src.close()
    assert log.closed


def test_kernel_log_source_without_a_kernel_log_warns_and_claims_no_rung() -> None:
    def unavailable() -> KmsgReader:
        raise OSError("no /dev/kmsg here")

    src = KmsgSource(lambda _oom: True, open_reader=unavailable)
    assert src.header().hooks == {}
    assert src.poll(10, behind=False) == []
    assert src.warnings() == [
        "kernel log unavailable (no /dev/kmsg here): OOM reports come from BPF only"
    ]


def test_the_ring_waits_longer_once_quiet_and_not_once_a_record_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent's idle wait: after IDLE_POLLS empty polls the ring waits idle_wait_ms; one
    record brings the short wait back; behind, it does not wait at all."""
    waits: list[int] = []
    batches: list[list[Event]] = []

    class Ring:
        full = False

        def __init__(self, _events: object) -> None:
            pass

        def drain(self, wait_ms: int) -> list[Event]:
            waits.append(wait_ms)
            return batches.pop(0) if batches else []

    class Decoder:
        def __init__(self, page_size: int) -> None:
            pass

        def decode_batch(self, raws: list[Event]) -> list[Event]:
            return raws

    monkeypatch.setattr(sources, "RingBuffer", Ring)
    monkeypatch.setattr(sources, "Decoder", Decoder)
    ring = sources.RingSource(
        SimpleNamespace(events=None),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        (),
        wait_ms=100,
        idle_wait_ms=500,
    )
    for _ in range(sources.IDLE_POLLS + 2):
        ring.poll(0, False)
    assert waits == [100] * sources.IDLE_POLLS + [500, 500]
    batches.append([_exit(1, 1)])
    ring.poll(0, False)  # (waited 500: the record ends it)
    ring.poll(0, False)
    ring.poll(0, True)
    assert waits[-3:] == [500, 100, 0]
