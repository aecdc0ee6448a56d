"""The one clock: CLOCK_BOOTTIME nanoseconds, what bpf_ktime_get_boot_ns() reads in the kernel.

Every event and sample is stamped with it, so kernel events, samplers, probes and runtime
answers line up; wall-clock time appears only when a trace is displayed (header offset).

Facts read after the fact (``whyrestart postmortem``) come on other clocks: runtimes stamp
exits in wall-clock time (RFC 3339 text), the kernel log on ``local_clock()`` (CLOCK_MONOTONIC,
near enough), systemd in CLOCK_MONOTONIC microseconds. The offsets that bring them onto
CLOCK_BOOTTIME are read here (``realtime_offset_ns``, ``monotonic_offset_ns``); the conversions
themselves are pure (``wall_to_boottime``, ``parse_rfc3339_ns``) and tested without a clock.
"""

from __future__ import annotations

import calendar
import datetime
import re
import time


def boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def _offset(other: int) -> int:
    """``other`` clock minus CLOCK_BOOTTIME, in ns. Sampled as BOOTTIME, other, BOOTTIME a few
    times; the tightest bracket wins, so a preemption between the reads does not skew it."""
    best_width: int | None = None
    best = 0
    for _ in range(3):
        b1 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        o = time.clock_gettime_ns(other)
        b2 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        if best_width is None or b2 - b1 < best_width:
            best_width = b2 - b1
            best = o - (b1 + b2) // 2
    return best


def realtime_offset_ns() -> int:
    """CLOCK_REALTIME minus CLOCK_BOOTTIME now (a trace header's ``clock_offset_ns``)."""
    return _offset(time.CLOCK_REALTIME)


def monotonic_offset_ns() -> int:
    """CLOCK_MONOTONIC minus CLOCK_BOOTTIME now: minus the time the machine spent suspended."""
    return _offset(time.CLOCK_MONOTONIC)


def wall_time(ts: int, realtime_offset: int) -> datetime.datetime:
    """A CLOCK_BOOTTIME timestamp as wall-clock time (UTC), through an offset such as a trace
    header's ``clock_offset_ns``: the one conversion every display of wall-clock time uses."""
    return datetime.datetime.fromtimestamp((ts + realtime_offset) / 1e9, tz=datetime.UTC)


def wall_to_boottime(wall_ns: int, realtime_offset: int) -> int:
    """A wall-clock time (ns since the epoch) on CLOCK_BOOTTIME, through the offset taken now.

    Exact unless the wall clock was stepped (NTP, a manual change) between that time and now:
    the offset is today's, and a step moves every earlier wall-clock stamp by its size.
    """
    return wall_ns - realtime_offset


def monotonic_to_boottime(mono_ns: int, monotonic_offset: int) -> int:
    """A CLOCK_MONOTONIC time on CLOCK_BOOTTIME, through the offset taken now (exact for
    anything after the last suspend; earlier stamps come out early by the suspended time)."""
    return mono_ns - monotonic_offset


# 2026-12-01T14:44:54.891627013Z, 2026-12-01T14:44:54+01:00, 2026-12-01 14:44:54.8 +0000 UTC
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\d*"
    r"\s*(?:(Z)|([+-])(\d{2}):?(\d{2}))?",
    re.ASCII,
)


def parse_rfc3339_ns(text: str) -> int | None:
    """RFC 3339 text (podman's and Docker's ``StartedAt``/``FinishedAt``, nanosecond digits
    kept) → ns since the epoch; None for anything else, for Go's zero time (year 1: "never")
    and for text without a zone (it would be a guess)."""
    m = _RFC3339.match(text.strip())
    if m is None:
        return None
    year, month, day, hour, minute, sec = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    if year < 1970:
        return None
    if m.group(8) is None and m.group(9) is None:
        return None
    try:
        secs = calendar.timegm((year, month, day, hour, minute, sec, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    frac = (m.group(7) or "").ljust(9, "0")
    if m.group(9) is not None:
        zone = (int(m.group(10)) * 60 + int(m.group(11))) * 60
        secs -= zone if m.group(9) == "+" else -zone
    return secs * 1_000_000_000 + int(frac or "0")
