"""Tier 1: the verdict engine red-teamed (issue 24). Each case is an event stream of the shape a
real host produces rarely but an always-on agent meets: evidence late, missing, about another
process incarnation, another GPU or another target. The rule under test: never a wrong cause
at high confidence, whatever order and shape the evidence arrives in.
"""

from __future__ import annotations

import random
import signal
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.streams import (
    GiB,
    MiB,
    cgroup,
    execd,
    exit_code,
    forked,
    gpu_fail,
    gpu_lib,
    gpu_proc,
    gpu_sample,
    host,
    judge,
    killed,
    kmsg,
    oom,
    oom_killer_sigkill,
    probe,
    runtime,
    sample,
    sent,
    t,
    unit_info,
    xid,
)
from tracer.analysis import retention, senders
from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.analysis.units import unit_of_cgroup
from tracer.cli import main
from tracer.events import (
    SI_KERNEL,
    CgroupInfo,
    Event,
    Exit,
    GpuLost,
    Lost,
)
from tracer.outputs.text import Clock, verdict_table
from tracer.trace.format import TraceHeader
from tracer.trace.writer import TraceWriter

ID = "c" * 64


def by_pid(verdicts: list[Verdict]) -> dict[tuple[int, int], Verdict]:
    return {(v.pid, v.ts): v for v in verdicts}


def kernel_kill(at: float, pid: int, context: int | None = None) -> Event:
    """The kernel's SIGKILL (SI_KERNEL), sent in the context of ``context`` (the victim's own,
    by default: the OOM killer runs in whichever task's allocation failed)."""
    return sent(at, context or pid, pid, signal.SIGKILL, comm="app", code=SI_KERNEL)


def podman(cg: int, name: str, ident: str = ID) -> list[Event]:
    return [
        cgroup(cg, f"/machine.slice/libpod-{ident}.scope", 64 * MiB),
        unit_info(cg, "podman", name, unit_id=ident),
    ]


# -- 1. pid reuse: evidence belongs to a process incarnation ---------------------------------


def test_a_late_oom_report_is_not_the_next_process_with_the_pid() -> None:
    vs = judge(
        cgroup(20, "/p"),
        kernel_kill(1.0, 100),
        killed(1.0, 100, signal.SIGKILL, cg=20),
        execd(1.8, 100, 20),  # the pid is reused 0.8 s later
        host(2.5, GiB),  # (the first exit is judged: its report has not come)
        kmsg(1.0, 100, oom_memcg="/p"),  # ... and arrives now, stamped at the kill
        sent(3.0, 555, 100, signal.SIGKILL, comm="bash"),
        killed(3.0, 100, signal.SIGKILL, cg=20, start=1.8),
    )
    first, second = vs
    assert (first.cause, first.confidence) == ("unknown", "low")
    assert "not an OOM kill" not in first.summary
    assert (second.cause, second.confidence, second.sender_comm) == ("signal_kill", "high", "bash")


def test_an_oom_report_stamped_after_the_reuse_cannot_outweigh_the_users_kill() -> None:
    vs = judge(
        cgroup(20, "/p"),
        kernel_kill(1.0, 100),
        killed(1.0, 100, signal.SIGKILL, cg=20),
        execd(1.8, 100, 20),
        host(2.5, GiB),
        kmsg(1.9, 100, oom_memcg="/p"),  # stamped after the new process started
        sent(3.0, 555, 100, signal.SIGKILL, comm="bash"),
        killed(3.0, 100, signal.SIGKILL, cg=20, start=1.8),
    )
    second = vs[1]
    assert (second.cause, second.confidence, second.sender_comm) == (
        "signal_kill",
        "medium",
        "bash",
    )
    assert any("came from pid 555 (bash)" in d for d in second.disagreements)


def test_an_oom_report_of_a_process_whose_exit_was_missed_stays_with_it() -> None:
    [v] = judge(
        cgroup(20, "/p"),
        kernel_kill(1.0, 100),  # (its exit was never seen)
        execd(1.8, 100, 20),
        kmsg(1.0, 100, oom_memcg="/p"),
        sent(3.0, 555, 100, signal.SIGKILL, comm="bash"),
        killed(3.0, 100, signal.SIGKILL, cg=20, start=1.8),
    )
    assert (v.cause, v.confidence) == ("signal_kill", "high")
    assert not v.disagreements


