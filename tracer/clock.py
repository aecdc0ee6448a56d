"""The one clock: CLOCK_BOOTTIME nanoseconds, what bpf_ktime_get_boot_ns() reads in the kernel.

Every event and sample is stamped with it, so kernel events, samplers, probes and runtime
answers line up; wall-clock time appears only when a trace is displayed (header offset).
"""

from __future__ import annotations

import time


def boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)
