"""Tier 1: page-cache thrash (tracer/analysis/thrash.py) from cgroup samples, and the tail's
lines about it, fed through the Analyzer as a recording or a replay feeds it.

The numbers are shaped on what llama-server did here (tests/test_llama_server_root.py): a
272 MiB model mapped under a 200 MiB limit held ~90 MiB of page cache and refaulted ~780,000
file pages (3 GiB) per 24-token request; a server whose cache fits refaults a trickle."""

from __future__ import annotations

import signal

import msgspec

from tests.streams import cgroup, execd, killed, one, probe, sample, sent
from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.analysis.thrash import MIN_RATE, PAGE_SIZE, detect
from tracer.events import CgroupSample, EffectiveLimit, Event
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


def test_a_cgroup_below_its_limit_or_without_one_is_not_to_blame() -> None:
    """An ancestor (no limit of its own) counts its children's refaults: not its thrash."""
    low = [msgspec.structs.replace(s, usage_bytes=120 * MiB) for s in thrashing(6, 150_000)]
    assert detect(low) is None
    free = [msgspec.structs.replace(s, limit_bytes=None) for s in thrashing(6, 150_000)]
    assert detect(free) is None
    assert detect(free, limit=200 * MiB) is not None  # the effective limit, an ancestor's


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


def probe_killed(pages_per_s: int, *more: Event) -> Verdict:
    """A server refaulting ``pages_per_s`` whose work-probes time out from 7 s, killed by
    conmon at 9.5 s."""
    events = [
        cgroup(CG, PATH, 200 * MiB),
        execd(0.1, 100, CG, "llama-server"),
        *more,
        *thrashing(10, pages_per_s),
        probe(7.0, False, 2000, timed_out=True),
        probe(8.0, False, 2000, timed_out=True),
        probe(9.0, False, 2000, timed_out=True),
        sent(9.5, 400, 100, signal.SIGKILL, comm="conmon"),
        killed(9.5, 100, signal.SIGKILL, cg=CG, start=0.1),
    ]
    events.sort(key=lambda e: e.ts)
    return one(*events)


def test_a_probe_kill_while_the_model_is_re_read_cites_the_thrash() -> None:
    """A supervisor kills a server whose work-probes (a one-token completion with a timeout)
    timed out while its cgroup re-read its mapped weights: probe_kill, with the thrash as the
    reason the probes were slow and advice about the limit, not the probe."""

    v = probe_killed(150_000, probe(1.0, True, 300))
    assert (v.cause, v.confidence) == ("probe_kill", "high")
    assert "page cache re-read from disk at 585.9 MiB/s" in v.summary
    assert "no room for the files it reads" in v.advice and "timeout only hides it" in v.advice
    assert any(text.startswith("/llm: page cache re-read from disk") for _, text in v.evidence), (
        v.evidence
    )


def test_a_probe_kill_with_the_cache_fitting_says_nothing_of_thrash() -> None:

    v = probe_killed(100)
    assert v.cause == "probe_kill"
    assert "re-read" not in v.summary and "page cache" not in v.advice
