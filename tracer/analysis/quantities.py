"""Bytes and durations as the verdicts, the tail and the reports print them, and the
quantities more than one command prints, each defined once. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracer.events import ReclaimSummary

# What counts as stall time: reclaim and memory.high throttling a task waited in (kswapd's
# background reclaim is nobody's stall).
STALL_KINDS = ("memcg", "direct", "high")


def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value} B"  # pragma: no cover


def fmt_duration(ns: int) -> str:
    if ns < 1_000_000:
        return f"{ns / 1e3:.0f} us"
    return f"{ns / 1e6:.0f} ms" if ns < 1_000_000_000 else f"{ns / 1e9:.1f} s"


def fmt_offset(seconds: float) -> str:
    """Seconds since the start of a recording, signed: "+1.250s", or "-0.008s" for an event
    stamped before the start (a kernel log line, a sample), never "+-0.008s"."""
    return f"{seconds:+.3f}s"


def stall_total_ns(
    summaries: Iterable[ReclaimSummary], start: int, end: int, kinds: Iterable[str] = STALL_KINDS
) -> int:
    """Stall time: the kernel's reclaim summaries whose interval ``[ts - interval_ns, ts]``
    overlaps ``[start, end]``, each counted whole. A summary is the finest grain recorded;
    prorating it over its interval would invent when its stalls happened (a kill at 40% of an
    interval would count 40% of stalls that all came before it). The one definition behind a
    verdict's stall time, repro's stall column and the trace's summary records."""
    wanted = set(kinds)
    return sum(
        s.total_ns
        for s in summaries
        if s.kind in wanted and s.ts - s.interval_ns <= end and s.ts >= start
    )