def test_a_reused_pid_that_exits_1_inherits_nothing_from_the_oom_before_it() -> None:
    vs = judge(
        cgroup(20, "/p", 64 * MiB),
        oom(1.0, 100),
        kernel_kill(1.0, 100),
        killed(1.0, 100, signal.SIGKILL, cg=20),
        forked(1.2, 1, 100, 20),  # reused at once
        kmsg(1.3, 100, oom_memcg="/p"),  # the old kill's report, stamped late
        exit_code(3.0, 100, 1, cg=20, start=1.2),
    )
    first, second = vs
    assert (first.cause, first.confidence) == ("cgroup_oom", "high")
    assert (second.cause, second.confidence, second.disagreements) == ("app_exit", "high", ())


# -- 2. Xid on another GPU; two log lines are one source -------------------------------------


def two_gpus() -> list[Event]:
    return [
        gpu_lib(0.2, 100),
        gpu_sample(0.5, used=10 * GiB, index=0),
        gpu_sample(0.5, used=10 * GiB, index=1),
        gpu_proc(0.6, 100, 8 * GiB, index=0),
    ]


def kmsg_down(at: float) -> list[Event]:
    return [
        xid(at, 79),  # kernel log: a PCI bus, no NVML index
        GpuLost(ts=t(at), device="0000:3b:00", device_index=None, reason="fallen_off_bus",
                source="kmsg"),
    ]  # fmt: skip


def test_an_xid_of_a_gpu_that_may_not_be_its_own_is_not_its_cause() -> None:
    killed_ = judge(
        *two_gpus(),
        *kmsg_down(5.0),
        sent(5.5, 300, 100, signal.SIGTERM, comm="kill"),
        killed(5.5, 100, signal.SIGTERM),
    )
    assert [(v.cause, v.confidence) for v in killed_] == [("signal_kill", "high")]
    exited = judge(*two_gpus(), *kmsg_down(5.0), exit_code(5.5, 100, 1))
    assert [v.cause for v in exited] == ["app_exit"]
    nvml_other = judge(*two_gpus(), xid(5.0, 79, source="nvml", index=1), exit_code(5.5, 100, 1))
    assert [v.cause for v in nvml_other] == ["app_exit"]


def test_nvmls_bus_ids_match_a_kernel_log_xid_to_its_gpu() -> None:
    from msgspec.structs import replace

    def gpus(own: int) -> list[Event]:
        return [
            gpu_lib(0.2, 100),
            replace(gpu_sample(0.5, used=GiB, index=0), pci_bus_id="00000000:1A:00.0"),
            replace(gpu_sample(0.5, used=GiB, index=1), pci_bus_id="00000000:3B:00.0"),
            gpu_proc(0.6, 100, GiB, index=own),
        ]

    on_other = judge(*gpus(0), *kmsg_down(5.0), exit_code(5.5, 100, 1))  # 0000:3b:00 = GPU 1
    assert [v.cause for v in on_other] == ["app_exit"]
    on_its_own = judge(*gpus(1), *kmsg_down(5.0), exit_code(5.5, 100, 1))
    assert [(v.cause, v.confidence) for v in on_its_own] == [("device_reset", "medium")]


def test_two_kernel_log_lines_about_one_reset_are_one_source() -> None:
    [v] = judge(
        gpu_lib(0.2, 100),
        gpu_sample(0.5, used=10 * GiB, index=0),
        gpu_proc(0.6, 100, 8 * GiB, index=0),
        *kmsg_down(5.0),
        exit_code(5.5, 100, 1),
    )
    assert (v.cause, v.confidence) == ("device_reset", "medium")


# -- 3. probes belong to a target; consecutive failures up to the kill -----------------------


def failing_probes(*at: float, unit: str = "") -> list[Event]:
    return [probe(a, False, 1000, timed_out=True, unit=unit) for a in at]


def test_unlabelled_probes_do_not_make_a_kill_in_another_container_a_probe_kill() -> None:
    vs = judge(
        *podman(50, "model"),
        *podman(60, "other", "d" * 64),
        execd(0.0, 100, 50, "llm"),
        execd(0.0, 200, 60, "db"),
        *failing_probes(1.0, 2.0, 3.0),
        sent(3.5, 400, 200, signal.SIGTERM, comm="conmon"),
        killed(3.5, 200, signal.SIGTERM, cg=60),
    )
    assert [(v.pid, v.cause, v.sender_role) for v in vs] == [(200, "signal_kill", "supervisor")]


