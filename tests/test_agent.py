"""The agent's stores and metrics without root: the state dir's lock and budget, segments,
incidents cut from them and replayed by the project's own analyzer, the journal's de-duplication
across restarts, history's filters, metrics and their expiry, and the OpenTelemetry log line."""

from __future__ import annotations

import errno
import os
import tracemalloc

import orjson
import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest

from tests import streams as st
from tracer.agent import segments as segmod
from tracer.agent.incidents import IncidentStore, notable
from tracer.agent.journal import Journal, parse_lines, read_journal, select, verdict_entry
from tracer.agent.metrics import Metrics
from tracer.agent.otel import log_record
from tracer.agent.segments import SegmentSink, parse_segment_name
from tracer.agent.state import StateDir
from tracer.analysis.analyzer import Analyzer
from tracer.analysis.findings import Verdict
from tracer.analysis.units import label_parts
from tracer.cli import main
from tracer.errors import UsageError
from tracer.trace import writer as writer_mod
from tracer.trace.format import TraceFooter, TraceHeader
from tracer.trace.reader import read_trace

BOOT = "0123456789abcdef0123456789abcdef"


def header() -> TraceHeader:
    return st.header(kernel="6.18", cgroup={"mode": "v1"}, targets={"all": True})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def verdict(pid: int = 7, ts: float = 10.0, cause: str = "cgroup_oom", code: int = 137) -> Verdict:
    return Verdict(
        ts=st.t(ts),
        pid=pid,
        comm="hog",
        cause=cause,
        confidence="high",
        summary="OOM-killed",
        advice="raise it",
        evidence=(),
        unit="podman llm",
        exit_code=code,
    )


# -- state dir -----------------------------------------------------------------------------


def test_a_second_agent_on_the_same_state_dir_is_refused(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "state")
    first = StateDir.open(path)
    try:
        with pytest.raises(UsageError, match=rf"another whyrestart agent \(pid {os.getpid()}\)"):
            StateDir.open(path)
    finally:
        first.close()
    StateDir.open(path).close()  # the lock went with the first


def test_a_state_dir_under_a_missing_parent_names_the_option(tmp_path: object) -> None:
    with pytest.raises(UsageError, match="--state-dir"):
        StateDir.open(os.path.join(str(tmp_path), "no", "such", "state"))


def test_budget_evicts_oldest_segments_first_then_incidents(tmp_path: object) -> None:
    sd = StateDir.open(os.path.join(str(tmp_path), "s"))
    try:
        for i in range(4):
            with open(os.path.join(sd.segments, f"seg-aaaa-{i:020d}.trace"), "wb") as f:
                f.write(b"x" * 100)
        for i in range(2):
            with open(os.path.join(sd.incidents, f"2026010{i}T000000Z-1.trace"), "wb") as f:
                f.write(b"x" * 100)
        keep = os.path.join(sd.segments, f"seg-aaaa-{3:020d}.trace")
        gone = sd.enforce(250, keep=keep)
        assert [(os.path.basename(e.path), e.kind) for e in gone] == [
            ("seg-aaaa-00000000000000000000.trace", "segment"),
            ("seg-aaaa-00000000000000000001.trace", "segment"),
            ("seg-aaaa-00000000000000000002.trace", "segment"),
            ("20260100T000000Z-1.trace", "incident"),
        ]
        assert sd.used() == 200
        assert os.path.exists(keep)
    finally:
        sd.close()


# -- segments and incidents ----------------------------------------------------------------


def _sink(sd: StateDir, clock: Clock, max_bytes: int = 1 << 30) -> SegmentSink:
    sink = SegmentSink(sd, header, BOOT, segment_s=60, max_bytes=max_bytes, clock=clock)
    sink.suffix = ""  # plain JSON lines: readable in the assertions
    return sink


