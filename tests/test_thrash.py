"""Tier 1: page-cache thrash (tracer/analysis/thrash.py) from cgroup samples, and the tail's
lines about it, fed through the Analyzer as a recording or a replay feeds it.

The numbers are shaped on what llama-server did here (tests/test_llama_server_root.py): a
272 MiB model mapped under a 200 MiB limit held ~90 MiB of page cache and refaulted ~780,000
file pages (3 GiB) per 24-token request; a server whose cache fits refaults a trickle."""

from __future__ import annotations

from tests.streams import sample
from tracer.analysis.analyzer import Analyzer
from tracer.analysis.thrash import MIN_RATE, PAGE_SIZE, detect
from tracer.events import CgroupSample, EffectiveLimit
from tracer.outputs.tail import WARN, feed_of

MiB = 1024 * 1024
CG, PATH = 40, "/llm"


def thrashing(seconds: int, pages_per_s: int, cache: int = 90 * MiB) -> list[CgroupSample]:
    """A sample every 0.5 s: refaulting ``pages_per_s`` with ``cache`` of page cache held."""
    return [
        sample(
            i * 0.5,
            CG,
            PATH,
            usage=199 * MiB,
            limit=200 * MiB,
            stat={
                "file": cache,
                "file_mapped": cache,
                "shmem": 0,
                "anon": 106 * MiB,
                "workingset_refault_file": int(i * 0.5 * pages_per_s),
            },
        )
        for i in range(seconds * 2 + 1)
    ]


def test_a_cache_re_read_many_times_over_is_thrash() -> None:
    t = detect(thrashing(6, 150_000))  # ~586 MiB/s against 90 MiB held
    assert t is not None
    assert round(t.rate / MiB) == round(150_000 * PAGE_SIZE / MiB)
    assert (t.cache, t.mapped, t.limit) == (90 * MiB, 90 * MiB, 200 * MiB)
    assert t.ts - t.since == 5_000_000_000  # the newest 5 s


def test_a_trickle_of_refaults_or_a_short_burst_is_not() -> None:
    assert detect(thrashing(6, 100)) is None  # 0.4 MiB/s: a working set that fits
    # fast, but less than the cache it holds in the window: a cold start reading its files once
    assert detect(thrashing(6, 5_000, cache=900 * MiB)) is None
    assert 5_000 * PAGE_SIZE >= MIN_RATE
    assert detect(thrashing(1, 150_000)) is None  # 1 s: too short to say
    assert detect([s for s in thrashing(6, 150_000) if s.ts == 0]) is None


def test_samples_without_the_counter_say_nothing() -> None:
    bare = [sample(i * 0.5, CG, PATH, usage=199 * MiB, stat={"file": MiB}) for i in range(20)]
    assert detect(bare) is None


def test_the_tail_names_it_when_it_starts_and_when_it_stops() -> None:
    a = Analyzer()
    feed = feed_of(lambda: a)
    lines = []
    events = [
        EffectiveLimit(ts=0, cgroup_id=CG, path=PATH, limit_bytes=200 * MiB, set_by=PATH),
        *thrashing(8, 150_000),
    ]
    last = events[-1]
    assert isinstance(last, CgroupSample)
    # then it stops: the counter stands still for 6 s
    events += [
        sample(8 + i * 0.5, CG, PATH, usage=150 * MiB, limit=200 * MiB, stat=dict(last.stat))
        for i in range(1, 13)
    ]
    for ev in events:
        lines += feed.feed(ev, a.feed(ev))
    said = [ln for ln in lines if ln.text.startswith("thrash")]
    assert len(said) == 2, [ln.text for ln in said]
    start, end = said
    assert start.severity == WARN and start.thrash is not None
    assert "page cache re-read from disk at 585.9 MiB/s" in start.text
    assert "at 199.0 MiB of its 200.0 MiB limit" in start.text
    assert end.text == "thrash  /llm: no longer re-reading its page cache"