def test_a_probe_of_another_unit_is_not_this_ones() -> None:
    [v] = judge(
        *podman(50, "model"),
        execd(0.0, 100, 50, "llm"),
        *failing_probes(1.0, 2.0, 3.0, unit="podman other"),
        sent(3.5, 400, 100, signal.SIGTERM, comm="conmon"),
        killed(3.5, 100, signal.SIGTERM, cg=50),
    )
    assert v.cause == "signal_kill"


def test_a_probe_that_recovered_before_the_stop_did_not_drive_it() -> None:
    [v] = judge(
        *podman(50, "model"),
        execd(0.0, 100, 50, "llm"),
        *failing_probes(1.0, 2.0),
        probe(3.0, True),
        sent(3.5, 400, 100, signal.SIGTERM, comm="conmon"),
        killed(3.5, 100, signal.SIGTERM, cg=50),
    )
    assert (v.cause, v.confidence) == ("signal_kill", "high")


def test_consecutive_failures_to_the_kill_make_a_probe_kill_of_a_recorded_command() -> None:
    stream: list[Event] = [
        execd(0.0, 100, 10, "serve"),
        *failing_probes(1.0, 2.0, 3.0),
        sent(3.5, 777, 100, signal.SIGKILL, comm="watchdog"),
        killed(3.5, 100, signal.SIGKILL),
    ]
    [v] = judge(*stream, supervisor_pids=[777])
    assert (v.cause, v.confidence, v.sender_role) == ("probe_kill", "high", "supervisor")
    # the threshold is the recording's: two in a row are not enough at 3, enough at 2
    two = [e for e in stream if e.ts != t(1.0)]
    assert judge(*two, supervisor_pids=[777])[0].cause == "signal_kill"
    a = Analyzer.from_header({"supervisor_pids": [777], "probe_failure_threshold": 2})
    assert a.feed_all(two)[0].cause == "probe_kill"


def test_a_runtimes_own_health_check_counts_its_failures_itself() -> None:
    # podman --health-retries 1 --health-on-failure=kill: one failed check, then its kill
    check = probe(3.0, False, 20, unit="podman model", target="healthcheck")
    [v] = judge(
        *podman(50, "model"),
        execd(0.0, 100, 50, "llm"),
        probe(2.0, True, 20, unit="podman model", target="healthcheck"),
        check,
        sent(3.2, 400, 100, signal.SIGKILL, comm="podman"),
        killed(3.2, 100, signal.SIGKILL, cg=50),
    )
    assert (v.cause, v.confidence) == ("probe_kill", "high")


def test_the_recorded_threshold_travels_in_the_header() -> None:
    from tracer.pipeline.record import Targets

    targets = Targets(pids=[100], probe_failures=2).describe()
    assert targets["probe_failure_threshold"] == 2
    assert Analyzer.from_header(targets).probe_failures == 2
    r = CliRunner().invoke(main, ["record", "-o", "x.trace", "--probe-failures", "2", "--", "true"])
    assert r.exit_code == 2 and "--probe-failures need --probe" in r.stderr


# -- 4. the kernel is not the process --------------------------------------------------------


def test_a_kernel_sigkill_in_the_processs_own_context_is_not_its_own_doing() -> None:
    [v] = judge(
        gpu_lib(0.5, 100),
        gpu_fail(1.0, 100),
        kernel_kill(2.0, 100),  # an OOM kill whose report never came
        killed(2.0, 100, signal.SIGKILL),
    )
    assert v.cause != "gpu_oom" and v.confidence != "high"
    assert not any("raised by the process itself" in what for _, what in v.evidence)


def test_a_fault_the_kernel_raises_is_still_the_processs_crash() -> None:
    [v] = judge(
        sent(1.0, 100, 100, signal.SIGSEGV, code=SI_KERNEL), killed(1.0, 100, 11, core=True)
    )
    assert (v.cause, v.confidence) == ("app_exit", "high")
    assert "crashed with SIGSEGV" in v.summary


