"""The raw numbers of one run, as --json keeps them: `Work` (what a workload reported) and
`Run` (one variant's run in a section). Plain dicts so that they go to JSON as they are; typed
so that a misspelt key is a mypy error, not a silent None in a table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict


class Work(TypedDict, total=False):
    # every workload
    pid: int  # the workload's own process
    per_s: float  # its throughput: what the slowdown compares
    wall_s: float
    start_ns: int  # CLOCK_BOOTTIME, the clock of whyrestart's trace
    end_ns: int
    cpu_s: float  # its own utime+stime (signals, reclaim)
    # fork/exit storm
    exits: int
    exits_per_s: float
    bad_status: int
    fork_retries: int
    codes: str
    fork: str  # how the storm made its children: "fork" or "vfork"
    # signal storm
    child: int
    sent: int
    acked: int
    rate: float
    # reclaim storm
    bytes: int
    passes: int
    cgroup: str
    cgroup_id: int
    failcnt: int | None
    max_usage: int | None


class Run(TypedDict, total=False):
    variant: str
    round: int
    mode: str  # overflow: "all" or "cgroup"
    codes: str  # soak: "mixed" or "zero"
    work: Work
    error: str
    note: str
    code: str  # fingerprint of the code measured
    # start-up (runner.start_tool, runner.first_event)
    markers_started: int
    visible_s: float | None
    first_marker: int
    start_to_first_event_s: float | None
    ready_lower_s: float
    first_marker_exit_ts_s: float
    # cost while the workload ran
    vmhwm_kb: int | None
    vmrss_kb: int | None
    cpu_storm_s: float | None
    bpf_progs: dict[str, dict[str, int]]
    bpf_ns_total: int
    # stopping (runner.stop_tool)
    stop_s: float
    tool_rc: int | None
    tool_killed: bool
    cpu_total_s: float
    ru_maxrss_kb: int
    stderr_tail: str
    # what the tool's output holds (tools.Variant.count)
    seen: int  # the events this section counts
    lost: int  # what the tool says it lost
    lost_lines: list[str]  # peers: their lost-event warnings
    reclaim_ns: int  # bpftrace reclaim: summed durations
    storm_exits_seen: int  # whyrestart: from its trace
    storm_forks_seen: int
    storm_self_exit_seen: int
    signals_seen: int
    signals_counted: int  # whyrestart: SIGUSR1s the kernel counted instead of recording
    reclaims_by_cgroup: dict[str, int]
    stall_records: int
    lost_records_sum: int
    footer: bool
    footer_counts: dict[str, int] | None
    footer_warnings: list[str] | None
    trace_warnings: list[str]
    exit_records: int
    records: int
    # overflow
    cgroup: str
    stopped_at_s: float
    expected: int
    seen_events: int
    missing: int
    all_counted: bool
    # soak
    start_rss_kb: int | None
    samples: list[tuple[float, int | None, float | None]]  # (s, VmRSS kB, CPU s)
    rss_first_mib: float
    rss_25pct_mib: float
    rss_last_mib: float
    rss_max_mib: float
    growth_25pct_to_end_mib: float
    slope_second_half_mib_per_min: float
    flat: bool
    tracer_cpu_pct: float


Summary = dict[str, Any]  # one variant's figures in a section's table, for --json


@dataclass
class Section:
    """A section's result: its markdown (table, then how it was measured) and its raw numbers
    for --json (``data``: runs, summaries, whatever the section keeps)."""

    text: str
    data: dict[str, Any] = field(default_factory=dict)


# What `python -m bench.pyside` prints (one JSON object per command).


class DecodeResult(TypedDict):
    records: int
    record_bytes: int
    repeat: int
    decoded: int
    best_s: float
    median_s: float
    events_per_s_best: float
    events_per_s_median: float
    build_s: float
    maxrss_mib: float
    python: str


class GenResult(TypedDict):
    path: str
    events: int
    kinds: dict[str, int]
    bytes: int
    build_s: float
    write_s: float
    write_events_per_s: float


class ReadResult(TypedDict):
    events: int
    seconds: float
    events_per_s: float
    footer: bool
    warnings: list[str]
    maxrss_mib: float
