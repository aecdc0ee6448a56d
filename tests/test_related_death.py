"""A main process that exits non-zero seconds after another process of its unit was OOM-killed
or killed by a signal passes that death on (issue 30 §2; rules.related_exit): an API server
exiting 1 after its worker's OOM kill (vllm#45626 "Failed core proc(s)", a gunicorn master
giving up) is the worker's OOM, at medium, with the gap as evidence. Pure: event streams."""

from __future__ import annotations

import signal

from tests.streams import (
    SI_KERNEL,
    MiB,
    cgroup,
    execd,
    exit_code,
    forked,
    judge,
    killed,
    kmsg,
    oom,
    sent,
    unit_info,
)
from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.events import Event

ID = "d" * 64


def worker_oom(at: float, worker: int, master: int = 100, cg: int = 50) -> list[Event]:
    """The kernel's OOM kill of ``worker``, a child of ``master``: its record, its report, its
    SIGKILL and the exit."""
    return [
        oom(at, worker, limit_cgroup=cg, victim_cg=cg),
        kmsg(at, worker, oom_memcg="/pyserver", comm="gunicorn"),
        sent(at, worker, worker, signal.SIGKILL, comm="gunicorn", code=SI_KERNEL),
        killed(at, worker, signal.SIGKILL, comm="gunicorn", cg=cg, ppid=master),
    ]


def server(*workers: int, cg: int = 50) -> list[Event]:
    """A gunicorn master (pid 100) in its own memory cgroup, with forked workers."""
    return [
        cgroup(cg, "/pyserver", 256 * MiB),
        execd(0.0, 100, cg, "gunicorn"),
        *(forked(0.2, 100, w, cg, "gunicorn") for w in workers),
    ]


def master_of(vs: list[Verdict]) -> Verdict:
    [v] = [v for v in vs if v.pid == 100]
    return v


def test_a_master_exiting_1_after_its_workers_oom_kill_passes_the_oom_on() -> None:
    vs = judge(
        *server(101, 102),
        *worker_oom(1.0, 101),
        exit_code(1.3, 100, 1, comm="gunicorn", cg=50),
    )
    [worker] = [v for v in vs if v.pid == 101]
    assert (worker.cause, worker.main) == ("cgroup_oom", False)
    v = master_of(vs)
    assert (v.cause, v.confidence, v.main, v.exit_code) == ("cgroup_oom", "medium", True, 1)
    line = "exited 1, 300 ms after its worker pid 101 (gunicorn) was OOM-killed"
    assert any(what == line for _, what in v.evidence)
    assert v.summary.startswith(line + ": ") and v.summary.count("OOM-killed") == 1
    # the worker's own evidence comes with it: the kernel's report of the kill
    assert any("pid 101" in what and "oom" in what.lower() for _, what in v.evidence)
    assert v.limit_cgroup == worker.limit_cgroup and v.limit_bytes == worker.limit_bytes


def test_the_oom_is_passed_on_even_when_the_master_then_stops_its_other_workers() -> None:
    # gunicorn's halt: SIGTERM to the workers left, which die of it, then exit 1. Those deaths
    # are the master's own doing; the first death, the OOM kill, is the cause.
    vs = judge(
        *server(101, 102),
        *worker_oom(1.0, 101),
        sent(1.1, 100, 102, signal.SIGTERM, comm="gunicorn"),
        killed(1.2, 102, signal.SIGTERM, comm="gunicorn", cg=50, ppid=100),
        exit_code(1.4, 100, 1, comm="gunicorn", cg=50),
    )
    v = master_of(vs)
    assert (v.cause, v.confidence) == ("cgroup_oom", "medium")
    assert "after its worker pid 101 (gunicorn) was OOM-killed" in v.summary


def test_a_worker_killed_by_another_process_is_passed_on_with_its_sender() -> None:
    vs = judge(
        *server(101),
        sent(1.0, 555, 101, signal.SIGKILL, comm="bash"),
        killed(1.0, 101, signal.SIGKILL, comm="gunicorn", cg=50, ppid=100),
        exit_code(2.5, 100, 3, comm="gunicorn", cg=50),
    )
    v = master_of(vs)
    assert (v.cause, v.confidence, v.exit_code) == ("signal_kill", "medium", 3)
    assert (v.sender_pid, v.sender_comm) == (555, "bash")
    assert "exited 3, 1.5 s after its worker pid 101 (gunicorn) was killed by SIGKILL" in v.summary


def test_an_exit_long_after_the_workers_death_is_the_masters_own() -> None:
    vs = judge(*server(101), *worker_oom(1.0, 101), exit_code(30.0, 100, 1, cg=50))
    v = master_of(vs)
    assert (v.cause, v.confidence, v.exit_code) == ("app_exit", "high", 1)


def test_a_clean_exit_after_a_workers_death_passes_nothing_on() -> None:
    vs = judge(*server(101), *worker_oom(1.0, 101), exit_code(1.2, 100, 0, cg=50))
    assert master_of(vs).cause == "app_exit"


def test_workers_the_master_stopped_itself_are_not_a_cause() -> None:
    vs = judge(
        *server(101),
        sent(1.0, 100, 101, signal.SIGKILL, comm="gunicorn"),  # its worker timeout
        killed(1.0, 101, signal.SIGKILL, comm="gunicorn", cg=50, ppid=100),
        exit_code(1.2, 100, 1, cg=50),
    )
    assert master_of(vs).cause == "app_exit"


def test_a_death_in_another_unit_is_not_passed_on() -> None:
    vs = judge(
        *server(101, cg=50),
        cgroup(60, "/other", 256 * MiB),
        execd(0.0, 200, 60, "gunicorn"),
        *worker_oom(1.0, 201, master=200, cg=60),
        exit_code(1.3, 100, 1, cg=50),
    )
    assert master_of(vs).cause == "app_exit"


def test_a_containers_restart_after_its_api_exits_1_names_the_workers_oom() -> None:
    # vllm#45626 in a container: the engine core (a child) is OOM-killed, the API server (the
    # container's main process) exits 1, the runtime restarts it
    a = Analyzer()
    vs = a.feed_all(
        [
            cgroup(50, f"/machine.slice/libpod-{ID}.scope", 256 * MiB),
            unit_info(50, "podman", "vllm", unit_id=ID),
            execd(0.0, 100, 50, "python3"),
            forked(0.2, 100, 101, 50, "python3"),
            *worker_oom(1.0, 101),
            exit_code(1.2, 100, 1, comm="python3", cg=50),
            execd(3.0, 300, 50, "python3"),
        ]
    )
    v = master_of(vs)
    assert (v.cause, v.confidence, v.main) == ("cgroup_oom", "medium", True)
    assert "exited 1, 200 ms after its worker pid 101 (gunicorn) was OOM-killed" in v.summary
    assert [(r.old_pid, r.new_pid, r.cause) for r in a.restarts] == [(100, 300, "cgroup_oom")]


def test_the_agents_analyzer_passes_it_on_alike() -> None:
    # the agent judges an OOM kill as soon as its evidence is in, and builds only the verdicts
    # it keeps: the master's exit still finds its worker's death
    vs = judge(
        *server(101, 102),
        *worker_oom(1.0, 101),
        exit_code(1.3, 100, 1, comm="gunicorn", cg=50),
        early_oom=True,
        every_verdict=False,
    )
    v = master_of(vs)
    assert (v.cause, v.confidence, v.exit_code) == ("cgroup_oom", "medium", 1)
