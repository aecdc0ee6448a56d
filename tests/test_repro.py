"""``whyrestart repro``: option parsing, judging a run, the comparison (tier 1), and a real
experiment under two memory limits (tier 3, root: real OOM kills in child memory cgroups; every
run has a limit, so the host is never at risk)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from click.testing import CliRunner

from tracer.analysis.analyzer import Verdict
from tracer.analysis.thrash import Thrash
from tracer.cli import main
from tracer.errors import UsageError
from tracer.events import ProbeSample
from tracer.parse.values import parse_size
from tracer.repro import (
    DEGRADED,
    FAILED,
    KILLED,
    MEMORY_HIGH,
    MEMORY_MAX,
    PROBE_TIMEOUT,
    SURVIVED,
    Comparison,
    Experiment,
    Options,
    Plan,
    RunResult,
    Setting,
    counted_probes,
    deciding_verdict,
    degradation,
    in_cgroup,
    judge,
    make_plan,
)

MiB = 1024 * 1024

# Allocates (and touches) ~100 MiB, then exits 0.
HOG = (
    "import time\n"
    "chunks = []\n"
    "for _ in range(100):\n"
    "    chunks.append(b'x' * (1 << 20))\n"
    "    time.sleep(0.002)\n"
    "print('allocated', len(chunks), 'MiB')\n"
)


# -- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64M", 64 * MiB),
        ("64m", 64 * MiB),
        ("512Mi", 512 * MiB),
        ("1G", 1024 * MiB),
        ("1.5G", 1536 * MiB),
        ("2GiB", 2048 * MiB),
        ("4k", 4096),
        ("67108864", 64 * MiB),
        (" 32M ", 32 * MiB),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "-1M", "0", "12X", "1.5", "ten", "1e6"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_size(text)


def _plan(memory_version: int | None = 1, **kw: Any) -> Plan:
    args: dict[str, Any] = {"command": ["true"], "out_dir": "out"}
    args.update(kw)
    return make_plan(Options(**args), memory_version=memory_version)


def test_plan_varies_the_listed_setting() -> None:
    p = _plan(memory_max="32M,256M")
    assert p.kind == MEMORY_MAX
    assert p.settings == [Setting("32M", 32 * MiB), Setting("256M", 256 * MiB)]
    assert [(s.text, r) for s, r in p.runs()] == [("32M", 1), ("256M", 1)]
    p = _plan(memory_max="1G", memory_high="256M,512M", memory_version=2, repeats=2)
    assert p.kind == MEMORY_HIGH and p.memory_max == 1024 * MiB
    assert len(p.runs()) == 4
    p = _plan(probe_timeout="500ms,2s", probe="tcp://127.0.0.1:9", memory_max="1G")
    assert p.kind == PROBE_TIMEOUT
    assert [s.value for s in p.settings] == [0.5, 2.0]
    assert p.fixed()["memory_max_bytes"] == 1024 * MiB


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({}, "nothing to vary"),
        ({"memory_max": "1G", "command": []}, "no command"),
        ({"memory_high": "1G,2G"}, "needs cgroup v2"),
        ({"memory_max": "1G,2G", "memory_high": "1G,2G", "memory_version": 2}, "both list"),
        ({"memory_max": "1G", "memory_high": "2G", "memory_version": 2}, "which one varies"),
        ({"probe_timeout": "1,2"}, "needs --probe"),
        ({"memory_max": "1G,,2G"}, "empty value"),
        ({"memory_max": "1G", "repeats": 0}, "--runs"),
        ({"memory_max": "1G", "probe_interval": "1"}, "need --probe"),
        ({"memory_max": "1G", "memory_version": None}, "memory controller"),
    ],
)
def test_plan_errors(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(UsageError) as info:
        _plan(**kw)
    assert needle in str(info.value)


def test_cli_usage_error_is_friendly() -> None:
    r = CliRunner().invoke(main, ["repro", "--memory-max", "1G,1X", "--", "true"])
    assert r.exit_code == 2
    assert "bad size '1X'" in r.stderr and "Traceback" not in r.stderr


def test_in_cgroup_moves_then_execs() -> None:
    argv = in_cgroup("/sys/fs/cgroup/memory/x/cgroup.procs", ["python3", "-c", "print(1)"])
    assert argv[:2] == ["sh", "-c"]
    assert argv[2] == 'echo $$ > "/sys/fs/cgroup/memory/x/cgroup.procs" && exec "$@" >&2'
    assert argv[3:] == ["sh", "python3", "-c", "print(1)"]


# -- judging ----------------------------------------------------------------------------------


def _v(
    pid: int, cause: str, main: bool = True, code: int | None = None, sig: str | None = None
) -> Verdict:
    return Verdict(
        ts=pid, pid=pid, comm="c", cause=cause, confidence="high", summary="s", advice="",
        evidence=(), main=main, exit_code=code, signal=sig,
    )  # fmt: skip


def test_judge() -> None:
    oom = _v(2, "cgroup_oom", main=False, sig="SIGKILL")
    ok = _v(1, "app_exit", code=0)
    assert deciding_verdict([ok, oom]) is oom  # a kill anywhere in the workload decides
    assert judge([ok, oom], 0, False) == (KILLED, oom)
    assert judge([ok], 0, False) == (SURVIVED, ok)
    assert judge([_v(1, "app_exit", code=3)], 3, False)[0] == "failed"
    assert judge([_v(1, "app_exit", sig="SIGSEGV")], 139, False)[0] == "failed"
    assert judge([], None, False) == (SURVIVED, None)  # still running when --duration ended it
    assert judge([], None, True)[0] == KILLED  # the liveness check killed it


def _run(
    n: int, text: str, value: int, outcome: str, peak: int | None, cause: str, code: int = 0
) -> RunResult:
    r = RunResult(run=n, setting=Setting(text, value), repeat=1, trace=f"run{n}.trace")
    r.outcome = outcome
    r.peak_bytes = peak
    r.verdict = _v(n, cause, code=code if cause == "app_exit" else None)
    if outcome == KILLED:
        r.time_to_kill_s = 0.5
    return r


def _comparison(*runs: RunResult, kind: str = MEMORY_MAX, cgroup_version: int = 1) -> Comparison:
    """A comparison of ``runs`` (the plan's settings are theirs), under parent cgroup /p."""
    plan = Plan(kind=kind, settings=[r.setting for r in runs], command=["x"], out_dir="d")
    return Comparison(plan, list(runs), cgroup_version=cgroup_version, parent_cgroup="/p")


def test_comparison_table_and_json() -> None:
    c = _comparison(
        _run(1, "32M", 32 * MiB, KILLED, 32 * MiB, "cgroup_oom"),
        _run(2, "256M", 256 * MiB, SURVIVED, 100 * MiB, "app_exit"),
        _run(3, "1G", 1024 * MiB, SURVIVED, 101 * MiB, "app_exit"),
        cgroup_version=2,
    )
    c.check_monotonic()
    assert c.warnings == []
    table = c.table()
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["memory.max", "run", "outcome", "verdict"]
    assert lines[2].split()[:4] == ["32M", "1/1", "killed", "cgroup_oom"]
    assert "smallest memory.max that survived: 256M (peak 100.0 MiB, headroom 156.0 MiB = 61%" in (
        table
    )
    doc = orjson.loads(orjson.dumps(c.to_json()))
    assert doc["schema"] == 1 and doc["setting"] == "memory_max"
    # the shape documented in tracer/outputs/__init__.py
    assert set(doc) == {
        "schema", "kind", "setting", "fixed", "command", "cgroup_version", "parent_cgroup",
        "out_dir", "interrupted", "runs", "smallest_surviving", "conclusion", "warnings",
    }  # fmt: skip
    assert set(doc["runs"][0]) == {
        "run", "setting", "value", "repeat", "trace", "outcome", "survived", "exit_status",
        "cause", "verdict", "peak_bytes", "time_to_kill_s", "duration_s", "stall_s", "probes",
        "probe_failures", "max_probe_latency_s", "liveness_kill", "thrash", "degraded", "error",
    }  # fmt: skip
    assert [r["outcome"] for r in doc["runs"]] == ["killed", "survived", "survived"]
    assert doc["runs"][0]["cause"] == "cgroup_oom" and doc["runs"][0]["time_to_kill_s"] == 0.5
    assert doc["smallest_surviving"] == {
        "setting": "256M",
        "value": 256 * MiB,
        "headroom": 156 * MiB,
        "headroom_pct": 60.9,
    }


def test_comparison_flags_noisy_runs() -> None:
    c = _comparison(
        _run(1, "64M", 64 * MiB, SURVIVED, 60 * MiB, "app_exit"),
        _run(2, "128M", 128 * MiB, KILLED, 128 * MiB, "cgroup_oom"),
    )
    c.check_monotonic()
    assert len(c.warnings) == 1 and "128M did not survive although 64M did" in c.warnings[0]
    assert "smallest memory.limit_in_bytes that survived: 64M" in c.table()
    empty = _comparison(c.runs[1])
    assert "no memory.limit_in_bytes survived every run" in empty.table()
    assert empty.to_json()["smallest_surviving"] is None


# -- a real experiment (root) -----------------------------------------------------------------


@pytest.mark.root
def test_memory_max_experiment(tmp_path: Path) -> None:
    """32M kills the ~100 MiB hog (a real cgroup OOM), 256M lets it finish: the comparison says
    256M is the smallest limit that survived."""
    from tracer.sources.cgroupfs import CgroupLayout

    lines: list[str] = []
    plan = _plan(
        memory_max="32M,256M",
        command=[sys.executable, "-c", HOG],
        out_dir=str(tmp_path / "runs"),
        memory_version=CgroupLayout.from_system().memory_version,
    )
    comparison = Experiment(plan, lines.append).run()
    small, large = comparison.runs
    assert (small.setting.text, small.outcome) == ("32M", KILLED)
    assert small.verdict is not None and small.verdict.cause == "cgroup_oom"
    assert small.verdict.limit_bytes == 32 * MiB
    assert small.exit_status == 137
    assert small.time_to_kill_s is not None and small.time_to_kill_s > 0
    assert small.peak_bytes is not None and small.peak_bytes <= 32 * MiB
    assert (large.setting.text, large.outcome, large.exit_status) == ("256M", SURVIVED, 0)
    assert large.verdict is not None
    assert (large.verdict.cause, large.verdict.exit_code) == ("app_exit", 0)
    assert large.peak_bytes is not None and 100 * MiB < large.peak_bytes < 256 * MiB
    # each run has its own trace, and replaying it gives the same verdict
    assert sorted(os.listdir(tmp_path / "runs")) == [
        "run01-memory_max-32M.trace",
        "run02-memory_max-256M.trace",
    ]
    r = CliRunner().invoke(main, ["explain", "--json", small.trace])
    assert [v["cause"] for v in orjson.loads(r.stdout)["verdicts"]] == ["cgroup_oom"]
    # progress while it ran
    assert any("run 1/2" in line and "recording to" in line for line in lines)
    assert any("run 2/2" in line and "survived" in line for line in lines)
    table = comparison.table()
    assert "smallest memory.limit_in_bytes that survived: 256M" in table
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:4]}
    assert rows["32M"][2:4] == ["killed", "cgroup_oom"]
    assert rows["256M"][2:4] == ["survived", "app_exit"]
    assert comparison.to_json()["smallest_surviving"]["setting"] == "256M"


