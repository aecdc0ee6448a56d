"""`history --restarts`: a unit's crash loop from the agent's journal, without root. The entries
are written by the journal's own writers (``verdict_entry``, ``restart_entry``) from verdicts and
restarts, one test's straight from the Analyzer fed an event stream of a real-shaped loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from tests import streams as st
from tests.workloads import HOG, in_cgroup
from tracer.agent.journal import Journal, parse_lines, restart_entry, verdict_entry
from tracer.agent.loops import backoff_shape, loops_text, restart_loops
from tracer.agent.state import StateDir
from tracer.analysis.analyzer import Analyzer
from tracer.analysis.findings import Restart, Verdict
from tracer.analysis.units import label_parts
from tracer.cli import main
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup

BOOT = "0123456789abcdef0123456789abcdef"
OFFSET = 1_700_000_000 * st.S
MiB = st.MiB
UNIT = "docker web"
WHYRESTART = [sys.executable, "-m", "tracer.cli"]


def run_verdict(
    pid: int, start: float, end: float, peak: int, limit: int, shmem: int | None, unit: str
) -> Verdict:
    return Verdict(
        ts=st.t(end),
        pid=pid,
        comm="web",
        cause="cgroup_oom",
        confidence="high",
        summary="OOM-killed",
        advice="raise it",
        evidence=(),
        unit=unit,
        main=True,
        start_ns=st.t(start),
        exit_code=137,
        signal="SIGKILL",
        limit_bytes=limit,
        usage_bytes=peak,
        peak_bytes=peak,
        breakdown=(("anon", peak - (shmem or 0)),) + ((("shmem", shmem),) if shmem else ()),
    )


def crash_loop(
    runs: list[tuple[float, float, int]],
    limit: int = 256 * MiB,
    shmem: list[int] | None = None,
    unit: str = UNIT,
    limits: list[int] | None = None,
) -> list[dict[str, Any]]:
    """The journal of a unit whose runs are (start s, end s, peak bytes), each OOM-killed and
    restarted at the next one's start; round-tripped through the journal's line format."""
    entries = []
    for i, (start, end, peak) in enumerate(runs):
        pid = 100 * (i + 1)
        v = run_verdict(
            pid,
            start,
            end,
            peak,
            limits[i] if limits else limit,
            shmem[i] if shmem else None,
            unit,
        )
        entries.append(verdict_entry(v, BOOT, OFFSET, f"inc-{pid}", label_parts(unit)))
        if i + 1 < len(runs):
            nxt = runs[i + 1][0]
            r = Restart(st.t(nxt), unit, pid, pid + 100, st.t(nxt) - st.t(end), "cgroup_oom")
            entries.append(restart_entry(r, BOOT, OFFSET))
    return list(parse_lines(orjson.dumps(e) for e in entries))


def test_a_three_run_oom_loop_with_growing_peaks_says_the_leak() -> None:
    """Each run's peak higher than the last (a host without a tight limit): memory survives."""
    entries = crash_loop([(0, 60, 100 * MiB), (61, 121, 140 * MiB), (123, 183, 180 * MiB)])
    [loop] = restart_loops(entries)
    assert (loop.unit, len(loop.runs), loop.restarts) == (UNIT, 3, 2)
    assert loop.causes == {"cgroup_oom": 3}
    assert [r.pid for r in loop.runs] == [100, 200, 300]
    assert [r.lived_ns for r in loop.runs] == [60 * st.S] * 3
    assert loop.peaks_grow and loop.leak and not loop.runs_shorten
    text = loops_text(entries, detailed=True)
    assert "memory that survives restarts" in text
    assert "100.0 MiB → 140.0 MiB → 180.0 MiB" in text
    assert "LEAK ACROSS RESTARTS" in loops_text(entries, detailed=False)