# -- 5. disagreement drops confidence, whichever rule ----------------------------------------


def test_a_gpu_oom_with_a_disagreement_is_medium_even_with_the_device_full() -> None:
    [v] = judge(gpu_sample(0.9, used=79 * GiB), gpu_fail(1.0, 100), exit_code(56.0, 100, 1))
    assert (v.cause, v.confidence) == ("gpu_oom", "medium")
    assert any("55 s before the exit" in d for d in v.disagreements)


def test_a_signal_kill_with_an_oom_report_against_it_is_medium() -> None:
    [v] = judge(
        kmsg(1.0, 100),
        sent(1.0, 555, 100, signal.SIGKILL, comm="bash"),
        killed(1.0, 100, signal.SIGKILL),
    )
    assert (v.cause, v.confidence) == ("signal_kill", "medium")


# -- 6. restarts -----------------------------------------------------------------------------


def test_an_init_passes_its_childs_oom_kill_on_and_the_restart_says_so() -> None:
    a = Analyzer()
    vs = a.feed_all(
        [
            *podman(50, "model"),
            execd(0.0, 10, 50, "tini"),
            forked(0.1, 10, 11, 50, "tini"),
            execd(0.1, 11, 50, "llm"),
            oom(1.0, 11, limit_cgroup=50, victim_cg=50),
            kmsg(1.0, 11, oom_memcg=f"/machine.slice/libpod-{ID}.scope"),
            kernel_kill(1.0, 11),
            killed(1.0, 11, signal.SIGKILL, cg=50, ppid=10),
            exit_code(1.01, 10, 137, comm="tini", cg=50),
            execd(2.0, 20, 50, "tini"),
        ]
    )
    child, init = sorted(vs, key=lambda v: v.ts)
    assert (child.cause, child.main) == ("cgroup_oom", False)
    assert (init.cause, init.confidence, init.main, init.exit_code) == (
        "cgroup_oom",
        "medium",
        True,
        137,
    )
    assert "passing on the death of pid 11" in init.summary
    assert [(r.old_pid, r.new_pid, r.cause) for r in a.restarts] == [(10, 20, "cgroup_oom")]


def test_a_reparented_worker_stopped_by_systemd_is_not_the_main_process() -> None:
    a = Analyzer()
    vs = a.feed_all(
        [
            cgroup(40, "/system.slice/llm.service", 4 * GiB),
            execd(0.0, 100, 40, "llm"),
            forked(0.5, 100, 101, 40, "llm"),
            oom(1.0, 100, limit_cgroup=40, victim_cg=40),
            kmsg(1.0, 100, oom_memcg="/system.slice/llm.service"),
            killed(1.0, 100, signal.SIGKILL, cg=40),
            sent(1.2, 1, 101, signal.SIGTERM, comm="systemd"),
            killed(1.2, 101, signal.SIGTERM, cg=40, ppid=1),  # reparented to systemd
            execd(3.0, 200, 40, "llm"),
        ]
    )
    assert [(v.pid, v.main) for v in vs] == [(100, True), (101, False)]
    assert [(r.old_pid, r.new_pid, r.cause) for r in a.restarts] == [(100, 200, "cgroup_oom")]


def test_a_later_process_reusing_the_pid_does_not_relabel_a_restart() -> None:
    a = Analyzer()
    a.feed_all(
        [
            *podman(50, "model"),
            execd(0.0, 100, 50, "llm"),
            oom(1.0, 100, limit_cgroup=50, victim_cg=50),
            kmsg(1.0, 100),
            killed(1.0, 100, signal.SIGKILL, cg=50),
            execd(2.0, 200, 50, "llm"),
            *podman(60, "other", "d" * 64),
            execd(4.0, 100, 60, "db"),  # pid 100 again, main of another container
            exit_code(5.0, 100, 0, cg=60, start=4.0),
        ]
    )
    assert [(r.old_pid, r.new_pid, r.cause) for r in a.restarts] == [(100, 200, "cgroup_oom")]