def repro_json(tmp_path: Path, memory_max: str, script: str) -> tuple[dict[str, Any], str]:
    """``repro --memory-max MEMORY_MAX --json -- python -c SCRIPT`` (root): its JSON document
    and its standard error."""
    out = tmp_path / "runs"
    r = CliRunner().invoke(
        main,
        ["repro", "--memory-max", memory_max, "--out-dir", str(out), "--json", "--",
         sys.executable, "-c", script],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    return orjson.loads(r.stdout), r.stderr


@pytest.mark.root
def test_cli_json(tmp_path: Path) -> None:
    # the workload's own output goes to stderr, not into the JSON
    doc, stderr = repro_json(tmp_path, "48M,256M", HOG)
    assert doc["schema"] == 1 and doc["cgroup_version"] in (1, 2)
    assert [(x["setting"], x["outcome"], x["cause"]) for x in doc["runs"]] == [
        ("48M", "killed", "cgroup_oom"),
        ("256M", "survived", "app_exit"),
    ]
    assert doc["smallest_surviving"]["setting"] == "256M"
    assert 0 < doc["smallest_surviving"]["headroom_pct"] < 100
    assert "repro: run 2/2" in stderr


@pytest.mark.root
def test_probe_results_are_in_the_runs_trace_which_replays_to_the_printed_verdict(
    tmp_path: Path,
) -> None:
    """A probe that always fails (nothing listens on port 1) makes repro kill a workload that
    would otherwise sleep: every probe result is in the run's trace, and replaying the trace
    judges the run's deciding process exactly as repro printed it."""
    from tracer.events import ProbeSample
    from tracer.sources.cgroupfs import CgroupLayout
    from tracer.trace.reader import read_trace

    plan = _plan(
        memory_max="256M",
        probe="tcp://127.0.0.1:1",
        probe_interval="100ms",
        probe_failures=2,
        duration=30.0,
        command=[sys.executable, "-c", "import time; time.sleep(60)"],
        out_dir=str(tmp_path / "runs"),
        memory_version=CgroupLayout.from_system().memory_version,
    )
    (run,) = Experiment(plan).run().runs
    assert (run.outcome, run.liveness_kill) == (KILLED, True)
    probes = [ev for ev in read_trace(run.trace).events if isinstance(ev, ProbeSample)]
    assert len(probes) == run.probes >= 2
    assert run.probe_failures == len(probes)  # nothing listens: every probe failed
    assert {p.target for p in probes} == {"tcp://127.0.0.1:1"}
    printed = run.to_json()["verdict"]
    assert printed is not None
    r = CliRunner().invoke(main, ["explain", "--json", run.trace])
    assert r.exit_code == 0, r.stderr
    replayed = [v for v in orjson.loads(r.stdout)["verdicts"] if v["pid"] == printed["pid"]]
    assert [
        {k: v[k] for k in ("pid", "comm", "cause", "confidence", "summary", "advice")}
        for v in replayed
    ] == [printed]


# -- the conclusion, from the verdicts (issue 22, finding 1) ------------------------------------


def test_all_survived_names_the_smallest() -> None:
    """`repro --memory-max 32M,64M -- true`: every run survived, so the smallest value tried is
    the answer (it used to say "no memory.limit_in_bytes survived every run")."""
    c = _comparison(
        _run(1, "32M", 32 * MiB, SURVIVED, 256 * 1024, "app_exit"),
        _run(2, "64M", 64 * MiB, SURVIVED, 256 * 1024, "app_exit"),
    )
    kind, text = c.conclusion()
    assert kind == "all_survived"
    assert text.startswith("all runs survived: the smallest memory.limit_in_bytes tried is 32M")
    assert "try larger" not in c.table() and text in c.table()
    doc = c.to_json()
    assert doc["smallest_surviving"]["setting"] == "32M"
    assert doc["conclusion"] == {"kind": "all_survived", "text": text}


def test_non_memory_failures_get_no_memory_advice() -> None:
    """`repro --memory-max 32M,64M -- sh -c 'exit 1'`: both runs fail on their own; memory
    played no part, so no advice to try larger limits."""
    c = _comparison(
        _run(1, "32M", 32 * MiB, FAILED, 256 * 1024, "app_exit", code=1),
        _run(2, "64M", 64 * MiB, FAILED, 256 * 1024, "app_exit", code=1),
    )
    kind, text = c.conclusion()
    assert kind == "other_reasons"
    assert text == (
        "every run failed for reasons other than memory: run 1 (app_exit (exit 1)), "
        "run 2 (app_exit (exit 1)); the memory.limit_in_bytes did not decide these runs: "
        "fix that failure first"
    )
    assert "larger" not in c.table()


def test_memory_failures_get_memory_advice_and_others_are_named() -> None:
    oom = _run(1, "32M", 32 * MiB, KILLED, 32 * MiB, "cgroup_oom")
    crash = _run(2, "64M", 64 * MiB, FAILED, 40 * MiB, "app_exit", code=2)
    assert _comparison(oom).conclusion() == (
        "none_survived",
        "no memory.limit_in_bytes survived every run (cgroup_oom): try larger values",
    )
    kind, text = _comparison(oom, crash).conclusion()
    assert kind == "none_survived"
    assert text.endswith("; failed for reasons other than memory: run 2 (app_exit (exit 2))")
    ok = _run(3, "128M", 128 * MiB, SURVIVED, 100 * MiB, "app_exit")
    kind, text = _comparison(oom, crash, ok).conclusion()
    assert kind == "smallest_survived" and text.startswith(
        "smallest memory.limit_in_bytes that survived: 128M (peak 100.0 MiB"
    )
    assert "run 2 (app_exit (exit 2))" in text


def test_a_probe_timeout_experiment_judges_by_liveness_kills() -> None:
    killed = _run(1, "0.5", 1, KILLED, None, "signal_kill")
    killed.liveness_kill = True
    oom = _run(2, "1", 2, KILLED, None, "cgroup_oom")
    kind, text = _comparison(killed, oom, kind=PROBE_TIMEOUT).conclusion()
    assert kind == "none_survived"
    assert text == (
        "no probe timeout survived every run (signal_kill (liveness kill)): try larger values; "
        "failed for reasons other than the probe timeout: run 2 (cgroup_oom)"
    )


# -- degraded: not killed, but not serving either (issue 29 item 5) -----------------------------

S = 1_000_000_000


def _probe(at_s: float, ok: bool = True, latency_s: float = 0.05) -> ProbeSample:
    timed_out = not ok and latency_s >= 1.0
    return ProbeSample(
        ts=int(at_s * S), target="http://127.0.0.1:8080/completion", unit="",
        latency_ns=int(latency_s * S), ok=ok, timed_out=timed_out,
        status=200 if ok else None, error="" if ok else "no answer within 1 s",
    )  # fmt: skip


def _thrash(rate: float = 400 * MiB) -> Thrash:
    return Thrash(
        ts=10 * S, since=5 * S, path="/run1", rate=rate, cache=40 * MiB, mapped=20 * MiB,
        usage=159 * MiB, limit=160 * MiB,
    )  # fmt: skip


def test_the_probes_that_judge_a_run_start_at_its_first_answer_and_end_with_its_work() -> None:
    starting = [_probe(0, ok=False, latency_s=0.01), _probe(1, ok=False, latency_s=0.01)]
    serving = [_probe(2), _probe(3, ok=False, latency_s=1.0), _probe(4)]
    stopping = [_probe(9.5, ok=False, latency_s=1.0)]  # in flight when --duration ended it
    assert counted_probes([*starting, *serving, *stopping], end_ns=10 * S) == serving
    # a workload that never answered: every failure counts
    assert counted_probes(starting, end_ns=10 * S) == starting
    assert degradation([*starting, _probe(2), _probe(3)], 10 * S, None) is None
    d = degradation([*starting, *serving], 10 * S, None)
    assert d is not None and (d.probes, d.failures, d.timed_out) == (3, 1, 1)
    assert d.reasons() == ["1 of 3 probes failed (1 timed out)"]
    assert d.label() == "degraded (1/3 probes failed)"
    d = degradation([_probe(2)], 10 * S, _thrash())
    assert d is not None and d.label() == "degraded (thrash)"
    assert d.reasons() == [
        "page cache re-read from disk at 400.0 MiB/s (2.0 GiB in 5 s, 50 times the 40.0 MiB "
        "of file pages it can keep, 20.0 MiB of them mapped)"
    ]


def test_judge_degraded_and_the_end_of_the_duration() -> None:
    d = degradation([_probe(1, ok=False, latency_s=1.0)], 10 * S, _thrash())
    ok = _v(1, "app_exit", code=0)
    assert judge([ok], 0, False, d) == (DEGRADED, ok)
    # a kill or a failure says more than a slow run
    oom = _v(2, "cgroup_oom", main=False, sig="SIGKILL")
    assert judge([ok, oom], None, False, d) == (KILLED, oom)
    assert judge([], None, True, d)[0] == KILLED
    assert judge([_v(1, "app_exit", code=3)], 3, False, d)[0] == FAILED
    # repro's own SIGTERM at the end of --duration is the end of the run, not a kill
    ours = msgspec.structs.replace(_v(1, "signal_kill", sig="SIGTERM"), sender_pid=77)
    assert judge([ours], 143, False) == (KILLED, ours)
    assert judge([ours], 143, False, stopped_by=77) == (SURVIVED, None)
    assert judge([ours], 143, False, d, stopped_by=77) == (DEGRADED, None)
    other = msgspec.structs.replace(ours, sender_pid=78)
    assert judge([ours, other], 143, False, stopped_by=77) == (KILLED, other)


def _degraded_run(n: int, text: str, value: int, thrash: Thrash | None) -> RunResult:
    r = _run(n, text, value, DEGRADED, value, "app_exit")
    probes = [_probe(1), _probe(2, ok=False, latency_s=1.0), _probe(3, ok=False, latency_s=1.0)]
    r.degraded = degradation(probes, 10 * S, thrash)
    r.thrash = thrash
    return r


def test_a_degraded_limit_is_not_the_smallest_that_survived() -> None:
    """160M: the mapped model is re-read on every request (thrash), probes time out, nothing is
    killed; 512M serves. The answer is 512M, and the table says why 160M was not."""
    slow = _degraded_run(1, "160M", 160 * MiB, _thrash())
    ok = _run(2, "512M", 512 * MiB, SURVIVED, 346 * MiB, "app_exit")
    c = _comparison(slow, ok)
    c.check_monotonic()
    assert c.warnings == []
    kind, text = c.conclusion()
    assert kind == "smallest_survived"
    assert text.startswith("smallest memory.limit_in_bytes that survived: 512M (peak 346.0 MiB")
    assert "other than memory" not in text  # the thrash is the limit's doing
    table = c.table()
    assert table.splitlines()[2].split()[:5] == ["160M", "1/1", "degraded", "degraded", "(2/3"]
    assert (
        "run 1 (160M) degraded: 2 of 3 probes failed (2 timed out); page cache re-read from "
        "disk at 400.0 MiB/s" in table
    )
    doc = orjson.loads(orjson.dumps(c.to_json()))
    assert doc["smallest_surviving"]["setting"] == "512M"
    run1 = doc["runs"][0]
    assert (run1["outcome"], run1["survived"]) == ("degraded", False)
    assert run1["degraded"]["reasons"][0] == "2 of 3 probes failed (2 timed out)"
    assert run1["degraded"]["thrash"]["refault_bytes_per_s"] == 400 * MiB
    assert doc["runs"][1]["degraded"] is None
    # failing probes without thrash may be anything: named as another reason, not memory's
    c = _comparison(_degraded_run(1, "160M", 160 * MiB, None), ok)
    assert c.conclusion()[1].endswith(
        "; failed for reasons other than memory: run 1 (degraded (2/3 probes failed))"
    )
    # a liveness kill while the page cache thrashed is the limit's doing too
    killed = _run(1, "160M", 160 * MiB, KILLED, 160 * MiB, "signal_kill")
    killed.liveness_kill, killed.thrash = True, _thrash()
    assert _comparison(killed).conclusion()[0] == "none_survived"


def test_probe_data_makes_the_probe_a_post() -> None:
    p = _plan(memory_max="160M,512M", probe="http://127.0.0.1:8080/completion",
              probe_data='{"n_predict": 1}')  # fmt: skip
    assert p.probe is not None and p.probe.body == b'{"n_predict": 1}'
    assert p.fixed()["probe_data"] == '{"n_predict": 1}'
    for probe in (None, "tcp://127.0.0.1:8080"):
        with pytest.raises(UsageError, match="--probe-data needs an http:// --probe"):
            _plan(memory_max="160M,512M", probe=probe, probe_data="x")


def test_interrupted_says_so_and_concludes_nothing() -> None:
    import signal

    r = RunResult(run=1, setting=Setting("32M", 32 * MiB), repeat=1, trace="t")
    r.error = "interrupted by SIGINT"
    c = _comparison(r, _run(2, "64M", 64 * MiB, SURVIVED, 1, "app_exit"))
    c.runs.pop()
    c.interrupted, c.stop_signal = True, signal.SIGINT
    assert c.conclusion() == (
        "interrupted",
        "interrupted by SIGINT after 1 of 2 runs: no conclusion",
    )
    table = c.table()
    assert "interrupted by SIGINT" in table.splitlines()[2] and "larger" not in table


def test_a_value_listed_twice_is_refused() -> None:
    with pytest.raises(UsageError, match="32M and 32M are the same value"):
        _plan(memory_max="32M,32M")
    with pytest.raises(UsageError, match="32M and 33554432 are the same value"):
        _plan(memory_max="32M,33554432")


@pytest.mark.root
def test_cli_all_survive_and_non_memory_failure(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        main, ["repro", "--memory-max", "32M,64M", "--out-dir", str(tmp_path / "a"), "--json",
               "--", "true"],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    doc = orjson.loads(r.stdout)
    assert doc["conclusion"]["kind"] == "all_survived"
    assert doc["smallest_surviving"]["setting"] == "32M"
    r = CliRunner().invoke(
        main, ["repro", "--memory-max", "32M,64M", "--out-dir", str(tmp_path / "b"), "--",
               "sh", "-c", "exit 1"],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert "every run failed for reasons other than memory" in r.stdout
    assert "larger" not in r.stdout


@pytest.mark.root
def test_sigint_during_repro_exits_non_zero_and_says_so(tmp_path: Path) -> None:
    """SIGINT to repro during a run: the run's workload gets it (the lifecycle policy), the
    experiment stops, the table says "interrupted by SIGINT", and repro exits 130."""
    import signal
    import subprocess
    import time

    import psutil

    out = tmp_path / "runs"
    p = subprocess.Popen(
        [sys.executable, "-m", "tracer.cli", "repro", "--memory-max", "32M,64M", "--out-dir",
         str(out), "--", "sleep", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    sleeper = None
    while sleeper is None and time.monotonic() < deadline:
        kids = psutil.Process(p.pid).children(recursive=True)
        sleeper = next((k for k in kids if k.name() == "sleep"), None)
        time.sleep(0.05)
    assert sleeper is not None, "the workload never started"
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == 130, stderr
    assert not psutil.pid_exists(sleeper.pid)
    assert "interrupted by SIGINT after 1 of 2 runs: no conclusion" in stdout
    assert "larger" not in stdout and "Traceback" not in stderr
    assert os.listdir(out) == ["run01-memory_max-32M.trace"]
