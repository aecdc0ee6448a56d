"""Who killed it, from what the kernel saw of the sender (issue 18): user-space OOM killers as
their own cause (``userspace_oom``) with the pressure they acted on; any supervisor's kill
after failing or slow probes is a ``probe_kill``; every verdict lists the probe failures
before its exit. Synthetic event streams (tests/streams.py), no root."""

from __future__ import annotations

import signal
from pathlib import Path

from msgspec.structs import replace

from tests.streams import (
    GiB,
    MiB,
    cgroup,
    execd,
    exit_code,
    forked,
    host,
    killed,
    probe,
    runtime,
    sample,
    sent,
)
from tracer.analysis import senders
from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.events import Event, HostSample, Signal


def judge(*events: Event) -> list[Verdict]:
    return Analyzer().feed_all(sorted(events, key=lambda e: e.ts))


def one(*events: Event) -> Verdict:
    [v] = judge(*events)
    return v


def pressured(at: float, psi: float, available: int) -> HostSample:
    return replace(host(at, available), psi_some_avg10=psi, psi_full_avg10=psi / 2)


def oomd_kill(exe: str = "", comm: str = "systemd-oomd", cg_path: str = "") -> list[Event]:
    """A service in /app.slice/app.service at 95% of its limit under PSI 42%, killed by a
    sender of the given identity (its cgroup is id 30)."""
    out: list[Event] = [
        cgroup(20, "/app.slice/app.service", limit=512 * MiB),
        sample(10.0, 20, "/app.slice/app.service", usage=486 * MiB, limit=512 * MiB),
        pressured(10.0, 42.0, 300 * MiB),
        replace(
            sent(11.0, 300, 100, signal.SIGKILL, comm=comm), sender_exe=exe, sender_cgroup_id=30
        ),
        killed(11.0, 100, signal.SIGKILL, cg=20),
    ]
    if cg_path:
        out.insert(0, cgroup(30, cg_path))
    return out


def test_systemd_oomd_known_by_its_executable_is_a_userspace_oom_with_the_pressure() -> None:
    v = one(*oomd_kill(exe="/usr/lib/systemd/systemd-oomd"))
    assert (v.cause, v.confidence, v.sender_role) == ("userspace_oom", "high", "oom_daemon")
    assert v.sender_exe == "/usr/lib/systemd/systemd-oomd"
    assert "systemd-oomd (pid 300, a user-space OOM killer)" in v.summary
    assert "host memory PSI some 42%" in v.summary
    assert "/app.slice/app.service at 95% of 512.0 MiB" in v.summary
    what = [w for _, w in v.evidence]
    assert "host memory PSI some peaked at 42.0%, full 21.0% (avg10)" in what
    assert any(w.startswith("host MemAvailable fell to 300.0 MiB of ") for w in what)
    assert "/app.slice/app.service used 486.0 MiB of its 512.0 MiB limit (95%)" in what


def test_what_systemd_recorded_of_the_kill_is_quoted() -> None:
    """systemd's record of its unit's main process (read by the recorder as it ended):
    Result=oom-kill and the exit status join the evidence and the summary. A record that came
    after the verdict's settle, or one of another unit, is not used."""
    recorded = replace(runtime(11.4, "app.service", 0, "systemd"), exit_code=137, oom_killed=True)
    v = one(*oomd_kill(exe="/usr/lib/systemd/systemd-oomd"), recorded)
    assert (v.cause, v.confidence, v.unit) == ("userspace_oom", "high", "app.service")
    assert (recorded.ts, "systemd recorded exit code 137 for app.service, Result=oom-kill") in (
        v.evidence
    )
    assert "; systemd recorded it as an OOM kill" in v.summary
    for other in (replace(recorded, ts=recorded.ts + 2 * 10**9), replace(recorded, unit="x")):
        v = one(*oomd_kill(exe="/usr/lib/systemd/systemd-oomd"), other)
        assert v.cause == "userspace_oom" and "recorded" not in v.summary
        assert not [w for _, w in v.evidence if "recorded" in w]


