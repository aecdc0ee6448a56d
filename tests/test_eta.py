"""The time-to-limit estimator (tracer/analysis/eta.py): properties of the pure estimate, and
the one path from samples through the Analyzer to the tail's warning line."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.streams import MiB, sample, t
from tracer.analysis.analyzer import Analyzer
from tracer.analysis.eta import DEFAULT, Limit, estimate
from tracer.events import CgroupSample, EffectiveLimit
from tracer.outputs.tail import feed_of

GiB = 1024 * MiB
LIMIT = Limit(2 * GiB, "/kubepods/pod1")
INTERVAL = 1.0


def _sample(at: float, anon: int, file: int = 0, shmem: int = 0, cg: int = 7) -> CgroupSample:
    """A v1-like sample: usage is anon plus the page cache (which includes shmem)."""
    return sample(
        at,
        cg,
        "/kubepods/pod1",
        usage=anon + file,
        stat={"anon": anon, "file": file, "shmem": shmem},
    )


def _every_prefix(samples: Sequence[CgroupSample], limit: Limit = LIMIT) -> list[object]:
    """The estimate after each sample, as a live recording would have made it."""
    return [estimate(samples[: i + 1], limit) for i in range(len(samples))]


# -- properties --------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(rate=st.floats(20.0, 60.0), floor=st.integers(50, 300), after=st.integers(16, 25))
def test_a_restarted_leak_is_judged_on_its_own_readings(
    rate: float, floor: int, after: int
) -> None:
    """A leak OOM-killed at the limit and restarted from its floor: the new run's readings
    alone decide, so it is warned about once it has grown for the span the first run needed,
    not once the readings at the limit have left the window."""
    first = int((LIMIT.bytes / MiB - floor) / rate)
    samples = [_sample(i * INTERVAL, int((floor + rate * i) * MiB)) for i in range(first)]
    samples += [
        _sample((first + i) * INTERVAL, int((floor + rate * i) * MiB)) for i in range(after)
    ]
    est = estimate(samples, LIMIT)
    assert est is not None
    truth = (LIMIT.bytes - samples[-1].stat["anon"]) / (rate * MiB)
    assert abs(est.seconds - truth) <= 0.01 + 1e-6 * truth


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(0, 1536),  # MiB in use when the growth is seen
    rate=st.floats(2.0, 200.0),  # MiB/s
    cache=st.integers(0, 256),  # MiB of clean page cache, constant
    seconds=st.integers(16, 60),
)
def test_linear_growth_to_the_limit_is_within_the_band(
    start: int, rate: float, cache: int, seconds: int
) -> None:
    samples = [
        _sample(i * INTERVAL, int((start + rate * i * INTERVAL) * MiB), file=cache * MiB)
        for i in range(seconds)
        if (start + rate * i * INTERVAL + cache) * MiB < LIMIT.bytes
    ]
    if len(samples) < 16:
        return  # reached the limit before the growth had lasted long enough to say so
    last_anon = samples[-1].stat["anon"]
    truth = (LIMIT.bytes - last_anon) / (rate * MiB)  # the kernel drops the cache first
    est = estimate(samples, LIMIT)
    if truth > DEFAULT.horizon_s:
        assert est is None
        return
    assert est is not None
    assert est.low_s * (1 - 1e-6) - 0.01 <= truth <= est.high_s * (1 + 1e-6) + 0.01
    assert abs(est.seconds - truth) <= 0.01 + 1e-6 * truth
    assert abs(est.rate - rate * MiB) <= 1e-6 * rate * MiB + 1
    assert est.growing == "anon"
    assert est.reclaimable == cache * MiB
    assert est.used == last_anon + cache * MiB


@settings(max_examples=60, deadline=None)
@given(
    base=st.integers(16, 1024),  # MiB before the ramp
    ramp=st.floats(0.5, 7.5),  # seconds: at most half the minimum span
    rate=st.floats(10.0, 400.0),  # MiB/s
    flat=st.integers(0, 60),
)
def test_a_startup_ramp_that_levels_off_never_warns(
    base: int, ramp: float, rate: float, flat: int
) -> None:
    top = min(base + rate * ramp, 1900)
    n = int(ramp / INTERVAL) + flat + 1
    samples = [
        _sample(i * INTERVAL, int(min(base + rate * i * INTERVAL, top) * MiB)) for i in range(n)
    ]
    assert all(e is None for e in _every_prefix(samples))


@settings(max_examples=40, deadline=None)
@given(
    ramp=st.integers(16, 120),  # seconds: long enough to be warned about while it climbs
    rate=st.floats(1.0, 50.0),
    after=st.integers(0, 40),
)
def test_any_ramp_once_flat_for_half_the_window_gives_none(
    ramp: int, rate: float, after: int
) -> None:
    top = 64 + rate * ramp
    if top * MiB >= LIMIT.bytes:
        return
    flat_for = int(DEFAULT.window_s / 2) + after
    samples = [
        _sample(i * INTERVAL, int((64 + rate * min(i, ramp)) * MiB))
        for i in range(ramp + flat_for + 1)
    ]
    later = _every_prefix(samples)[ramp + int(DEFAULT.window_s / 2) :]
    assert all(e is None for e in later)


@settings(max_examples=60, deadline=None)
@given(
    anon=st.integers(16, 1024),
    shmem=st.integers(0, 128),
    rate=st.floats(1.0, 400.0),  # MiB/s of page cache
    seconds=st.integers(16, 90),
)
def test_page_cache_growth_never_warns(anon: int, shmem: int, rate: float, seconds: int) -> None:
    samples = []
    for i in range(seconds):
        file = (shmem + rate * i) * MiB
        if (anon * MiB + file) >= LIMIT.bytes:
            break  # (the kernel would reclaim it here: usage stays at the limit)
        samples.append(_sample(i * INTERVAL, anon * MiB, file=int(file), shmem=shmem * MiB))
    assert all(e is None for e in _every_prefix(samples))


@settings(max_examples=80, deadline=None)
@given(
    level=st.integers(0, 2047 * MiB),
    noise=st.lists(st.integers(-512 * 1024, 512 * 1024), min_size=4, max_size=90),
    interval=st.sampled_from([0.05, 0.25, 1.0]),
)
def test_noise_around_a_flat_line_never_warns(
    level: int, noise: list[int], interval: float
) -> None:
    # peak-to-peak 1 MiB: a quarter of the minimum growth, whatever its pattern (the docstring's
    # bound), so even noise that creeps up inside its band stays quiet
    top = LIMIT.bytes - 512 * 1024 - 1
    samples = [
        _sample(i * interval, min(top, max(512 * 1024, level)) + n) for i, n in enumerate(noise)
    ]
    assert all(e is None for e in _every_prefix(samples))


@settings(max_examples=60, deadline=None)
@given(
    base=st.integers(16, 512),
    rise=st.integers(64, 1400),  # MiB: the plateau stays below the 2 GiB limit
    tau=st.floats(0.5, 8.0),  # seconds: a load that slows as it completes
    interval=st.sampled_from([0.25, 1.0]),
)
def test_a_ramp_that_slows_into_its_plateau_never_warns(
    base: int, rise: int, tau: float, interval: float
) -> None:
    n = int(60 / interval)
    samples = [
        _sample(i * interval, int((base + rise * (1 - math.exp(-i * interval / tau))) * MiB))
        for i in range(n)
    ]
    assert all(e is None for e in _every_prefix(samples))


def test_noise_that_creeps_up_inside_its_band_near_the_limit_never_warns() -> None:
    # a sawtooth 5 MiB under the limit: 90% of its steps rise, none of it is growth
    level = LIMIT.bytes - 5 * MiB
    samples = [_sample(i, level + (i % 10) * 100 * 1024) for i in range(90)]
    assert all(e is None for e in _every_prefix(samples))


# -- examples ----------------------------------------------------------------------------------


def test_too_far_away_gives_none_and_soon_gives_an_estimate() -> None:
    slow = [_sample(i, (100 + 1 * i) * MiB) for i in range(30)]  # 1 MiB/s: 32 minutes away
    assert estimate(slow, LIMIT) is None
    fast = [_sample(i, (100 + 40 * i) * MiB) for i in range(30)]
    est = estimate(fast, LIMIT)
    assert est is not None and 0 < est.seconds < 60


def test_steps_of_allocation_count_as_growth() -> None:
    # 64 MiB every 4 s (a batch allocator): half the steps do not move, every one that does rises
    samples = [_sample(i, (200 + 64 * (i // 4)) * MiB) for i in range(30)]
    est = estimate(samples, LIMIT)
    assert est is not None
    assert 13 * MiB < est.rate < 19 * MiB


def test_shmem_growth_is_not_reclaimable() -> None:
    # tmpfs files: charged as page cache, yet the kernel cannot drop them
    samples = [_sample(i, 100 * MiB, file=(40 * i) * MiB, shmem=(40 * i) * MiB) for i in range(30)]
    est = estimate(samples, LIMIT)
    assert est is not None
    assert est.growing == "shmem"
    assert est.reclaimable == 0


# -- the one path: samples -> Analyzer -> tail line ---------------------------------------------


def _limit(cg: int, path: str, limit: int, set_by: str) -> EffectiveLimit:
    return EffectiveLimit(ts=0, cgroup_id=cg, path=path, limit_bytes=limit, set_by=set_by)


def _v2(at: float, cg: int, path: str, anon: int, high: int | None = None) -> CgroupSample:
    s = sample(at, cg, path, usage=anon, stat={"anon": anon, "file": 0, "shmem": 0})
    return CgroupSample(**{**{f: getattr(s, f) for f in s.__struct_fields__}, "high_bytes": high})


def test_the_analyzer_warns_on_the_limit_of_the_parent_that_holds_it() -> None:
    a = Analyzer()
    feed = feed_of(lambda: a)
    a.feed(_limit(8, "/pod/c", 1 * GiB, "/pod"))
    lines = []
    for i in range(40):
        # the parent (the pod, limited) is sampled before the container in each round
        for ev in (
            _v2(i, 9, "/pod", (100 + 20 * i) * MiB),
            _v2(i, 8, "/pod/c", (90 + 20 * i) * MiB),
        ):
            lines += feed.feed(ev, a.feed(ev))
    warned = [ln for ln in lines if ln.eta is not None]
    assert warned, [ln.text for ln in lines]
    first = warned[0]
    assert first.eta is not None and first.eta.limit.path == "/pod"
    assert first.ts >= t(15)  # not before the growth had lasted the minimum span
    assert "will reach its 1.0 GiB limit on /pod in ~" in first.text
    assert "at +20.0 MiB/s anon" in first.text
    assert a.forecast(8) is not None and a.forecast(9) is None  # (the pod is not watched)


def test_memory_high_of_an_ancestor_is_the_nearer_limit() -> None:
    a = Analyzer()
    a.feed(_limit(8, "/pod/c", 2 * GiB, "/pod/c"))
    for i in range(30):
        a.feed(_v2(i, 9, "/pod", (100 + 20 * i) * MiB, high=1 * GiB))
        a.feed(_v2(i, 8, "/pod/c", (100 + 20 * i) * MiB))
    est = a.forecast(8)
    assert est is not None
    assert (est.limit.kind, est.limit.path, est.limit.bytes) == ("high", "/pod", 1 * GiB)


def test_the_warning_ends_with_a_line_when_the_growth_stops() -> None:
    a = Analyzer()
    feed = feed_of(lambda: a)
    a.feed(_limit(8, "/c", 1 * GiB, "/c"))
    lines = []
    for i in range(80):
        ev = _v2(i, 8, "/c", (100 + 20 * min(i, 30)) * MiB)
        lines += feed.feed(ev, a.feed(ev))
    texts = [ln.text for ln in lines if ln.text.startswith("eta ")]
    assert texts[0].startswith("eta     /c will reach its 1.0 GiB limit")
    assert texts[-1] == "eta     /c: no longer heading for its limit"
    assert a.forecast(8) is None


def test_the_agent_gauge_stands_only_while_the_warning_does(tmp_path: object) -> None:
    from types import SimpleNamespace

    from prometheus_client import generate_latest

    from tracer.agent.run import Agent, AgentConfig

    agent = Agent(AgentConfig(state_dir=str(tmp_path), metrics_addr=None))
    a = Analyzer(every_verdict=True, keep_verdicts=False)
    agent.recorder = SimpleNamespace(analyzer=a, header=None)  # type: ignore[assignment]
    name = "whyrestart_memory_limit_eta_seconds"
    seen = []
    for i, ev in enumerate(
        [_limit(8, "/c", 1 * GiB, "/c")]
        + [_v2(i, 8, "/c", (100 + 20 * min(i, 30)) * MiB) for i in range(80)]
    ):
        agent._on_event(ev, a.feed(ev))
        text = generate_latest(agent.metrics.registry).decode()
        seen.append(any(line.startswith(name + "{") for line in text.splitlines()))
        if i == 25:
            [line] = [ln for ln in text.splitlines() if ln.startswith(name + "{")]
            assert 'unit="/c"' in line
            value = float(line.rsplit(" ", 1)[1])
            # 1 GiB - (100 + 20*24) MiB left at 20 MiB/s
            assert abs(value - (1024 - 580) / 20) < 0.2
    assert not any(seen[:16]) and any(seen) and not seen[-1]


def test_replay_warnings_prints_them_escaped_and_as_json(tmp_path: object) -> None:
    import orjson
    from click.testing import CliRunner

    from tests.streams import header
    from tracer.cli import main
    from tracer.trace.writer import TraceWriter

    evil = "/evil\x1b]0;pwned\x07"
    path = f"{tmp_path}/grow.trace"
    w = TraceWriter.open(path, header())
    w.write_many(
        [_limit(8, evil, 1 * GiB, evil)]
        + [_v2(i, 8, evil, (100 + 20 * min(i, 30)) * MiB) for i in range(1, 80)]
    )
    w.close(w.make_footer("command exited", ended_ns=t(80)))
    text = CliRunner().invoke(main, ["replay", "--warnings", path])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert len(lines) == 3, lines  # the start, once halved, and the end
    assert "\x1b" not in text.output and "/evil\\x1b]0;pwned\\x07 will reach" in lines[0]
    assert lines[-1].endswith("/evil\\x1b]0;pwned\\x07: no longer heading for its limit")
    js = CliRunner().invoke(main, ["replay", "--warnings", "--json", path])
    docs = [orjson.loads(ln) for ln in js.output.splitlines()]
    est = docs[0]["eta"]
    assert (est["limit_path"], est["limit_kind"], est["growing"]) == (evil, "max", "anon")
    assert est["rate_bytes_per_s"] == 20 * MiB and est["low_s"] <= est["seconds"] <= est["high_s"]
    assert "eta" not in docs[-1]


def test_the_bench_scores_lead_time_and_false_warnings(tmp_path: object) -> None:
    """A smoke run of the bench's eta scoring (bench/sections/eta.py) on written traces."""
    from bench.sections.eta import score, summary
    from tests.streams import header, oom
    from tracer.trace.writer import TraceWriter

    def write(name: str, events: list[object]) -> str:
        path = f"{tmp_path}/{name}.trace.zst"
        w = TraceWriter.open(path, header())
        w.write_many(events)  # type: ignore[arg-type]
        w.close(w.make_footer("command exited", ended_ns=t(100)))
        return path

    from pathlib import Path

    leak = [_limit(8, "/c", 1 * GiB, "/c")]
    leak += [_v2(i, 8, "/c", (100 + 20 * i) * MiB) for i in range(1, 47)]
    leak.append(oom(46.5, victim=5, limit_cgroup=8, limit=1 * GiB, usage=1 * GiB, victim_cg=8))
    flat = [_limit(8, "/c", 1 * GiB, "/c")] + [_v2(i, 8, "/c", 300 * MiB) for i in range(1, 60)]
    scores = [score(Path(write("x_oom", leak))), score(Path(write("y_ok", flat)))]
    [kill] = scores[0]["kills"]
    assert kill["lead_s"] is not None and abs(kill["lead_s"] - 30.5) < 0.01  # warned at 16 s
    assert kill["growth_s"] > 40
    assert summary(scores) == {
        "kills": 1,
        "kills_growth_30s": 1,
        "warned_10s_before": 1,
        "false_warnings": 0,
        "no_oom_traces": 1,
    }


def test_the_recorded_traces_are_there_and_end_as_named() -> None:
    """The bench's traces (tests/data/eta_*.trace.zst) replay: each ``*_oom`` one holds its
    OOM kill, each ``*_ok`` one none (what they score is the bench's, not asserted here)."""
    from bench.sections.eta import DATA, score

    traces = sorted(DATA.glob("eta_*.trace.zst"))
    assert len(traces) >= 7, traces
    for p in traces:
        s = score(p)
        # a restart loop's trace holds one kill per run
        runs = 3 if s["trace"].startswith("eta_restarts") else 1
        assert len(s["kills"]) == (runs if s["trace"].endswith("_oom") else 0), s