def test_segments_rotate_and_each_starts_with_the_names(tmp_path: object) -> None:
    sd = StateDir.open(os.path.join(str(tmp_path), "s"))
    clock = Clock()
    sink = _sink(sd, clock)
    sink.write([st.cgroup(10, "/libpod_parent/libpod-abc", 64 * st.MiB), st.exit_code(1, 5, 3)])
    clock.now = 61
    sink.write([st.exit_code(62, 6, 4)])
    sink.close(TraceFooter(ended_ns=st.t(63), exit="stopped"), True)
    files = [p for p, _, _ in sd.segment_files()]
    assert (
        [parse_segment_name(os.path.basename(p)) for p in files]
        == [
            (BOOT[:8], st.t(0)),  # (the cgroup record is the first event)
            (BOOT[:8], st.t(62)),
        ]
    )
    second = read_trace(files[1])
    assert [e.KIND for e in second.events] == ["cgroup", "exit"]
    assert second.events[0].ts == st.t(62)  # stamped at the segment's start: in time order
    assert second.footer is not None and second.footer.exit == "stopped"
    sd.close()


def test_a_full_disk_counts_what_was_not_written_and_writing_resumes(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    sd = StateDir.open(os.path.join(str(tmp_path), "s"))
    clock = Clock()
    sink = _sink(sd, clock)
    sink.write([st.exit_code(1, 5, 3)])
    real_write = writer_mod._os_write

    def full(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer_mod, "_os_write", full)
    clock.now = 2  # past the flush interval: the write reaches the disk and fails
    sink.write([st.exit_code(2, 6, 3), st.exit_code(2.1, 7, 3)])
    # pid 5 was still buffered: it went with the failed chunk
    assert sink.unwritten == 3 and sink.writer is None
    assert "disk full" in (sink.last_error or "")
    clock.now = 3  # before the retry: still counted
    sink.write([st.exit_code(3, 8, 3)])
    assert sink.unwritten == 4
    monkeypatch.setattr(writer_mod, "_os_write", real_write)
    clock.now = 2 + segmod.RETRY_S + 1
    sink.write([st.exit_code(9, 9, 3)])
    sink.close(TraceFooter(ended_ns=st.t(10), exit="stopped"), True)
    assert sink.unwritten == 4
    pids = [e.pid for p, _, _ in sd.segment_files() for e in read_trace(p).events]  # type: ignore[attr-defined]
    assert pids == [9]  # the first segment cut back to its header, the next one written
    sd.close()


def _incident_world(
    tmp_path: object,
) -> tuple[StateDir, Clock, SegmentSink, IncidentStore, list[str]]:
    sd = StateDir.open(os.path.join(str(tmp_path), "s"))
    clock = Clock()
    sink = _sink(sd, clock)
    cut: list[str] = []
    store = IncidentStore(
        sink,
        lambda: header().clock_offset_ns,
        before_s=5,
        after_s=2,
        on_cut=lambda i, p, e: cut.append(p or f"failed {e}"),
    )
    return sd, clock, sink, store, cut


def test_an_incident_is_the_window_and_replays_to_the_same_verdict(tmp_path: object) -> None:
    sd, _clock, sink, store, cut = _incident_world(tmp_path)
    stream = [
        st.cgroup(10, "/demo", 64 * st.MiB),
        st.exit_code(1.0, 50, 0, comm="early"),  # before the window: left out
        st.forked(8.0, 1, 7, cg=10, comm="hog"),
        st.oom(9.9, victim=7, trigger=7),
        st.oom_killer_sigkill(9.9, victim=7, trigger=7),
        st.kmsg(9.95, victim=7),
        st.killed(10.0, 7, 9, comm="hog"),
        st.exit_code(11.0, 51, 0, comm="inside"),
        st.exit_code(13.0, 52, 0, comm="after"),  # after the window: left out
    ]
    analyzer = Analyzer(every_verdict=True)
    for ev in stream:
        for v in analyzer.feed(ev):
            if notable(v):
                store.add(v)
        sink.write([ev])
        store.write([ev])
    for v in analyzer.finish():
        if notable(v):
            store.add(v)
    store.close(TraceFooter(ended_ns=st.t(14), exit="stopped"), True)
    assert len(cut) == 1 and not cut[0].startswith("failed")
    trace = read_trace(cut[0])
    assert [getattr(e, "pid", None) for e in trace.events if e.KIND == "exit"] == [7, 51]
    assert trace.events[0].KIND == "cgroup"
    assert trace.header.extra["incident"]["verdicts"][0]["pid"] == 7
    again = Analyzer(every_verdict=True).feed_all(trace.events)
    judged = {v.pid: (v.cause, v.confidence) for v in again}
    first = {v.pid: (v.cause, v.confidence) for v in analyzer.verdicts}
    assert judged[7] == first[7] == ("cgroup_oom", "high")
    sd.close()


def test_an_incident_appears_under_its_name_only_once_complete(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cut is written under a hidden name and renamed at its end: a reader that finds the
    incident's file (`replay ID`, a wait for it) never reads half of one. What an agent
    killed in the middle of a cut left is removed by the next one, and never listed."""
    from tracer.agent.state import PARTIAL
    from tracer.trace.writer import TraceWriter

    sd, _clock, sink, first, cut = _incident_world(tmp_path)
    leftover = os.path.join(sd.incidents, PARTIAL + "20260101T000000Z-1.trace")
    with open(leftover, "w") as f:
        f.write("half")
    assert sd.incident_files() == [] and sd.incident_bytes() == 4
    store = IncidentStore(sink, lambda: 0, before_s=5, after_s=2, on_cut=first.on_cut)
    assert not os.path.exists(leftover)  # (the next agent's store removed it)

    listed: list[list[str]] = []
    write = TraceWriter.write

    def spy(self: TraceWriter, ev: object) -> None:
        listed.append(sorted(os.listdir(sd.incidents)))
        write(self, ev)  # type: ignore[arg-type]

    for ev in (st.cgroup(10, "/demo", 64 * st.MiB), st.exit_code(10.0, 7, 3, comm="job")):
        sink.write([ev])
    store.add(verdict(pid=7, ts=10.0))
    monkeypatch.setattr(TraceWriter, "write", spy)
    store.close(TraceFooter(ended_ns=st.t(14), exit="stopped"), True)
    monkeypatch.undo()
    [path] = cut
    name = os.path.basename(path)
    assert listed and all(names == [PARTIAL + name] for names in listed)
    assert os.listdir(sd.incidents) == [name]
    assert [p for p, _, _ in sd.incident_files()] == [path]
    assert [e.pid for e in read_trace(path).events if e.KIND == "exit"] == [7]  # type: ignore[attr-defined]
    sd.close()


def test_the_agents_analyzer_hands_every_verdict_on_and_keeps_none() -> None:
    """The agent's sinks take each verdict as it comes: its analyzer keeps none (a storm's
    first 5,000 kept pinned 4 MB of heap), and judges exactly as a recording's does."""
    stream = [
        st.cgroup(10, "/demo", 64 * st.MiB),
        st.forked(8.0, 1, 7, cg=10, comm="hog"),
        st.oom(9.9, victim=7, trigger=7),
        st.oom_killer_sigkill(9.9, victim=7, trigger=7),
        st.kmsg(9.95, victim=7),
        st.killed(10.0, 7, 9, comm="hog"),
        *(st.exit_code(11.0 + i / 100, 100 + i, 3, comm="job") for i in range(50)),
    ]
    # the analyzers the agent's recorder and a recording's build (code review 3 §4: not ones
    # made by hand with other settings)
    from tracer.agent.run import PROFILE
    from tracer.pipeline.record import Recorder, Targets

    lean = Recorder(None, Targets(all=True), profile=PROFILE, on_event=lambda *_: None).analyzer
    handed = [v for ev in stream for v in lean.feed(ev)] + lean.finish()
    full = Recorder(None, Targets(all=True)).analyzer
    full.feed_all(stream)
    assert [(v.pid, v.cause) for v in handed] == [(v.pid, v.cause) for v in full.verdicts]
    assert len(handed) == 51 and handed[0].cause == "cgroup_oom"
    assert lean.verdicts == [] and lean.not_kept == 51


def test_verdicts_inside_an_open_window_share_one_incident(tmp_path: object) -> None:
    sd, _clock, _sink, store, _cut = _incident_world(tmp_path)
    a = store.add(verdict(pid=1, ts=10))
    b = store.add(verdict(pid=2, ts=11))  # inside [5, 12]: same incident, end now 13
    c = store.add(verdict(pid=3, ts=12.5))
    d = store.add(verdict(pid=4, ts=100))
    assert a == b == c != d
    assert len(store.pending) == 2 and store.pending[0].end == st.t(14.5)
    sd.close()


def test_cutting_a_storm_window_holds_a_block_of_it_not_the_storm(tmp_path: object) -> None:
    """A window after an exit storm holds tens of thousands of events: the cut streams them in
    small blocks (at 1 MiB a block, the agent's RSS stood 11 MB higher for a minute after)."""
    sd, _clock, sink, store, cut = _incident_world(tmp_path)
    n = 60_000
    for k in range(0, n, 1000):  # 4 s to 9 s, inside the window [4, 11] of a verdict at 9 s
        sink.write([st.exit_code(4 + (k + i) * 5 / n, 1000 + i, 1) for i in range(1000)])
    store.add(verdict(pid=7, ts=9.0))
    tracemalloc.start()
    try:
        store.close(TraceFooter(ended_ns=st.t(12), exit="stopped"), True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(cut) == 1 and not cut[0].startswith("failed")
    assert sum(1 for e in read_trace(cut[0]).events if e.KIND == "exit") == n
    assert peak < 4 * 1024 * 1024, f"the cut held {peak / 2**20:.1f} MiB at its peak"
    sd.close()


# -- journal and history -------------------------------------------------------------------


def test_the_journal_never_writes_a_verdict_twice_across_restarts(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "journal.jsonl")
    j = Journal(path)
    v = verdict()
    assert j.add(verdict_entry(v, BOOT, 0, "i1", label_parts(v.unit)))
    assert not j.add(verdict_entry(v, BOOT, 0, "i1", label_parts(v.unit)))
    j.close()
    with open(path, "ab") as f:
        f.write(b'{"schema": 1, "key": "torn')  # a crash mid-line long ago
    j = Journal(path)  # the agent again
    assert not j.add(verdict_entry(v, BOOT, 0, "i1", label_parts(v.unit)))
    assert j.add(verdict_entry(verdict(pid=8), BOOT, 0, None, {"unit": ""}))
    j.close()
    entries = read_journal(path)
    assert [e["pid"] for e in entries] == [7, 8]
    assert entries[0]["verdict"]["advice"] == "raise it"


def test_history_filters() -> None:
    entries = list(
        parse_lines(
            orjson.dumps(verdict_entry(v, BOOT, 1_700_000_000 * st.S, None, {}))
            for v in (verdict(pid=1), verdict(pid=2, cause="app_exit", code=1))
        )
    )
    assert [e["pid"] for e in select(entries, cause="app_exit")] == [2]
    assert [e["pid"] for e in select(entries, unit="llm")] == [1, 2]
    assert select(entries, unit="other") == []
    assert select(entries, since_wall=1_700_000_000 + 20) == []  # exits at +10 s
    assert len(select(entries, since_wall=1_700_000_000 + 5)) == 2


def test_history_command_lists_and_explains_the_incident(tmp_path: object) -> None:
    sd = os.path.join(str(tmp_path), "s")
    StateDir.open(sd).close()
    j = Journal(os.path.join(sd, "journal.jsonl"))
    j.add(verdict_entry(verdict(), BOOT, 1_700_000_000 * st.S, "20231114T221330Z-7", {}))
    j.close()
    r = CliRunner().invoke(main, ["history", "--state-dir", sd])
    assert r.exit_code == 0, r.output
    assert "cgroup_oom" in r.output and "whyrestart explain 20231114T221330Z-7" in r.output
    r = CliRunner().invoke(main, ["history", "--state-dir", sd, "--json", "--cause", "app_exit"])
    assert r.exit_code == 0 and orjson.loads(r.output)["entries"] == []
    r = CliRunner().invoke(main, ["history", "--state-dir", os.path.join(sd, "nope")])
    assert r.exit_code == 2 and "whyrestart agent" in r.output


def test_an_incident_id_opens_like_a_trace(tmp_path: object) -> None:
    sd, _clock, sink, store, cut = _incident_world(tmp_path)
    for ev in [st.cgroup(10, "/demo"), st.killed(10.0, 7, 9), st.exit_code(20, 8, 0)]:
        sink.write([ev])
    iid = store.add(verdict(pid=7, ts=10))
    store.write([st.exit_code(20, 8, 0)])
    assert cut and os.path.basename(cut[0]).startswith(iid)
    r = CliRunner(env={"WHYRESTART_STATE_DIR": sd.path}).invoke(main, ["explain", iid, "--json"])
    assert r.exit_code == 0, r.output
    assert "warning" not in r.stderr
    assert [v["pid"] for v in orjson.loads(r.stdout)["verdicts"]] == [7]
    sd.close()


# -- metrics and log lines -----------------------------------------------------------------


def test_a_numa_constrained_oom_counts_as_an_oom_kill_of_scope_numa() -> None:
    m = Metrics(clock=Clock())  # type: ignore[arg-type]
    m.verdict(verdict(cause="numa_oom"), label_parts("podman db"))
    text = generate_latest(m.registry).decode()
    assert 'limit_scope="numa"' in text and "whyrestart_oom_kills_total{" in text


def test_metrics_count_and_vanished_units_expire() -> None:
    clock = Clock()
    m = Metrics(series_ttl_s=60, clock=clock)  # type: ignore[arg-type]
    k8s = label_parts("pod ml/llm-0 container server")
    m.verdict(verdict(), k8s)
    m.verdict(verdict(cause="app_exit", code=0), label_parts("podman other"))
    text = generate_latest(m.registry).decode()
    assert (
        'whyrestart_exits_total{cause="cgroup_oom",confidence="high",container="server",'
        'namespace="ml",pod="llm-0",unit="pod ml/llm-0 container server"} 1.0'
    ) in text
    assert 'whyrestart_oom_kills_total{container="server"' in text
    assert (
        'whyrestart_clean_exits_total{container="",namespace="",pod="",unit="podman other"} 1.0'
        in text
    )
    clock.now = 30
    assert m.expire(lambda unit: False) == 0  # not quiet long enough
    clock.now = 61
    assert m.expire(lambda unit: unit == "podman other") == 1  # the other one still exists
    text = generate_latest(m.registry).decode()
    assert "llm-0" not in text and 'unit="podman other"' in text


def test_a_cri_named_container_has_one_info_series_and_its_count_as_a_value() -> None:
    """The pod uid, container id and runtime as labels of one info series per unit, replaced
    by the next attempt's; the restart count is a value, never a label; expired with the unit.
    A unit no CRI runtime named gets neither series."""
    from tracer.pipeline.follow import RuntimeIdentity

    clock = Clock()
    m = Metrics(series_ttl_s=60, clock=clock)  # type: ignore[arg-type]
    k8s = label_parts("pod ml/llm-0 container server")
    uid = "6f1c2d3e-0000-4000-8000-0123456789ab"
    m.verdict(verdict(), k8s)
    m.identity(k8s, RuntimeIdentity("containerd", "ab" * 32, uid, 2))
    m.identity(label_parts("podman other"), None)
    unit = 'container="server",namespace="ml",pod="llm-0",unit="pod ml/llm-0 container server"'
    text = generate_latest(m.registry).decode()
    info = [ln for ln in text.splitlines() if ln.startswith("whyrestart_container_info{")]
    assert info == [
        f'whyrestart_container_info{{container="server",container_id="{"ab" * 32}",'
        f'container_runtime="containerd",namespace="ml",pod="llm-0",pod_uid="{uid}",'
        'unit="pod ml/llm-0 container server"} 1.0'
    ]
    assert f"whyrestart_container_restarts{{{unit}}} 2.0" in text
    assert "restart_count=" not in text and "podman other" not in text
    m.identity(k8s, RuntimeIdentity("containerd", "cd" * 32, uid, 3))  # the next attempt
    text = generate_latest(m.registry).decode()
    info = [ln for ln in text.splitlines() if ln.startswith("whyrestart_container_info{")]
    assert len(info) == 1 and "cd" * 32 in info[0], info
    assert f"whyrestart_container_restarts{{{unit}}} 3.0" in text
    clock.now = 61
    assert m.expire(lambda unit: False) == 1
    text = generate_latest(m.registry).decode()
    assert "whyrestart_container_info{" not in text and "whyrestart_container_restarts{" not in text
    m.identity(k8s, RuntimeIdentity("containerd", "cd" * 32, uid, 3))  # (the unit is back)
    m.identity(k8s, RuntimeIdentity("containerd", "cd" * 32, uid, 3))
    text = generate_latest(m.registry).decode()
    assert text.count("whyrestart_container_info{") == 1
    assert f"whyrestart_container_restarts{{{unit}}} 3.0" in text


def test_a_process_outside_any_unit_makes_no_series_of_its_own() -> None:
    assert label_parts("sh (pid 4242)") == {"unit": ""}
    assert label_parts("podman llm") == {"unit": "podman llm", "container_name": "llm"}


def test_log_line_uses_opentelemetry_names() -> None:
    v = verdict()
    v = Verdict(
        **{**{s: getattr(v, s) for s in v.__slots__}, "unit": "pod ml/llm-0 container server"}
    )
    rec = log_record(v, 0, "20260101T000000Z-7")
    a = rec["attributes"]
    assert a["k8s.namespace.name"] == "ml" and a["k8s.pod.name"] == "llm-0"
    assert a["k8s.container.name"] == "server"
    assert a["process.pid"] == 7 and a["process.exit.code"] == 137
    assert (
        a["whyrestart.cause"] == "cgroup_oom" and a["whyrestart.incident"] == "20260101T000000Z-7"
    )
    assert rec["severity_text"] == "WARN"
    # named from its labels, not by a CRI runtime: none of the runtime's facts, not even empty
    assert not {"k8s.pod.uid", "k8s.container.restart_count", "container.id"} & set(a)
    assert "container.runtime.name" not in a
    assert "attributes" not in verdict_entry(v, BOOT, 0, None, label_parts(v.unit))


def test_the_journal_rotates_and_history_reads_both_generations(tmp_path: object) -> None:
    d = str(tmp_path)
    path, old = os.path.join(d, "journal.jsonl"), os.path.join(d, "journal.1.jsonl")
    j = Journal(path, old, max_bytes=4000)
    for pid in range(1, 7):  # each entry is about 1 KB: rotates after the fourth
        assert j.add(verdict_entry(verdict(pid=pid), BOOT, 0, None, {}))
    j.close()
    assert os.path.exists(old)
    assert [e["pid"] for e in read_journal(old, path)] == [1, 2, 3, 4, 5, 6]
    j = Journal(path, old, max_bytes=4000)  # restarted: both generations' keys are known
    assert not j.add(verdict_entry(verdict(pid=2), BOOT, 0, None, {}))
    j.close()


def test_a_helpers_failure_is_counted_not_journaled() -> None:
    crash = verdict(cause="app_exit", code=1)
    assert notable(crash, in_unit=True)  # a unit's main process failed: a restart's cause
    assert not notable(crash, in_unit=False)  # a host script's grep found nothing
    assert notable(verdict(), in_unit=False)  # a kill is always worth an incident
    assert not notable(verdict(cause="app_exit", code=0), in_unit=True)


# -- the sweep of gone cgroups -----------------------------------------------------------------


def test_a_cgroup_is_forgotten_once_two_sweeps_in_a_row_found_it_gone() -> None:
    from tracer.agent.run import gone_twice

    alive = {1}
    known = {1: "/a", 2: "/b", 3: "/c"}
    forget, later = gone_twice(known, lambda cid, _p: cid in alive, set())
    assert (forget, later) == (set(), {2, 3})
    alive.add(3)  # (back: the same id, seen again)
    forget, later = gone_twice(known, lambda cid, _p: cid in alive, later)
    assert (forget, later) == ({2}, set())


def test_the_analysis_forgets_a_gone_cgroup_and_keeps_a_new_one_at_its_path() -> None:
    path = "/machine.slice/libpod-" + "a" * 64 + ".scope"
    a = Analyzer()
    a.feed_many(
        [
            st.cgroup(50, path, 64 * st.MiB),
            st.unit_info(50, "podman", "model"),
            st.sample(0.1, 50, path, usage=st.MiB),
            st.execd(0.2, 100, 50, "llm"),
            st.exit_code(0.5, 100, 1, cg=50),
            st.cgroup(51, path, 64 * st.MiB),  # the container's next run: a new id there
            st.unit_info(51, "podman", "model"),
            st.execd(0.6, 200, 51, "llm"),
        ]
    )
    a.feed_many([st.forked(3.0, 200, 201, 51, "llm")])
    assert set(a.known_cgroups()) == {50, 51}
    a.forget_cgroups([50])
    assert a.known_cgroups() == {51: path}
    assert 50 not in a.ev.by_cgroup and 50 not in a.ev.units
    assert 50 not in a.table.cgroup_units and 50 not in a.table.named
    assert a.ev.id_of_path(path) == 51 and [c for _, c in a.ev.path_history[path]] == [51]
    # the unit goes on: the next run's exit is judged in it
    [v] = a.feed_many([st.exit_code(4.0, 200, 1, cg=51), st.forked(6.0, 1, 300, 51, "x")])
    assert v.unit == "podman model"
