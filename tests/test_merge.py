"""Tier 1: the reorder window releases events in time order and counts late ones."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tracer.events import Lost
from tracer.pipeline.reorder import Reorder


def ev(ts: int) -> Lost:
    return Lost(ts=ts, count=1)


def test_releases_only_events_older_than_the_window() -> None:
    r = Reorder(window_ns=100)
    r.push([ev(50), ev(10), ev(200)])
    assert [e.ts for e in r.pop_ready()] == [10, 50]
    assert [e.ts for e in r.flush()] == [200]


def test_now_lets_events_out_without_newer_ones() -> None:
    r = Reorder(window_ns=100)
    r.push([ev(10)])
    assert r.pop_ready(now_ns=50) == []
    assert [e.ts for e in r.pop_ready(now_ns=500)] == [10]


def test_late_event_is_counted() -> None:
    r = Reorder(window_ns=10)
    r.push([ev(100)])
    r.pop_ready(now_ns=1000)
    r.push([ev(50)])
    assert r.late == 1


@given(st.lists(st.lists(st.integers(0, 10_000), max_size=20), max_size=20))
def test_output_is_sorted_when_skew_is_within_the_window(batches: list[list[int]]) -> None:
    r = Reorder(window_ns=20_000)  # wider than any skew generated here
    out = []
    for b in batches:
        r.push(ev(x) for x in b)
        out += r.pop_ready()
    out += r.flush()
    ts = [e.ts for e in out]
    assert ts == sorted(ts) and len(ts) == sum(map(len, batches))