def test_systemd_helpers_are_not_restarts() -> None:
    a = Analyzer()
    a.feed_all(
        [
            cgroup(40, "/system.slice/llm.service", 4 * GiB),
            execd(0.0, 90, 40, "mkdir"),  # ExecStartPre
            exit_code(0.05, 90, 0, cg=40, comm="mkdir"),
            execd(0.1, 100, 40, "llm"),
            oom(5.0, 100, limit_cgroup=40, victim_cg=40),
            kmsg(5.0, 100, oom_memcg="/system.slice/llm.service"),
            killed(5.0, 100, signal.SIGKILL, cg=40),
            execd(5.1, 110, 40, "cleanup"),  # ExecStopPost
            exit_code(5.2, 110, 0, cg=40, comm="cleanup"),
            execd(5.5, 120, 40, "mkdir"),  # ExecStartPre of the next start
            exit_code(5.55, 120, 0, cg=40, comm="mkdir"),
            execd(5.6, 130, 40, "llm"),
        ]
    )
    [r] = a.restarts
    assert (r.old_pid, r.new_pid, r.cause, r.downtime_ns) == (100, 130, "cgroup_oom", t(0.6))


def test_a_supervisor_count_read_after_the_restarts_is_unknown_not_invented() -> None:
    a = Analyzer()
    a.feed_all(
        [
            *podman(50, "model"),
            execd(0.0, 100, 50, "llm"),
            exit_code(1.0, 100, 1, cg=50),
            execd(2.0, 200, 50, "llm"),
            exit_code(3.0, 200, 1, cg=50),
            execd(4.0, 300, 50, "llm"),
            runtime(5.0, "podman model", 1),  # its first reading, after both restarts
        ]
    )
    assert a.restart_counts() == [("podman model", 2, None, "podman")]
    text = verdict_table(a.verdicts, Clock(0, 0), restart_counts=a.restart_counts())
    assert "podman's count for them is unknown" in text and "agrees" not in text


def test_podmans_conmon_scope_is_not_the_container() -> None:
    assert unit_of_cgroup(f"/machine.slice/libpod-conmon-{ID}.scope").kind == "conmon"  # type: ignore[union-attr]
    a = Analyzer()
    a.feed_all(
        [
            *podman(50, "model"),
            cgroup(51, f"/machine.slice/libpod-conmon-{ID}.scope"),
            execd(0.0, 100, 50, "llm"),
            exit_code(1.0, 100, 1, cg=50),
            execd(1.2, 150, 51, "podman"),  # the cleanup conmon starts after the exit
        ]
    )
    assert a.restarts == []


# -- 7. late or missing kernel log -----------------------------------------------------------


def test_a_kernel_kill_without_a_report_is_unknown_not_denied() -> None:
    [v] = judge(kernel_kill(1.0, 100), killed(1.0, 100, signal.SIGKILL))
    assert (v.cause, v.confidence) == ("unknown", "low")
    assert "not an OOM kill" not in v.summary and "no OOM report" in v.summary


def test_lost_records_around_a_kernel_kill_are_named() -> None:
    [v] = judge(Lost(ts=t(0.9), count=42), kernel_kill(1.0, 100), killed(1.0, 100, signal.SIGKILL))
    assert v.cause == "unknown"
    assert "42 records were lost" in v.summary
    assert any("42 records lost" in what for _, what in v.evidence)


def test_a_kernel_kill_with_the_oom_counter_rising_is_a_medium_cgroup_oom() -> None:
    [v] = judge(
        cgroup(20, "/p", 64 * MiB),
        sample(0.5, 20, "/p", events={"oom_kill": 0}),
        kernel_kill(1.0, 100),
        killed(1.0, 100, signal.SIGKILL, cg=20),
        sample(1.05, 20, "/p", events={"oom_kill": 1}),
    )
    assert (v.cause, v.confidence, v.limit_cgroup) == ("cgroup_oom", "medium", "/p")


def test_a_kernel_kill_from_the_exiting_init_is_the_end_of_its_namespace() -> None:
    vs = judge(
        *podman(50, "model"),
        execd(0.0, 10, 50, "init"),
        forked(0.1, 10, 11, 50, "worker"),
        exit_code(1.0, 10, 2, cg=50, comm="init"),
        kernel_kill(1.0, 11, context=10),
        killed(1.0, 11, signal.SIGKILL, cg=50, ppid=10),
    )
    worker = next(v for v in vs if v.pid == 11)
    assert (worker.cause, worker.confidence) == ("signal_kill", "medium")
    assert "init (pid 10) exited" in worker.summary


