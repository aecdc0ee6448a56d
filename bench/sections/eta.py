"""Section eta: the time-to-limit warnings (tracer/analysis/eta.py) scored on recorded traces.

Each ``tests/data/eta_*.trace.zst`` is replayed through the one judging path (the Analyzer and
the tail's feed, as ``replay --warnings`` does). A trace named ``*_oom`` holds real OOM kills:
for each kill, how long the growth before it lasted, the lead time of the first warning before
it, and the error of that warning's estimate (predicted seconds minus the real lead). A trace
named ``*_ok`` ends without an OOM kill: every warning it gives is a false one. The goal (issue
30 §3): a warning at least 10 s before at least 90% of the kills whose growth lasted 30 s or
more, and no false warning. Pure replay: no root, no tools, no CPU pinning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from bench.options import Options
from bench.records import Section
from bench.report import method_lines
from bench.runner import Context
from tracer.analysis.analyzer import Analyzer
from tracer.analysis.eta import level_of
from tracer.events import CgroupSample, EffectiveLimit, OomKill
from tracer.outputs.tail import feed_of
from tracer.trace.reader import TraceReader

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
GOAL_LEAD_S = 10.0
GOAL_GROWTH_S = 30.0
# the growth before a kill starts where the watched cgroup's unreclaimable memory last stood
# within this share of the limit above its lowest reading
GROWTH_FLOOR = 0.05


class Kill(TypedDict):
    trace: str
    growth_s: float
    lead_s: float | None  # None: no warning before it
    predicted_s: float | None
    low_s: float | None
    high_s: float | None


class Score(TypedDict):
    trace: str
    kills: list[Kill]
    false_warnings: int  # on a trace without an OOM kill
    warnings: int


def score(path: Path) -> Score:
    """Replay one trace and score its warnings."""
    reader = TraceReader(str(path))
    analyzer = Analyzer.from_header(reader.header.targets, every_verdict=True)
    feed = feed_of(lambda: analyzer)
    warned: list[tuple[int, float, float, float]] = []  # (ts, seconds, low, high)
    kills: list[int] = []
    watched: set[int] = set()
    levels: list[tuple[int, int, int]] = []  # (ts, unreclaimable, limit) of watched cgroups
    for ev in reader:
        verdicts = analyzer.feed(ev)
        for line in feed.feed(ev, verdicts):
            if line.eta is not None:
                warned.append((line.ts, line.eta.seconds, line.eta.low_s, line.eta.high_s))
        if isinstance(ev, EffectiveLimit):
            watched.add(ev.cgroup_id)
        elif isinstance(ev, OomKill) and ev.memcg:
            kills.append(ev.ts)
        elif isinstance(ev, CgroupSample) and ev.cgroup_id in watched:
            lv = level_of(ev)
            if lv is not None:
                levels.append((ev.ts, lv.unreclaimable, ev.limit_bytes or 0))
    analyzer.finish()
    name = path.name.removesuffix(".trace.zst")
    out: list[Kill] = []
    before = 0
    for k in kills:
        run = [x for x in levels if before <= x[0] <= k]
        growth_s = 0.0
        if run:
            low = min(u for _, u, _ in run)
            floor = low + GROWTH_FLOOR * max(lim for _, _, lim in run)
            start = max((ts for ts, u, _ in run if u <= floor), default=run[0][0])
            growth_s = (k - start) / 1e9
        first = next((w for w in warned if before <= w[0] <= k), None)
        out.append(
            Kill(
                trace=name,
                growth_s=growth_s,
                lead_s=(k - first[0]) / 1e9 if first else None,
                predicted_s=first[1] if first else None,
                low_s=first[2] if first else None,
                high_s=first[3] if first else None,
            )
        )
        before = k
    return Score(
        trace=name,
        kills=out,
        false_warnings=0 if kills else len(warned),
        warnings=len(warned),
    )


def _f(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def table(scores: list[Score]) -> list[str]:
    lines = [
        "| trace | OOM kills | growth before the kill | first warning before it | "
        "its estimate (band) | error | false warnings |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in scores:
        if not s["kills"]:
            lines.append(f"| {s['trace']} | 0 | - | - | - | - | {s['false_warnings']} |")
        for k in s["kills"]:
            err = (
                k["predicted_s"] - k["lead_s"]
                if k["predicted_s"] is not None and k["lead_s"] is not None
                else None
            )
            band = f"{_f(k['low_s'])}-{_f(k['high_s'])} s" if k["low_s"] is not None else "-"
            lines.append(
                f"| {k['trace']} | 1 | {k['growth_s']:.1f} s | {_f(k['lead_s'])} s | "
                f"{_f(k['predicted_s'])} s ({band}) | {_f(err, '+.1f')} s | - |"
            )
    return lines


def summary(scores: list[Score]) -> dict[str, Any]:
    long = [k for s in scores for k in s["kills"] if k["growth_s"] >= GOAL_GROWTH_S]
    early = [k for k in long if k["lead_s"] is not None and k["lead_s"] >= GOAL_LEAD_S]
    return {
        "kills": sum(len(s["kills"]) for s in scores),
        "kills_growth_30s": len(long),
        "warned_10s_before": len(early),
        "false_warnings": sum(s["false_warnings"] for s in scores),
        "no_oom_traces": sum(1 for s in scores if not s["kills"]),
    }


HEADING = "## Time-to-limit warnings (eta): lead before each OOM kill, false warnings"


def run(opts: Options, tmp: Path, ctx: Context) -> Section:
    traces = sorted(DATA.glob("eta_*.trace.zst"))
    if not traces:
        return Section(
            f"{HEADING}\n\nfailed: no eta_*.trace.zst in {DATA}\n", {"error": "no traces"}
        )
    scores = [score(p) for p in traces]
    sm = summary(scores)
    text = [
        HEADING,
        "",
        *table(scores),
        "",
        f"{sm['warned_10s_before']} of the {sm['kills_growth_30s']} kills whose growth lasted "
        f"30 s or more were warned about 10 s or more before (goal: 90%); "
        f"{sm['false_warnings']} false warnings on {sm['no_oom_traces']} traces without an OOM "
        "kill (goal: 0).",
        *method_lines(
            [
                "traces: tests/data/eta_*.trace.zst, recorded by `whyrestart record` on the "
                "development machine (bench/eta_traces.py says how), replayed through the "
                "Analyzer and the tail's feed as `replay --warnings` does",
                "growth before a kill: from the last sample of the watched cgroup whose "
                "unreclaimable memory was within 5% of its limit above its lowest reading",
                "lead: the kill's time minus the first warning's; error: the warning's "
                "estimate minus that lead",
                "false warnings: every warning on a trace that ends without an OOM kill",
            ],
            opts,
        ),
        "",
    ]
    return Section("\n".join(text), {"scores": scores, "summary": sm})