def test_earlyoom_known_by_its_cgroup_though_python_runs_it() -> None:
    v = one(
        *oomd_kill(
            exe="/usr/bin/python3.11", comm="earlyoom", cg_path="/system.slice/earlyoom.service"
        )
    )
    assert (v.cause, v.confidence) == ("userspace_oom", "high")


def test_a_name_alone_is_medium_and_said() -> None:
    v = one(*oomd_kill(comm="earlyoom"))
    assert (v.cause, v.confidence) == ("userspace_oom", "medium")
    assert any("known only by its name (earlyoom)" in w for _, w in v.evidence)


def test_an_impostor_named_like_an_oom_killer_is_a_signal_kill() -> None:
    # anyone may call itself earlyoom (prctl); its executable says what it is
    v = one(*oomd_kill(exe="/tmp/x/evil", comm="earlyoom"))
    assert (v.cause, v.sender_role, v.confidence) == ("signal_kill", "other", "high")
    assert any("named earlyoom, but runs /tmp/x/evil" in w for _, w in v.evidence)


def test_kubelet_eviction_under_pressure_is_userspace_oom_and_without_is_not() -> None:
    events = oomd_kill(exe="/usr/bin/kubelet", comm="kubelet")
    term = replace(
        sent(5.0, 300, 100, signal.SIGTERM, comm="kubelet"), sender_exe="/usr/bin/kubelet"
    )
    v = one(term, *events)
    assert (v.cause, v.confidence, v.sender_role) == ("userspace_oom", "medium", "kubelet")
    assert "evicted by the kubelet (pid 300) with SIGTERM, then SIGKILL 6.0 s later" in v.summary
    calm = [e for e in events if not isinstance(e, HostSample)]
    calm = [replace(e, usage_bytes=100 * MiB) if hasattr(e, "usage_bytes") else e for e in calm]
    v = one(term, *calm, host(10.0, 20 * GiB))
    assert (v.cause, v.sender_role) == ("signal_kill", "kubelet")


def tree(sender_comm: str = "python3") -> list[Event]:
    """The supervisor (pid 50) started the server (pid 100) in the recorded tree."""
    return [
        execd(0.0, 50, 10, comm=sender_comm),
        forked(0.1, 50, 100, 10, comm=sender_comm),
        execd(0.2, 100, 10, comm="server"),
    ]


def failing(start: float, n: int, step: float = 0.3) -> list[Event]:
    return [probe(start + i * step, ok=False, timed_out=True, latency_ms=300) for i in range(n)]


def test_the_process_that_started_it_kills_it_after_failed_probes_a_probe_kill() -> None:
    events = [
        *tree(),
        probe(1.0, ok=True),
        *failing(2.0, 5),
        sent(3.5, 50, 100, signal.SIGKILL, comm="python3"),
        killed(3.5, 100, signal.SIGKILL, comm="server", ppid=50),
        exit_code(3.6, 50, 0, comm="python3"),
    ]
    v = next(v for v in judge(*events) if v.pid == 100)
    assert (v.cause, v.confidence, v.sender_role) == ("probe_kill", "high", "supervisor")
    assert "python3 (pid 50, the process that started it)" in v.summary
    assert "after failing health probes for 1.5 s" in v.summary
    assert v.probe_failures == 5


def test_slow_probes_only_make_a_medium_probe_kill() -> None:
    slow = [probe(2.0 + i, ok=True, latency_ms=1500) for i in range(3)]
    events = [
        *tree(),
        *slow,
        sent(5.5, 50, 100, signal.SIGTERM),
        killed(5.5, 100, signal.SIGTERM, ppid=50),
    ]
    v = next(v for v in judge(*events) if v.pid == 100)
    assert (v.cause, v.confidence) == ("probe_kill", "medium")
    assert "after slow health probes" in v.summary