def test_a_loop_with_flat_peaks_says_no_leak() -> None:
    """Killed at the limit each time, each run as long as the last: a loop, not a leak."""
    at_limit = 256 * MiB
    entries = crash_loop([(0, 30, at_limit), (31, 61, at_limit), (62, 92, at_limit)])
    [loop] = restart_loops(entries)
    assert len(loop.runs) == 3 and loop.restarts == 2
    assert not (loop.peaks_grow or loop.shmem_grows or loop.runs_shorten or loop.leak)
    assert loop.findings == []
    text = loops_text(entries, detailed=True) + loops_text(entries, detailed=False)
    assert "LEAK" not in text and "survives" not in text and "shorter" not in text


def test_two_runs_are_no_trend() -> None:
    entries = crash_loop([(0, 60, 100 * MiB), (61, 121, 140 * MiB)])
    [loop] = restart_loops(entries)
    assert not loop.peaks_grow and not loop.leak


def test_runs_that_get_shorter_under_a_fixed_limit_are_said() -> None:
    """Each run killed at the same limit but sooner, shared memory growing: what the last run
    left in tmpfs is charged to the next one."""
    lim = 128 * MiB
    entries = crash_loop(
        [(0, 40, lim), (41, 61, lim), (62, 72, lim)],
        limit=lim,
        shmem=[20 * MiB, 60 * MiB, 90 * MiB],
    )
    [loop] = restart_loops(entries)
    assert loop.runs_shorten and loop.shmem_grows and not loop.peaks_grow
    text = loops_text(entries, detailed=True)
    assert "40.0s → 20.0s → 10.0s" in text
    assert "shared memory (tmpfs, /dev/shm) at the kill grew" in text


def test_a_raised_limit_is_not_a_leak() -> None:
    entries = crash_loop(
        [(0, 60, 100 * MiB), (61, 121, 200 * MiB), (123, 183, 300 * MiB)],
        limits=[100 * MiB, 200 * MiB, 300 * MiB],
    )
    [loop] = restart_loops(entries)
    assert loop.limit_changed and not loop.peaks_grow and not loop.leak
    assert "the limit changed between runs" in loops_text(entries, detailed=True)


def test_the_back_off_gaps_are_reported_with_their_shape() -> None:
    runs = [(0.0, 5.0, 64 * MiB), (6.0, 11.0, 64 * MiB), (13.0, 18.0, 64 * MiB)]
    runs.append((22.0, 27.0, 64 * MiB))
    [loop] = restart_loops(crash_loop(runs))
    assert loop.backoff_ns == [1 * st.S, 2 * st.S, 4 * st.S]
    assert [r.backoff_ns for r in loop.runs] == [st.S, 2 * st.S, 4 * st.S, None]
    assert loop.backoff == "doubling"
    line = loops_text(crash_loop(runs), detailed=False)
    assert "back-off 1.0s, 2.0s, 4.0s (doubling)" in line