# -- 8. the cgroup that existed at the kill --------------------------------------------------


def test_a_recreated_cgroup_at_the_same_path_is_not_the_one_that_killed() -> None:
    [v] = judge(
        cgroup(30, "/svc/app", 64 * MiB),
        sample(0.5, 30, "/svc/app", events={"oom_kill": 0}),
        kmsg(1.0, 100, oom_memcg="/svc/app"),
        kernel_kill(1.0, 100),
        killed(1.0, 100, signal.SIGKILL, cg=30),
        sample(1.05, 30, "/svc/app", events={"oom_kill": 1}),
        CgroupInfo(ts=t(1.5), cgroup_id=31, path="/svc/app", hierarchy="memory",
                   limit_bytes=64 * MiB),  # the restart made it anew
    )  # fmt: skip
    assert (v.cause, v.limit_scope, v.confidence) == ("cgroup_oom", "own", "high")
    assert "raise that limit" in v.advice
    assert any("oom_kill counter" in what for _, what in v.evidence)


def test_the_kernel_logs_oom_cgroup_wins_over_the_ancestor_walks_guess() -> None:
    stream: list[Event] = [
        cgroup(20, "/a"),
        cgroup(21, "/a/b"),
        kmsg(1.0, 100, oom_memcg="/a/b"),
        killed(1.1, 100, signal.SIGKILL, cg=21),
    ]
    [v] = judge(oom(1.0, 100, limit_cgroup=20, rung="tp_btf", victim_cg=21), *stream)
    assert (v.limit_cgroup, v.confidence) == ("/a/b", "medium")
    assert any("/a/b" in d for d in v.disagreements)
    # where BPF read the OOM's own memcg (oc->memcg), it stays
    [v] = judge(oom(1.0, 100, limit_cgroup=20, rung="kprobe", victim_cg=21), *stream)
    assert (v.limit_cgroup, v.confidence) == ("/a", "medium")


# -- 9. one absurd timestamp -----------------------------------------------------------------


def test_one_absurd_timestamp_is_set_aside_with_a_warning() -> None:
    a = Analyzer()
    vs = a.feed_all(
        [
            cgroup(20, "/p", 64 * MiB),
            host(0.5, GiB),
            oom(1.0, 100),
            kmsg(1.0, 100, oom_memcg="/p"),
            sample(1.02, 20, "/p", usage=MiB),
            killed(1.0, 100, signal.SIGKILL, cg=20),
            host(2**62 / 1e9, GiB),  # one sample from nowhere
            host(1.5, GiB),
            host(2.5, GiB),
        ]
    )
    assert [(v.cause, v.confidence) for v in vs] == [("cgroup_oom", "high")]
    assert a.set_aside == 1 and "set aside" in a.warnings[0]


def test_a_quiet_hour_then_life_is_not_a_bad_timestamp() -> None:
    a = Analyzer()
    vs = a.feed_all(
        [
            host(0.5, GiB),
            host(1.0, GiB),
            sent(3600.0, 200, 100, comm="kill"),
            killed(3600.0, 100, signal.SIGTERM, start=10.0),
            host(3600.5, GiB),
        ]
    )
    assert [(v.cause, v.sender_comm) for v in vs] == [("signal_kill", "kill")]
    assert a.warnings == []


# -- 10. retention keeps what matters --------------------------------------------------------


def test_an_oom_kill_after_thousands_of_crashes_is_judged_and_kept(tmp_path: Path) -> None:
    events: list[Event] = [cgroup(20, "/p", 64 * MiB)]
    n = retention.MAX_KEPT + 500
    for i in range(n):
        events.append(exit_code(1.0 + i * 0.001, 1000 + i, 1))
    events += [oom(20.0, 100), kmsg(20.0, 100, oom_memcg="/p"), killed(20.0, 100, 9, cg=20)]
    a = Analyzer(every_verdict=False)
    a.feed_all(events)
    assert len(a.verdicts) == retention.MAX_KEPT
    assert [v.pid for v in a.verdicts if v.cause == "cgroup_oom"] == [100]
    assert a.not_kept == n + 1 - retention.MAX_KEPT
    # and `explain --pid` finds it in the trace
    path = tmp_path / "many.trace"
    header = TraceHeader(tool_version="t", host="h", kernel="k", cgroup={}, clock_offset_ns=0,
                         hooks={}, targets={}, started_ns=0)  # fmt: skip
    w = TraceWriter.open(path, header)
    w.write_many(events)
    w.close(w.make_footer("command exited", ended_ns=t(30.0)))
    r = CliRunner().invoke(main, ["explain", "--json", "--pid", "100", str(path)])
    assert r.exit_code == 0 and '"cause": "cgroup_oom"' in r.stdout