def test_an_unrelated_kill_during_failing_probes_lists_them_and_stays_a_signal_kill() -> None:
    events = [
        *tree(),
        *failing(2.0, 4),
        sent(3.5, 777, 100, signal.SIGKILL, comm="bash"),
        killed(3.5, 100, signal.SIGKILL, comm="server", ppid=50),
    ]
    v = next(v for v in judge(*events) if v.pid == 100)
    assert (v.cause, v.sender_role) == ("signal_kill", "other")
    assert v.probe_failures == 4
    assert any(
        w == "health probes had failed for 1.5 s (4 in a row) before this exit"
        for _, w in v.evidence
    )
    assert sum(w.startswith("probe http://") for _, w in v.evidence) == 3


def test_passing_probes_are_not_listed_and_a_manual_kill_is_a_signal_kill() -> None:
    events = [
        *tree(),
        probe(1.0, ok=True),
        probe(2.0, ok=True),
        sent(2.5, 777, 100, signal.SIGKILL, comm="bash"),
        killed(2.5, 100, signal.SIGKILL, comm="server", ppid=50),
    ]
    v = next(v for v in judge(*events) if v.pid == 100)
    assert (v.cause, v.sender_role, v.probe_failures) == ("signal_kill", "other", 0)
    assert not any("probe" in w for _, w in v.evidence)


def test_an_exit_after_failing_probes_lists_them() -> None:
    v = next(
        v
        for v in judge(*tree(), *failing(2.0, 2), exit_code(3.0, 100, 1, comm="server", ppid=50))
        if v.pid == 100
    )
    assert (v.cause, v.probe_failures) == ("app_exit", 2)
    assert any("(2 in a row) before this exit" in w for _, w in v.evidence)


def test_classify_trusts_the_executable_over_the_name() -> None:
    c = senders.classify
    assert c("x", 300, 100, exe="/usr/bin/earlyoom").role == senders.ROLE_OOM_DAEMON
    assert c("earlyoom", 300, 100, exe="/usr/bin/earlyoom").identified_by == senders.BY_EXECUTABLE
    assert c("nohang", 300, 100, exe="/usr/bin/python3").identified_by == senders.BY_NAME
    assert c("x", 300, 100, cgroup="/system.slice/nohang-desktop.service").role == "other"
    assert c("x", 300, 100, cgroup="/system.slice/nohang.service").role == "oom_daemon"
    assert c("runc", 300, 100, exe="/tmp/runc-lookalike").role == "other"
    assert c("runc", 300, 100, exe="/usr/sbin/runc").role == "supervisor"
    assert c("anything", 300, 100, ancestor=True).identified_by == senders.BY_TREE


def test_verdict_json_matches_the_schema() -> None:
    import pytest

    jsonschema = pytest.importorskip("jsonschema")
    from tracer.outputs.schema import VERDICT

    v = one(*oomd_kill(exe="/usr/lib/systemd/systemd-oomd"))
    jsonschema.validate({**v.to_json(), "t": "+11.000s"}, VERDICT)


def test_the_recorder_reads_the_senders_executable(tmp_path: Path) -> None:
    from tracer.pipeline.enrich import SenderExe

    (tmp_path / "300").mkdir()
    (tmp_path / "300" / "exe").symlink_to("/usr/lib/systemd/systemd-oomd")
    enrich = SenderExe(proc_root=str(tmp_path))
    gone = sent(1.0, 301, 100, signal.SIGKILL, comm="kill")
    events: list[Event] = [sent(1.0, 300, 100, signal.SIGKILL, comm="x"), gone]
    out = enrich.enrich(events)
    assert [e.sender_exe for e in out if isinstance(e, Signal)] == [
        "/usr/lib/systemd/systemd-oomd",
        "",
    ]
    # cached for a second of stream time, forgotten at an exec of that pid
    (tmp_path / "300" / "exe").unlink()
    (tmp_path / "300" / "exe").symlink_to("/usr/bin/other")
    again = enrich.enrich([sent(1.5, 300, 100, signal.SIGKILL)])
    assert isinstance(again[0], Signal) and again[0].sender_exe == "/usr/lib/systemd/systemd-oomd"
    enrich.enrich([execd(1.6, 300, 10)])
    fresh = enrich.enrich([sent(1.7, 300, 100, signal.SIGKILL)])
    assert isinstance(fresh[0], Signal) and fresh[0].sender_exe == "/usr/bin/other"
