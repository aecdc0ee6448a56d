"""Bytes and durations as the verdicts, the tail and the reports print them. Pure."""

from __future__ import annotations


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