def test_kills_past_the_cap_are_counted() -> None:
    a = Analyzer(every_verdict=False)
    events: list[Event] = []
    for i in range(retention.MAX_KEPT + 3):
        at = 1.0 + i * 0.001
        events += [sent(at, 2, 1000 + i, comm="kill"), killed(at, 1000 + i, signal.SIGTERM)]
    a.feed_all(events)
    assert len(a.verdicts) == retention.MAX_KEPT
    assert a.kept.kills_not_kept == a.not_kept == 3


# -- 11. smaller ones ------------------------------------------------------------------------


def test_supervisors_are_known_by_their_whole_name() -> None:
    for comm in ("initdb", "tinit", "runcached", "dockerize", "systemd-tmpfile"):
        assert senders.classify(comm, 300, 100).role == senders.ROLE_OTHER, comm
    for comm in ("systemd", "init", "conmon", "containerd-shim", "tini", "docker-init"):
        assert senders.classify(comm, 300, 100).role == senders.ROLE_SUPERVISOR, comm
    assert senders.classify("low-memory-moni", 300, 100).role == senders.ROLE_OOM_DAEMON


def test_an_oom_victim_that_takes_minutes_to_die_is_still_an_oom_kill() -> None:
    stream: list[Event] = [
        cgroup(20, "/p", 64 * MiB),
        oom(1.0, 100),
        kmsg(1.0, 100, oom_memcg="/p"),
        kernel_kill(1.0, 100),
    ]
    stream += [host(2.0 + i, GiB) for i in range(0, 90, 5)]
    stream.append(killed(91.0, 100, signal.SIGKILL, cg=20, start=0.5))
    [v] = judge(*stream)
    assert (v.cause, v.confidence) == ("cgroup_oom", "high")


def test_a_negative_status_is_rejected_not_shown_as_a_signal(tmp_path: Path) -> None:
    path = tmp_path / "neg.trace"
    header = TraceHeader(tool_version="t", host="h", kernel="k", cgroup={}, clock_offset_ns=0,
                         hooks={}, targets={}, started_ns=0)  # fmt: skip
    w = TraceWriter.open(path, header)
    w.write(Exit(ts=t(1.0), pid=100, ppid=1, comm="app", cgroup_id=10, status=-9, start_ns=0))
    w.close(w.make_footer("command exited", ended_ns=t(2.0)))
    r = CliRunner().invoke(main, ["replay", str(path)])
    assert r.exit_code != 0
    assert "line 2" in r.stderr and "status" in r.stderr and "SIG119" not in r.stdout


# -- the property: arrival order and late evidence never make a confident wrong answer -------


