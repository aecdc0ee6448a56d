"""Tier 1: memory that rose in steps and never came back down (analysis.growth), on made-up
series and on a real recording of llama-server's prompt-cache waves (bench/eta_traces.py)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tracer.analysis.growth import SECOND, stepwise
from tracer.cli import main

MiB = 1 << 20
DATA = Path(__file__).parent / "data"


def series(values_mib: list[float]) -> list[tuple[int, int]]:
    return [(t * SECOND, int(v * MiB)) for t, v in enumerate(values_mib)]


def waves(n: int, per_wave: float = 32, rise_s: int = 3, pause_s: int = 5) -> list[float]:
    """A load to 200 MiB, then ``n`` waves each adding ``per_wave`` over ``rise_s``."""
    out = [200.0] * 4
    for _ in range(n):
        for _ in range(rise_s):
            out.append(out[-1] + per_wave / rise_s)
        out += [out[-1]] * pause_s
    return out


def test_waves_that_keep_what_they_add_are_steps() -> None:
    got = stepwise(series(waves(4)))
    assert got is not None and got.steps == 4
    assert [round(v / MiB) for v in got.levels] == [200, 232, 264, 296, 328]


def test_waves_a_few_seconds_apart_read_once_a_second_are_steps() -> None:
    """Waves answered back to back on a busy host: each adds 32 MiB at once, 2.4 s after the
    last, and the sampler reads once a second, half a second past each second: one flat second
    between two rising ones is a pause of about 2 s, not one long rise."""
    rises = [10.6 + 2.4 * k for k in range(4)]
    pts = [
        (int((t + 0.5) * SECOND), (200 + 32 * sum(r <= t + 0.5 for r in rises)) * MiB)
        for t in range(25)
    ]
    got = stepwise(pts)
    assert got is not None and got.steps == 4
    assert [round(v / MiB) for v in got.levels] == [200, 232, 264, 296, 328]


def test_two_waves_after_a_load_are_not_enough() -> None:
    assert stepwise(series(waves(2))) is None


def test_a_steady_leak_is_one_long_rise_not_steps() -> None:
    assert stepwise(series([10 + 3 * t for t in range(60)])) is None


def test_a_load_ramp_that_levels_off_is_not_steps() -> None:
    assert stepwise(series([min(10 + 20 * t, 300) for t in range(60)])) is None


def test_memory_given_back_between_waves_is_not_steps() -> None:
    values = waves(4)
    values[20] -= 20  # a wave's memory freed, once
    assert stepwise(series(values)) is None


def test_requests_that_come_and_go_are_not_steps() -> None:
    assert stepwise(series([200 + (24 if t % 6 < 3 else 0) for t in range(60)])) is None


def test_samples_within_a_second_count_as_that_seconds_highest() -> None:
    """Near a limit the sampler reads every 50 ms: a second is its highest reading."""
    pts = [
        (t * SECOND + k * 50_000_000, int(v * MiB) - k)
        for t, v in enumerate(waves(3))
        for k in range(20)
    ]
    got = stepwise(pts)
    assert got is not None and got.steps == 3


def test_the_prompt_cache_waves_oom_says_anon_rose_in_steps() -> None:
    """llama-server's prompt cache (-np 4, --cache-ram default) under 400 MiB, a wave of 4
    long prompts every 8 s, recorded with `whyrestart record`: the verdict says how it
    filled."""
    r = CliRunner().invoke(
        main, ["replay", "--verdicts-only", str(DATA / "eta_llama_waves_oom.trace.zst")]
    )
    assert r.exit_code == 0, r.output
    assert "cgroup_oom" in r.output
    assert "its anon memory rose in" in r.output and "never came back down" in r.output
    assert "a cache the requests fill" in r.output