def test_backoff_shapes() -> None:
    s = st.S
    assert backoff_shape([s]) is None  # one gap is no shape
    assert backoff_shape([5 * s, 5 * s, 5 * s]) == "steady"  # systemd RestartSec
    assert backoff_shape([10 * s, 20 * s, 40 * s, 80 * s]) == "doubling"  # CrashLoopBackOff
    assert backoff_shape([10 * s, 20 * s, 40 * s, 300 * s // 4, 75 * s]) != "doubling"
    assert backoff_shape([80 * s, 160 * s, 300 * s, 300 * s]) == "doubling, capped"
    assert backoff_shape([1 * s, 9 * s, 2 * s]) == "irregular"


def test_a_clean_exit_is_a_run_from_its_restart_alone() -> None:
    """A clean exit has no verdict entry; its restart still names it and its end."""
    r = Restart(st.t(12), UNIT, 100, 200, st.t(2), "app_exit")
    entries = list(parse_lines([orjson.dumps(restart_entry(r, BOOT, OFFSET))]))
    [loop] = restart_loops(entries)
    assert [(x.pid, x.cause, x.end_ns, x.start_ns) for x in loop.runs] == [
        (100, "app_exit", st.t(10), None),
        (200, None, None, st.t(12)),  # still running
    ]
    assert loop.causes == {"app_exit": 1}
    assert loop.runs[0].time is not None and loop.runs[0].time < loop.runs[1].time  # type: ignore[operator]
    assert "(running)" in loops_text(entries, detailed=True)


def test_the_analyzer_s_own_verdicts_and_restarts_make_the_loop() -> None:
    """A systemd unit OOM-killed three times, restarted after 1 s, 2 s and 4 s, each run
    shorter: the journal entries come from the Analyzer's verdicts and restarts."""
    cg, path = 40, "/system.slice/web.service"
    events: list[Any] = [st.cgroup(cg, path, 64 * MiB)]
    starts, ends = [1.0, 12.1, 19.1, 25.1], [11.1, 17.1, 21.1]
    for i, (start, end) in enumerate(zip(starts, ends, strict=False)):
        pid = 100 * (i + 1)
        events += [
            st.execd(start, pid, cg, "web"),
            st.oom(end - 0.1, pid, limit_cgroup=cg, victim_cg=cg),
            st.killed(end, pid, signal.SIGKILL, comm="web", start=start, cg=cg),
        ]
    events += [st.execd(starts[-1], 400, cg, "web"), st.forked(41.0, 400, 401, cg, "web")]
    a = Analyzer()
    verdicts = a.feed_all(events)
    lines = [
        orjson.dumps(verdict_entry(v, BOOT, OFFSET, None, label_parts(v.unit))) for v in verdicts
    ]
    lines += [orjson.dumps(restart_entry(r, BOOT, OFFSET)) for r in a.take_restarts(final=True)]
    [loop] = restart_loops(list(parse_lines(lines)))
    assert loop.unit == "web.service" and loop.restarts == 3
    assert [r.pid for r in loop.runs] == [100, 200, 300, 400]
    assert loop.causes == {"cgroup_oom": 3}
    assert [r.lived_ns for r in loop.runs[:3]] == [st.t(10.1), st.t(5.0), st.t(2.0)]
    assert loop.backoff_ns == [st.t(1.0), st.t(2.0), st.t(4.0)] and loop.backoff == "doubling"
    assert loop.runs_shorten and not loop.peaks_grow  # killed at the same 64 MiB limit
    assert [r.usage_bytes for r in loop.runs[:3]] == [64 * MiB] * 3


def _state_dir(tmp_path: object, entries: list[dict[str, Any]]) -> str:
    sd = os.path.join(str(tmp_path), "s")
    StateDir.open(sd).close()
    j = Journal(os.path.join(sd, "journal.jsonl"))
    for e in entries:
        j.add(e)
    j.close()
    return sd


def test_history_restarts_json_carries_the_loop(tmp_path: object) -> None:
    entries = crash_loop([(0, 60, 100 * MiB), (61, 121, 140 * MiB), (123, 183, 180 * MiB)])
    entries += crash_loop([(0, 9, 10 * MiB), (10, 19, 10 * MiB)], unit="podman db")
    sd = _state_dir(tmp_path, entries)
    r = CliRunner().invoke(
        main, ["history", "--state-dir", sd, "--restarts", "--unit", "web", "--json"]
    )
    assert r.exit_code == 0, r.output
    doc = orjson.loads(r.output)
    assert doc["schema"] == 1 and [e["kind"] for e in doc["entries"]] == ["restart"] * 2
    [loop] = doc["loops"]
    assert set(loop) == {
        "unit", "restarts", "causes", "runs", "backoff_ns", "backoff", "peaks_grow",
        "shmem_grows", "runs_shorten", "limit_changed", "leak", "findings",
    }  # fmt: skip
    assert (loop["unit"], loop["restarts"], loop["leak"], loop["peaks_grow"]) == (
        UNIT,
        2,
        True,
        True,
    )
    assert [x["peak_bytes"] for x in loop["runs"]] == [100 * MiB, 140 * MiB, 180 * MiB]
    assert [x["lived_ns"] for x in loop["runs"]] == [60 * st.S] * 3
    assert loop["backoff_ns"] == [1 * st.S, 2 * st.S]
    assert [x["incident"] for x in loop["runs"]] == ["inc-100", "inc-200", "inc-300"]
    # without --unit: one line per unit
    r = CliRunner().invoke(main, ["history", "--state-dir", sd, "--restarts"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("docker web: 3 runs, 2 restarts; cgroup_oom 3x")
    assert lines[1].startswith("podman db: 2 runs, 1 restart;") and "LEAK" not in lines[1]
    r = CliRunner().invoke(main, ["history", "--state-dir", sd, "--restarts", "--unit", "web"])
    assert r.exit_code == 0 and "whyrestart explain inc-300" in r.output
    assert "podman db" not in r.output


def test_a_hostile_unit_name_cannot_reach_the_terminal(tmp_path: object) -> None:
    evil = "docker \x1b]0;pwned\x07web\u202e\nfake: 0 runs"
    entries = crash_loop(
        [(0, 60, 100 * MiB), (61, 121, 140 * MiB), (123, 183, 180 * MiB)], unit=evil
    )
    for detailed in (True, False):
        text = loops_text(entries, detailed=detailed)
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
        assert "\\x1b]0;pwned\\x07web\\u202e\\x0afake" in text  # still readable, on its line
        assert not any(line.startswith("fake:") for line in text.splitlines())
    sd = _state_dir(tmp_path, entries)
    r = CliRunner().invoke(
        main, ["history", "--state-dir", sd, "--restarts", "--unit", "pwned", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\u202e" not in r.output
    assert orjson.loads(r.output)["loops"][0]["unit"] == evil  # JSON keeps the exact value


# -- root: a real crash loop under the agent ---------------------------------------------------


@pytest.mark.root
def test_a_real_oom_crash_loop_is_summarised_by_history(
    tmp_path: Path, layout: CgroupLayout, unprivileged: tuple[list[str], dict[str, str]]
) -> None:
    """The agent watching the host; a supervisor (this test) starting a hog in a memory cgroup
    named like a systemd service three times, each OOM-killed, after 0.5 s then 1 s: `history
    --restarts --unit` shows 3 runs, 2 restarts, each an OOM kill, and the growing back-off."""
    from tests.test_agent_root import AgentProc, until

    state = tmp_path / "state"
    unit = f"wr-loops-{os.getpid()}.service"
    agent = AgentProc(state)
    try:
        agent.wait_ready()
        with ChildCgroup(own_memory_cgroup(layout=layout), unit, 64 * MiB, layout=layout) as cg:
            for pause in (0.5, 1.0, None):
                hog = subprocess.run(in_cgroup(cg, sys.executable, "-c", HOG))
                assert hog.returncode == -signal.SIGKILL
                if pause is not None:
                    time.sleep(pause)

        history = [*WHYRESTART, "history", "--state-dir", str(state), "--restarts", "--unit", unit]

        def loop() -> dict[str, Any] | None:
            out = subprocess.run(
                [*history, "--json"],
                capture_output=True,
                check=True,
            ).stdout
            loops = orjson.loads(out)["loops"]
            done = loops and loops[0]["restarts"] == 2 and len(loops[0]["causes"]) > 0
            return loops[0] if done and sum(loops[0]["causes"].values()) == 3 else None

        until(lambda: loop() is not None, timeout=60)
        text = subprocess.run(
            history,
            capture_output=True,
            check=True,
            text=True,
        ).stdout
        print(text)  # (shown with -s, and when the test fails)
        assert agent.stop()[0] == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
    found = loop()
    assert found is not None
    assert found["unit"] == f"systemd {unit}" and found["causes"] == {"cgroup_oom": 3}
    assert [r["limit_bytes"] for r in found["runs"]] == [64 * MiB] * 3
    assert all(r["lived_ns"] and r["lived_ns"] > 0 for r in found["runs"])
    gaps = found["backoff_ns"]
    assert len(gaps) == 2 and gaps[1] > gaps[0] >= 0.5 * 1e9
    assert f"systemd {unit}: 3 runs, 2 restarts; cgroup_oom 3x" in text, text
