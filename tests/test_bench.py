"""Tier 1 (pure): the benchmark's own logic, without running it (tests/test_bench_root.py runs it).

How each tool's output is counted (whyrestart's trace through the project's reader, the peers'
text columns), the command line, and the round-by-round slowdown.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.options import SECTIONS, parse_args
from bench.records import Run, Summary, Work
from bench.report import median_run, rss_growth, slowdown, usable_variants
from bench.tools import Bpftrace, Exitsnoop, Sigsnoop, Whyrestart
from tracer.errors import TraceFileError
from tracer.events import Event, Exit, Fork, Lost, ReclaimSummary, Signal
from tracer.trace.format import TraceHeader
from tracer.trace.writer import TraceWriter

HEADER = TraceHeader(
    tool_version="0.1.0",
    host="bench-test",
    kernel="6.18.0",
    cgroup={"mode": "hybrid", "memory_root": "/sys/fs/cgroup/memory", "memory_version": 1},
    clock_offset_ns=1_700_000_000_000_000_000,
    hooks={"exit": "tp_btf", "signal": "tp_btf", "fork": "tp_btf"},
    targets={"pids": [], "cgroups": [], "all": True, "command": []},
    started_ns=1_000,
)
STORM_PID, CHILD_PID = 500, 501


def _exit(ts: int, pid: int, comm: str) -> Exit:
    return Exit(ts=ts, pid=pid, ppid=STORM_PID, comm=comm, cgroup_id=9, status=0, start_ns=1)


def _signal(ts: int, sig: int, target: int) -> Signal:
    return Signal(
        ts=ts,
        sender_pid=STORM_PID,
        sender_tid=STORM_PID,
        sender_comm="wr-sigstorm",
        sender_cgroup_id=9,
        target_pid=target,
        target_comm="wr-sigstorm",
        sig=sig,
        si_code=0,
        result=0,
        group=True,
    )


def _reclaim(ts: int, cgroup_id: int, kind: str, count: int) -> ReclaimSummary:
    return ReclaimSummary(
        ts=ts,
        cgroup_id=cgroup_id,
        kind=kind,
        count=count,
        total_ns=1,
        max_ns=1,
        reclaimed_bytes=0,
        interval_ns=1,
    )


EVENTS: list[Event] = [
    _exit(2_000, 601, "wrmk00003"),
    _exit(2_100, 602, "wrmk00005"),
    _exit(2_200, 603, "wrmk00004"),
    Fork(ts=3_000, parent_pid=STORM_PID, child_pid=700, comm="wr-storm", cgroup_id=9),
    Fork(ts=3_001, parent_pid=STORM_PID, child_pid=701, comm="wr-storm", cgroup_id=9),
    Fork(ts=3_002, parent_pid=7, child_pid=702, comm="bash", cgroup_id=9),
    _exit(3_100, 700, "wr-storm"),
    _exit(3_101, 701, "wr-storm"),
    _exit(3_102, 702, "wr-storm"),  # not the storm's child, but every wr-storm exit counts
    _exit(3_103, 703, "bash"),
    Lost(ts=3_200, count=5),
    _signal(3_300, 10, CHILD_PID),
    _signal(3_301, 10, CHILD_PID),
    _signal(3_302, 10, 999),  # to another process
    _signal(3_303, 15, CHILD_PID),  # another signal
    _reclaim(3_400, 77, "memcg", 4),
    _reclaim(3_401, 77, "memcg", 6),
    _reclaim(3_402, 78, "memcg", 100),  # another cgroup
    _reclaim(3_403, 77, "kswapd", 50),
    Lost(ts=3_500, count=2),
    _exit(3_600, STORM_PID, "wr-storm"),  # the storm process itself
]


def _trace(tmp: Path, footer: bool = True) -> Path:
    path = tmp / "wr.trace"
    w = TraceWriter.open(path, HEADER, overwrite=True)
    w.write_many(EVENTS)
    if footer:
        w.close(w.make_footer("interrupted", ended_ns=4_000))
    else:
        w.flush()  # a recorder killed before its footer: the trace ends at its last event
    return path


def _count(tmp: Path, section: str, work: Work) -> tuple[Run, dict[int, int]]:
    return Whyrestart(parse_args([]), section).count(tmp, work)


def test_whyrestart_trace_counted_with_the_project_reader(tmp_path: Path) -> None:
    _trace(tmp_path)
    run, markers = _count(tmp_path, "storm", {"pid": STORM_PID})
    assert run["seen"] == 3  # the storm's own exit is not one of its children's
    assert run["storm_exits_seen"] == 3
    assert run["storm_self_exit_seen"] == 1
    assert run["storm_forks_seen"] == 2
    assert run["exit_records"] == 8
    assert run["records"] == len(EVENTS)
    assert markers == {3: 2_000, 4: 2_200, 5: 2_100}
    assert run["lost"] == 7 and run["lost_records_sum"] == 7
    assert run["footer"] is True
    assert run["footer_counts"] == {"exit": 8, "fork": 3, "lost": 2, "signal": 4, "reclaim": 4}
    assert run["stall_records"] == 0


def test_signals_and_reclaim_sections_count_their_own_events(tmp_path: Path) -> None:
    _trace(tmp_path)
    sig, _ = _count(tmp_path, "signals", {"pid": STORM_PID, "child": CHILD_PID})
    assert sig["seen"] == 2  # SIGUSR1 from the storm to its child only
    rec, _ = _count(tmp_path, "reclaim", {"pid": STORM_PID, "cgroup_id": 77})
    assert rec["seen"] == 10  # memcg summaries of the run's cgroup only
    assert rec["reclaims_by_cgroup"] == {"77": 10, "78": 100}


def test_a_trace_without_footer_counts_lost_records_and_says_so(tmp_path: Path) -> None:
    _trace(tmp_path, footer=False)
    run, _ = _count(tmp_path, "storm", {"pid": STORM_PID})
    assert run["footer"] is False
    assert run["lost"] == 7  # from the lost records, there being no footer total
    assert run["seen"] == 3
    assert any("footer" in w for w in run["trace_warnings"]), run["trace_warnings"]


def test_a_damaged_trace_fails_the_run_instead_of_being_half_counted(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = b'{"t":"exit","pid":"not a number"}\n'
    path.write_bytes(b"".join(lines))
    with pytest.raises(TraceFileError, match="line 4"):
        _count(tmp_path, "storm", {"pid": STORM_PID})


def test_peers_text_output_counted_by_columns(tmp_path: Path) -> None:
    opts = parse_args([])
    (tmp_path / "tool.stdout").write_bytes(
        b"PCOMM            PID    PPID   TID    AGE(s)  EXIT_CODE\n"
        b"wrmk00002        601    600    601    0.00    0\n"
        b"wr-storm         700    500    700    0.00    0\n"
        b"wr-storm         701    500    701    0.00    1\n"
        b"wr-storm         500    1      500    2.00    0\n"
        b"bash             702    7      702    0.00    0\n"
    )
    (tmp_path / "tool.stderr").write_bytes(b"lost 12 events on CPU #0\n")
    run, markers = Exitsnoop(opts, "storm").count(tmp_path, {"pid": STORM_PID})
    assert (run["seen"], run["lost"], markers) == (2, 12, {2: 0})

    (tmp_path / "tool.stdout").write_bytes(
        b"Attaching 1 probe...\n601 wrmk00007\n700 wr-storm\nLost 3 events\n500 wr-storm\n"
    )
    (tmp_path / "tool.stderr").write_bytes(b"")
    run, markers = Bpftrace(opts, "storm").count(tmp_path, {"pid": STORM_PID})
    assert (run["seen"], run["lost"], markers) == (1, 3, {7: 0})

    (tmp_path / "tool.stdout").write_bytes(
        b"TIME     PID     COMM             SIG  TPID    RESULT\n"
        b"10:00:00 500     wr-sigstorm      10   501     0\n"
        b"10:00:00 500     wr-sigstorm      10   501     0\n"
        b"10:00:00 500     wr-sigstorm      17   501     0\n"
        b"10:00:00 601     wrmk00001        10   601     0\n"
    )
    run, markers = Sigsnoop(opts, "signals").count(tmp_path, {"pid": STORM_PID, "child": 501})
    assert (run["seen"], run["lost"], markers) == (2, 0, {1: 0})


def test_slowdown_is_the_median_of_same_round_ratios() -> None:
    def run(variant: str, rnd: int, per_s: float) -> Run:
        return {"variant": variant, "round": rnd, "work": {"per_s": per_s}}

    runs = [run("bare", 0, 100), run("bare", 1, 200), run("bare", 2, 100)]
    tool = [run("x", 0, 50), run("x", 1, 100), run("x", 2, 80)]
    assert slowdown(runs + tool, tool) == 2.0  # ratios 2.0, 2.0, 1.25
    assert slowdown(tool, tool) is None  # no bare run: no slowdown
    assert median_run([3.0, 1.0, 2.0, 4.0], float) == 2.0  # the lower middle one


def test_a_skipped_or_failed_variant_gets_its_row_and_summary_only() -> None:
    runs: list[Run] = [
        {"variant": "bare", "round": 1, "work": {"per_s": 10.0}},
        {"variant": "bpftrace", "round": 1, "error": "bpftrace died"},
    ]
    lines: list[str] = []
    summary: dict[str, Summary] = {}
    skipped = {"exitsnoop": "not installed"}
    variants = ["bare", "bpftrace", "exitsnoop", "whyrestart"]
    got = list(usable_variants(variants, runs, skipped, lines, summary, 4))
    assert got == [("bare", [runs[0]], [])]
    assert lines == [
        "| bpftrace | failed: bpftrace died | | |",
        "| exitsnoop | not installed | | |",
        "| whyrestart | failed: no run | | |",
    ]
    assert summary == {
        "bpftrace": {"failed": ["bpftrace died"]},
        "exitsnoop": {"skipped": "not installed"},
        "whyrestart": {"failed": []},
    }


def test_command_line() -> None:
    quick = parse_args(["--quick", "replay", "storm"])
    assert quick.sections == ["storm", "replay"]  # always in the report's order
    assert (quick.rounds, quick.seconds, quick.replay_events) == (1, 1.0, 100_000)
    assert parse_args([]).sections == list(SECTIONS)
    assert parse_args(["--only", "bare, whyrestart"]).only == ["bare", "whyrestart"]
    for bad in (["nosuch"], ["--only", "strace"], ["--rounds", "0"], ["--overflow-stop", "20"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_rss_growth_sums_up_a_series_from_its_first_quarter() -> None:
    # growth is measured from the 25% sample (after warm-up), the slope over the second half
    g = rss_growth([(0.0, 10.0), (60.0, 10.0), (120.0, 11.0), (180.0, 12.5)])
    assert g["slope_second_half_mib_per_min"] == pytest.approx(1.5)
    g.pop("slope_second_half_mib_per_min")
    assert g == {
        "rss_first_mib": 10.0,
        "rss_25pct_mib": 10.0,
        "rss_last_mib": 12.5,
        "rss_max_mib": 12.5,
        "growth_25pct_to_end_mib": 2.5,
        "flat": False,
    }
