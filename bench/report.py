"""What the section tables are made of: medians, cells, slowdowns, notes, method lines."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from bench.options import Options
from bench.records import Run, Summary

T = TypeVar("T")


def med(xs: Sequence[float | None]) -> float | None:
    ys = [x for x in xs if x is not None]
    return statistics.median(ys) if ys else None


def fmt(x: float | None, spec: str, none: str = "n/a") -> str:
    return none if x is None else format(x, spec)


def slow_str(slow: float | None) -> str:
    return f"{slow:.2f}x ({(slow - 1) * 100:+.0f}%)" if slow else "n/a (no bare run)"


def ok_runs(runs: list[Run], v: str) -> tuple[list[Run], list[str]]:
    mine = [r for r in runs if r["variant"] == v]
    return (
        [r for r in mine if "work" in r and "error" not in r],
        [r["error"] for r in mine if "error" in r],
    )


def usable_variants(
    variants: Sequence[str],
    runs: list[Run],
    skipped: dict[str, str],
    lines: list[str],
    summary: dict[str, Summary],
    columns: int,
) -> Iterator[tuple[str, list[Run], list[str]]]:
    """Each variant with runs that worked, with them and the errors of the others. A variant
    that was skipped, or whose every run failed, gets its table row here (the reason, then
    empty cells up to ``columns``) and its summary, and is not yielded."""
    for v in variants:
        if v in skipped:
            reason: str = skipped[v]
            summary[v] = {"skipped": reason}
        else:
            ok, errs = ok_runs(runs, v)
            if ok:
                yield v, ok, errs
                continue
            reason = f"failed: {(errs or ['no run'])[0][:80]}"
            summary[v] = {"failed": errs}
        lines.append(f"| {v} | {reason} |" + " |" * (columns - 2))


def slowdown(runs: list[Run], ok: list[Run]) -> float | None:
    """Median over rounds of bare's throughput over the variant's, same round."""
    bare = {r["round"]: r["work"]["per_s"] for r in runs if r["variant"] == "bare" and "work" in r}
    return med([bare[r["round"]] / r["work"]["per_s"] for r in ok if r["round"] in bare])


def vmhwm_mib(r: Run) -> float | None:
    kb = r.get("vmhwm_kb")
    return kb / 1024 if kb else None


def tool_notes(opts: Options, v: str, ok: list[Run], errs: list[str]) -> str:
    notes = []
    if v == "whyrestart":
        nofoot = sum(1 for r in ok if not r.get("footer"))
        if nofoot:
            notes.append(f"{nofoot} trace(s) without footer")
        warns = {w for r in ok for w in (r.get("footer_warnings") or [])}
        notes.extend(sorted(warns)[:3])
    killed = sum(1 for r in ok if r.get("tool_killed"))
    if killed:
        notes.append(f"killed after {opts.stop_timeout}s in {killed} run(s)")
    invisible = sum(1 for r in ok if r.get("visible_s") is None)
    if invisible:
        notes.append(f"no marker visible before stop in {invisible} run(s)")
    if errs:
        notes.append(f"{len(errs)} failed run(s): {errs[0][:120]}")
    return "; ".join(notes)


def method_lines(items: list[str], opts: Options, **kw: Any) -> list[str]:
    """The method paragraph: ``items`` are format strings that name the bench's options by
    their own names (``{storm_cpu}``, ``{soak_seconds:g}``) and what the section worked out
    (``kw``, which wins over an option of the same name)."""
    names = {**vars(opts), **kw}
    return ["", "How each number was measured:", ""] + [f"- {x.format_map(names)}" for x in items]


def median_run(runs: list[T], key: Callable[[T], float]) -> T:
    """The run whose ``key(run)`` is the median (the lower middle one for an even count)."""
    ordered = sorted(runs, key=key)
    return ordered[(len(ordered) - 1) // 2]


def rss_growth(rss: list[tuple[float, float]]) -> Run:
    """An RSS series (seconds, MiB; not empty) summed up: first, at 25% (after warm-up), last,
    max, growth from 25% to the end, the least-squares slope over the second half (MiB per
    minute) and whether it is flat (|growth| <= 2 MB and |slope| <= 1 MB/min)."""
    q = rss[len(rss) // 4][1]
    half = rss[len(rss) // 2 :]
    slope = lin_slope(half) * 60 if len(half) >= 2 else 0.0
    return {
        "rss_first_mib": rss[0][1],
        "rss_25pct_mib": q,
        "rss_last_mib": rss[-1][1],
        "rss_max_mib": max(x for _, x in rss),
        "growth_25pct_to_end_mib": rss[-1][1] - q,
        "slope_second_half_mib_per_min": slope,
        "flat": abs(rss[-1][1] - q) <= 2.0 and abs(slope) <= 1.0,
    }


def lin_slope(points: list[tuple[float, float]]) -> float:
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return sum((t - mx) * (y - my) for t, y in points) / den if den else 0.0
