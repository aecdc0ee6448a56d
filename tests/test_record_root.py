"""Tier 3 (root, real kernel): real OOM kills, exits and signals recorded and judged.

Every memory test runs under a child memory cgroup limit (never the host). Each test watches
only its own command's processes and asserts exact counts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recording import record, record_while
from tests.workloads import HOG, cache_churn, in_cgroup
from tracer.events import Exec, Exit, KmsgOom, OomKill, Signal
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.root

MiB = 1024 * 1024


def events_of(path: str) -> list[object]:
    return list(read_trace(path).events)


def test_cgroup_oom_in_a_child_cgroup(
    tmp_path: Path, parent_cgroup: str, layout: CgroupLayout
) -> None:
    with ChildCgroup(parent_cgroup, f"wr-test-oom-{os.getpid()}", 64 * MiB, layout=layout) as cg:
        res = record(tmp_path, in_cgroup(cg, sys.executable, "-c", HOG))
        path = cg.path
    events = events_of(res.path)
    ooms = [e for e in events if isinstance(e, OomKill)]
    exits = [e for e in events if isinstance(e, Exit)]
    kmsgs = [e for e in events if isinstance(e, KmsgOom)]
    assert len(exits) == 1, exits
    hog = exits[0]
    assert hog.wait.signal == signal.SIGKILL
    assert len(ooms) == 1
    oom = ooms[0]
    assert (oom.victim_pid, oom.memcg, oom.limit_bytes) == (hog.pid, True, 64 * MiB)
    assert oom.usage_bytes > 60 * MiB
    # the kernel log, read independently, agrees on the victim and the cgroup
    assert [(k.victim_pid, k.memcg, k.oom_memcg) for k in kmsgs] == [(hog.pid, True, path)]
    [v] = res.verdicts
    assert (v.pid, v.cause, v.limit_cgroup, v.limit_bytes) == (
        hog.pid,
        "cgroup_oom",
        path,
        64 * MiB,
    )
    assert v.confidence == "high"
    # the OOM killer's own SIGKILL is evidence of the OOM, not a second cause
    kills = [e for e in events if isinstance(e, Signal) and e.sig == signal.SIGKILL]
    assert len(kills) == 1 and kills[0].target_pid == hog.pid
    assert res.lost == 0


def test_limit_on_the_parent_is_named(
    tmp_path: Path, parent_cgroup: str, layout: CgroupLayout
) -> None:
    with ChildCgroup(
        parent_cgroup, f"wr-test-parent-{os.getpid()}", 64 * MiB, layout=layout
    ) as outer:
        with ChildCgroup(outer.path, "child", 256 * MiB, layout=layout) as inner:
            res = record(tmp_path, in_cgroup(inner, sys.executable, "-c", HOG))
            inner_path = inner.path
        outer_path = outer.path
    [v] = res.verdicts
    assert v.cause == "cgroup_oom"
    assert v.limit_cgroup == outer_path != inner_path
    assert v.limit_bytes == 64 * MiB
    [oom] = [e for e in events_of(res.path) if isinstance(e, OomKill)]
    assert oom.victim_cgroup_id != oom.limit_cgroup_id


def test_exit_code(tmp_path: Path) -> None:
    res = record(tmp_path, ["sh", "-c", "exit 23"])
    [v] = res.verdicts
    assert (v.cause, v.exit_code, v.comm) == ("app_exit", 23, "sh")
    assert res.command_status == 23


def test_sigterm_from_another_process_names_the_sender(tmp_path: Path) -> None:
    # (the pause lets the child exec sleep first: killed before that, it would still be "sh")
    script = "sleep 30 & s=$!; sleep 0.3; /bin/kill -TERM $s; wait $s; exit 0"
    res = record(tmp_path, ["sh", "-c", script])
    events = events_of(res.path)
    [killer] = [
        e
        for e in events
        if (isinstance(e, Exec) and e.filename == "/bin/kill")
        or (isinstance(e, Exec) and e.filename.endswith("/kill"))
    ]
    assert sorted(v.comm for v in res.verdicts) == ["kill", "sh", "sleep", "sleep"]
    [v] = [v for v in res.verdicts if v.comm == "sleep" and v.signal]
    by_comm = {v.comm: v for v in res.verdicts if v.comm != "sleep"}
    assert (v.cause, v.signal, v.sender_pid, v.sender_comm) == (
        "signal_kill",
        "SIGTERM",
        killer.pid,
        "kill",
    )
    assert by_comm["sh"].exit_code == 0 and by_comm["kill"].exit_code == 0


def test_descendants_are_watched_and_strangers_are_not(tmp_path: Path) -> None:
    """A stranger that provably runs while the hooks are attached leaves no verdict: it is
    started before the recording (so it is nobody's helper, not the recorder's), released by
    on_ready (hooks attached, before the command starts), and the command waits on a fifo for
    the stranger's own child's exit status, so the recording was up for the stranger's whole
    life and did record the command's exits around it: its absence is the filter's doing."""
    go, pidfile, fifo = tmp_path / "go", tmp_path / "stranger.pid", tmp_path / "fifo"
    os.mkfifo(fifo)
    script = (
        f"while [ ! -e {go} ]; do sleep 0.05; done; "
        f"sh -c 'exit 5' & echo $! > {pidfile}; wait $!; echo $? > {fifo}"
    )
    stranger = subprocess.Popen(["sh", "-c", script])
    command = ["sh", "-c", f"sh -c 'exit 7'; read r < {fifo}; test \"$r\" = 5"]
    rec = Recorder(
        str(tmp_path / "t.trace"), Targets(command=command), duration=60, on_ready=go.touch
    )
    try:
        res = rec.run()
    finally:
        if stranger.poll() is None:
            stranger.kill()
        stranger.wait()
    assert go.exists(), "on_ready was not called"
    # the command read 5 from the stranger: the stranger's child ran and exited while recording
    assert res.command_status == 0 and stranger.returncode == 0
    strangers = {stranger.pid, int(pidfile.read_text())}
    exits = {e.pid: e for e in events_of(res.path) if isinstance(e, Exit)}
    assert sorted(v.exit_code or 0 for v in res.verdicts) == [0, 7]
    assert {v.pid for v in res.verdicts} <= exits.keys()  # the window's own exits, recorded
    assert not strangers & {v.pid for v in res.verdicts}
    assert not strangers & exits.keys()


def test_cgroup_target(tmp_path: Path, parent_cgroup: str, layout: CgroupLayout) -> None:
    with ChildCgroup(parent_cgroup, f"wr-test-target-{os.getpid()}", None, layout=layout) as cg:
        # (the processes outlive the recorder's start-up, however loaded the machine is)
        inside = subprocess.Popen(in_cgroup(cg, "sh", "-c", "sleep 3; exit 4"))
        outside = subprocess.Popen(["sh", "-c", "sleep 3; exit 6"])
        rec = Recorder(str(tmp_path / "cg.trace"), Targets(cgroups=[cg.path]), duration=5)
        res = rec.run()
        inside.wait()
        outside.wait()
    codes = {v.pid: (v.comm, v.exit_code) for v in res.verdicts}
    # the shell inside and its sleep; nothing from the shell outside
    assert codes.pop(inside.pid) == ("sh", 4)
    assert list(codes.values()) == [("sleep", 0)]
    assert outside.pid not in codes


def test_pid_target_stops_when_it_exits(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 3; exit 9"])
    res = Recorder(str(tmp_path / "pid.trace"), Targets(pids=[proc.pid]), duration=30).run()
    proc.wait()
    assert res.reason == "watched processes exited"
    # the shell and the sleep it forked (a descendant of a watched pid is watched)
    assert sorted((v.comm, v.exit_code) for v in res.verdicts) == [("sh", 9), ("sleep", 0)]
    assert proc.pid in {v.pid for v in res.verdicts}


def test_all_records_every_process_and_samples_cgroups_not_each_pid(tmp_path: Path) -> None:
    import threading

    from tracer.events import CgroupSample, HostSample, ProcessSample

    pidfile, go = tmp_path / "pid", tmp_path / "go"
    # started before the recording and orphaned at once: the recorder runs in this process,
    # and what it starts while recording is its own helper, never evidence
    script = f"echo $$ > {pidfile}; while [ ! -e {go} ]; do sleep 0.05; done; sleep 0.3; exit 17"
    subprocess.run(["sh", "-c", f"sh -c '{script}' &"], check=True)
    ready = threading.Event()
    rec = Recorder(str(tmp_path / "all.trace"), Targets(all=True), duration=4, on_ready=ready.set)
    results: list[RecordResult] = []
    thread = threading.Thread(target=lambda: results.append(rec.run()))
    thread.start()
    assert ready.wait(60), "the recorder never got ready"
    go.touch()
    thread.join(30)
    assert results, "the recording did not end"
    [mine] = [v for v in results[0].verdicts if v.pid == int(pidfile.read_text())]
    assert (mine.cause, mine.exit_code, mine.comm) == ("app_exit", 17, "sh")
    events = events_of(str(tmp_path / "all.trace"))
    assert any(isinstance(e, HostSample) for e in events)
    assert any(isinstance(e, CgroupSample) for e in events)  # the cgroups programs ran in
    # every forked process sampled ten times a second would cost more than the rest: not under
    # --all (verdicts do not use per-process samples)
    assert not [e for e in events if isinstance(e, ProcessSample)]
    assert [e for e in events if isinstance(e, Exit) and e.pid == mine.pid]


def test_live_equals_replay(tmp_path: Path, parent_cgroup: str) -> None:
    """The verdicts `record` prints equal those of replaying its file, byte for byte."""
    trace = str(tmp_path / "live.trace")
    wr = [sys.executable, "-m", "tracer.cli"]
    live = subprocess.run(
        [*wr, "record", "-q", "-o", trace, "--", sys.executable, "-m", "tracer.demo"],
        capture_output=True,
        text=True,
        check=True,
    )
    replayed = subprocess.run(
        [*wr, "replay", "--verdicts-only", trace], capture_output=True, text=True, check=True
    )
    assert "cgroup_oom" in live.stdout and "signal_kill" in live.stdout
    assert live.stdout == replayed.stdout
    live_json = subprocess.run(
        [*wr, "replay", "--json", trace], capture_output=True, text=True, check=True
    )
    assert '"cause": "cgroup_oom"' in live_json.stdout


# page cache of our own beyond the limit (reclaimable: the kernel reclaims and stalls us),
# then anonymous memory until the OOM kill
RECLAIM_HOG = cache_churn(2) + HOG


def test_pressure_then_oom_in_one_trace_in_time_order(
    tmp_path: Path, parent_cgroup: str, layout: CgroupLayout
) -> None:
    from tracer.events import CgroupSample, EffectiveLimit, ReclaimSummary

    # scratch on disk (not tmpfs) so that its page cache is reclaimable
    scratch = Path("/var/tmp") / f"wr-test-scratch-{os.getpid()}"
    try:
        with (
            ChildCgroup(
                parent_cgroup, f"wr-test-pressure-{os.getpid()}", 48 * MiB, layout=layout
            ) as outer,
            ChildCgroup(outer.path, "svc", 512 * MiB, layout=layout) as inner,
        ):
            res = record(
                tmp_path, in_cgroup(inner, sys.executable, "-c", RECLAIM_HOG, str(scratch))
            )
            inner_path, outer_path = inner.path, outer.path
    finally:
        scratch.unlink(missing_ok=True)
    events = events_of(res.path)
    assert [e.ts for e in events] == sorted(e.ts for e in events)  # type: ignore[attr-defined]
    [oom] = [e for e in events if isinstance(e, OomKill)]
    ids = {e.path: e.cgroup_id for e in events if isinstance(e, CgroupSample)}
    # reclaim with real durations, charged to the cgroup at its limit: the outer one
    summaries = [e for e in events if isinstance(e, ReclaimSummary) and e.kind == "memcg"]
    assert sum(s.count for s in summaries) > 0
    assert all(s.cgroup_id == ids[outer_path] for s in summaries)
    assert sum(s.total_ns for s in summaries) > 0
    # usage samples of the outer cgroup approach its limit before the kill
    before = [
        e
        for e in events
        if isinstance(e, CgroupSample) and e.path == outer_path and e.ts < oom.ts and e.usage_bytes
    ]
    assert before and max(e.usage_bytes or 0 for e in before) > 40 * MiB
    # the effective limit of the inner cgroup is the outer's
    limits = [e for e in events if isinstance(e, EffectiveLimit) and e.path == inner_path]
    assert limits and (limits[0].limit_bytes, limits[0].set_by) == (48 * MiB, outer_path)
    [v] = res.verdicts
    assert (v.cause, v.limit_cgroup, v.limit_scope) == ("cgroup_oom", outer_path, "ancestor")
    assert v.stall_ns and v.host_available


def test_an_added_sink_sees_exactly_what_the_trace_holds(tmp_path: Path) -> None:
    """A sink given to the recorder (the agent's metrics, a history journal) gets every event the
    trace file gets, in the same order, and the same footer."""
    from collections.abc import Sequence

    from tracer.events import Event
    from tracer.trace.format import TraceFooter

    class Collect:
        def __init__(self) -> None:
            self.events: list[Event] = []
            self.footer: TraceFooter | None = None

        def write(self, events: Sequence[Event]) -> None:
            self.events += events

        def close(self, footer: TraceFooter, complete: bool) -> None:
            assert complete
            self.footer = footer

    sink = Collect()
    out = str(tmp_path / "sink.trace")
    argv = ["sh", "-c", "sleep 0.2; exit 5"]
    res = Recorder(out, Targets(command=argv), duration=60, sinks=[sink]).run()
    assert res.command_status == 5
    trace = read_trace(out)
    assert sink.events == list(trace.events)
    assert sink.footer is not None and trace.footer is not None
    assert sink.footer.counts == trace.footer.counts == res.counts
    assert [e for e in sink.events if isinstance(e, Exit) and e.wait.code == 5]


def test_a_program_started_beside_an_in_process_recording_keeps_the_tests_limits(
    tmp_path: Path,
) -> None:
    """tests/recording.py records in the test's own process: a program the test starts while
    it records (podman, and the container it starts) and after it sees the test's own
    oom_score_adj and data limit, not the recorder's guard (tracer/selfguard.py), which the
    header says is off."""
    from tracer import selfguard

    probe = ["sh", "-c", "cat /proc/self/oom_score_adj; grep 'Max data' /proc/self/limits"]

    def limits() -> str:
        return subprocess.run(probe, capture_output=True, text=True, check=True).stdout

    before = limits()
    assert before.split()[0] != str(selfguard.OOM_SCORE_ADJ), before
    target = subprocess.Popen(["sleep", "60"])
    seen: list[str] = []
    try:
        res = record_while(tmp_path, "", lambda: seen.append(limits()), pids=[target.pid])
    finally:
        target.kill()
        target.wait()
    assert seen == [before]
    assert limits() == before
    assert res.header.extra["self_protection"] == {"off": selfguard.OFF}