def scenario() -> list[Event]:
    """Every kind of ending, with the evidence each needs, on one timeline."""
    p = "/machine.slice/libpod-" + ID + ".scope"
    return [
        *podman(50, "model"),
        cgroup(20, "/p", 64 * MiB),
        host(0.0, GiB),
        execd(0.0, 10, 50, "llm"),
        sample(0.5, 20, "/p", usage=60 * MiB, events={"oom_kill": 0}),
        sample(0.5, 50, p, usage=60 * MiB, events={"oom_kill": 0}),
        # a cgroup OOM kill, three sources
        oom(1.0, 100),
        oom_killer_sigkill(1.0, 100, trigger=100),
        kmsg(1.0, 100, oom_memcg="/p"),
        killed(1.0, 100, signal.SIGKILL, cg=20),
        sample(1.1, 20, "/p", usage=MiB, events={"oom_kill": 1}),
        # a kill by a user
        sent(2.0, 300, 101, comm="kill"),
        killed(2.0, 101, signal.SIGTERM),
        # an exit code, a crash
        exit_code(2.5, 102, 3),
        sent(3.0, 103, 103, signal.SIGSEGV, code=1),
        killed(3.0, 103, signal.SIGSEGV, core=True, start=2.0),
        # a GPU OOM
        gpu_lib(3.1, 104),
        gpu_fail(3.5, 104),
        exit_code(4.0, 104, 1),
        # the container's main process: probes fail, conmon kills it
        *failing_probes(4.0, 5.0, 6.0, unit="podman model"),
        sent(6.5, 400, 10, signal.SIGKILL, comm="conmon"),
        killed(6.5, 10, signal.SIGKILL, cg=50),
        execd(7.0, 11, 50, "llm"),
        # a kmsg-only OOM kill in the container, then the pid reused
        kmsg(8.0, 105, oom_memcg=p),
        oom_killer_sigkill(8.0, 105, trigger=105),
        killed(8.0, 105, signal.SIGKILL, cg=50, ppid=11),
        sample(8.2, 50, p, usage=MiB, events={"oom_kill": 1}),
        forked(8.5, 11, 105, 50),
        sent(9.0, 300, 105, signal.SIGKILL, comm="bash"),
        killed(9.0, 105, signal.SIGKILL, cg=50, start=8.5, ppid=11),
        host(10.0, GiB),
        host(20.0, GiB),
    ]


LATE = ("kmsg_oom", "cg_sample")  # the kernel log and the counters: the evidence that lags


def arrive(events: list[Event], rnd: random.Random, lag_s: float) -> list[Event]:
    """The stream as it may arrive: any order within the settle window, the kernel log and
    counter samples up to ``lag_s`` late (their timestamps unchanged)."""
    keyed = []
    for i, ev in enumerate(events):
        delay = rnd.uniform(0, 0.99)
        if ev.KIND in LATE:
            delay += rnd.uniform(0, lag_s)
        keyed.append((ev.ts + t(delay), i, ev))
    return [ev for _, _, ev in sorted(keyed)]


@settings(max_examples=80, deadline=None)
@given(st.randoms(use_true_random=False), st.floats(0.0, 5.0))
def test_late_and_shuffled_evidence_never_gives_a_different_cause_at_high_confidence(
    rnd: random.Random, lag_s: float
) -> None:
    events = scenario()
    truth = by_pid(judge(*events))
    assert sorted((ts, pid, v.cause, v.confidence) for (pid, ts), v in truth.items()) == [
        (t(1.0), 100, "cgroup_oom", "high"),
        (t(2.0), 101, "signal_kill", "high"),
        (t(2.5), 102, "app_exit", "high"),
        (t(3.0), 103, "app_exit", "high"),
        (t(4.0), 104, "gpu_oom", "high"),
        (t(6.5), 10, "probe_kill", "high"),
        (t(8.0), 105, "cgroup_oom", "high"),
        (t(9.0), 105, "signal_kill", "high"),
    ]
    got = judge(*arrive(events, rnd, lag_s))
    for v in got:
        if v.disagreements:
            assert v.confidence != "high", v
        want = truth[(v.pid, v.ts)]
        if v.cause != want.cause:
            assert v.confidence != "high", (v.pid, v.cause, want.cause)


def test_a_device_report_about_another_gpu_and_pid_never_explains_a_users_sigterm() -> None:
    """Issue 33 red team: an Xid naming another device's bus id and another process, then a
    user's SIGTERM to a process on GPU 0: the sender explains the exit, the Xid does not, on
    one GPU known to NVML as on two."""
    from msgspec.structs import replace

    for indexes in ((0,), (0, 1)):
        gpus: list[Event] = [gpu_lib(0.2, 100)]
        for i in indexes:
            sample_ = gpu_sample(0.5, used=GiB, index=i)
            gpus.append(replace(sample_, pci_bus_id=f"00000000:{0x1A + 0x21 * i:02X}:00.0"))
        gpus.append(gpu_proc(0.6, 100, GiB, index=0))
        other = replace(xid(5.0, 79, pid=999), device="0000:5e:00")  # on no GPU of process 100
        [v] = judge(
            *gpus,
            other,
            sent(5.5, 300, 100, signal.SIGTERM, comm="bash"),
            killed(5.5, 100, signal.SIGTERM),
        )
        assert (v.cause, v.sender_comm, v.confidence) == ("signal_kill", "bash", "high"), indexes
