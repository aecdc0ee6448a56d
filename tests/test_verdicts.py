"""Tier 1: the verdict rules on small synthetic event streams (tests/streams.py)."""

from __future__ import annotations

import signal

import pytest

from tests.streams import (
    MiB,
    cgroup,
    exit_code,
    killed,
    kmsg,
    oom,
    oom_killer_sigkill,
    sent,
)
from tracer.analysis.verdicts import Analyzer, Verdict
from tracer.events import Event


def judge(*events: Event) -> list[Verdict]:
    return Analyzer().feed_all(events)


def test_plain_exit_code() -> None:
    [v] = judge(exit_code(1.0, 100, 23, comm="sh"))
    assert (v.cause, v.exit_code, v.confidence, v.pid) == ("app_exit", 23, "high", 100)
    assert "23" in v.summary


def test_signal_from_another_process_names_the_sender() -> None:
    [v] = judge(sent(1.0, 200, 100, comm="kill"), killed(1.01, 100, signal.SIGTERM))
    assert v.cause == "signal_kill"
    assert (v.sender_pid, v.sender_comm, v.signal) == (200, "kill", "SIGTERM")
    assert v.confidence == "high"


def test_signal_exit_without_a_sender_is_low_confidence() -> None:
    [v] = judge(killed(1.0, 100, signal.SIGTERM))
    assert (v.cause, v.confidence, v.sender_pid) == ("signal_kill", "low", None)
    assert v.disagreements


def test_cgroup_oom_names_the_limiting_cgroup_and_limit() -> None:
    [v] = judge(
        cgroup(20, "/parent", 64 * MiB),
        oom(1.0, 100, limit_cgroup=20),
        oom_killer_sigkill(1.0, 100, trigger=100),
        kmsg(1.0, 100, oom_memcg="/parent"),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert v.cause == "cgroup_oom"
    assert v.limit_cgroup == "/parent"
    assert v.limit_bytes == 64 * MiB
    assert v.confidence == "high"
    assert not v.disagreements


def test_oom_killers_own_sigkill_is_not_a_second_cause() -> None:
    verdicts = judge(
        oom(1.0, 100), oom_killer_sigkill(1.0, 100, trigger=300), killed(1.1, 100, signal.SIGKILL)
    )
    assert [v.cause for v in verdicts] == ["cgroup_oom"]
    assert verdicts[0].sender_pid is None


def test_bpf_only_oom_is_medium_confidence() -> None:
    [v] = judge(cgroup(20, "/x"), oom(1.0, 100), killed(1.1, 100, signal.SIGKILL))
    assert (v.cause, v.confidence) == ("cgroup_oom", "medium")


def test_kmsg_only_oom_still_names_the_memcg() -> None:
    [v] = judge(kmsg(1.0, 100, oom_memcg="/slice/app"), killed(1.1, 100, signal.SIGKILL))
    assert (v.cause, v.limit_cgroup, v.confidence) == ("cgroup_oom", "/slice/app", "medium")


def test_global_oom() -> None:
    [v] = judge(
        oom(1.0, 100, memcg=False), kmsg(1.0, 100, memcg=False), killed(1.1, 100, signal.SIGKILL)
    )
    assert (v.cause, v.limit_cgroup, v.confidence) == ("global_oom", None, "high")


def test_bpf_and_kmsg_disagreeing_on_the_cgroup_is_reported() -> None:
    [v] = judge(
        cgroup(20, "/a"),
        oom(1.0, 100, limit_cgroup=20),
        kmsg(1.0, 100, oom_memcg="/b"),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert v.cause == "cgroup_oom"
    assert v.confidence == "medium"
    assert any("/b" in d for d in v.disagreements)


def test_exit_137_alone_is_not_a_memory_verdict() -> None:
    [v] = judge(killed(1.0, 100, signal.SIGKILL))
    assert v.cause == "signal_kill"
    assert v.confidence == "low"


def test_oom_of_another_pid_does_not_leak() -> None:
    verdicts = judge(oom(1.0, 101), killed(1.1, 100, signal.SIGKILL))
    assert verdicts[0].cause == "signal_kill"


def test_oom_before_the_process_started_belongs_to_a_reused_pid() -> None:
    [v] = judge(oom(1.0, 100), killed(5.0, 100, signal.SIGKILL, start=2.0))
    assert v.cause == "signal_kill"


def test_segfault_is_a_crash_not_a_kill() -> None:
    [v] = judge(
        sent(1.0, 100, 100, signal.SIGSEGV, comm="app", code=1),
        killed(1.0, 100, signal.SIGSEGV, core=True),
    )
    assert v.cause == "app_exit"
    assert "SIGSEGV" in v.summary and "core dumped" in v.summary


def test_abort_is_the_app_itself() -> None:
    [v] = judge(
        sent(1.0, 100, 100, signal.SIGABRT, comm="app", code=-6), killed(1.0, 100, signal.SIGABRT)
    )
    assert v.cause == "app_exit"


def test_oom_reported_but_clean_exit_is_noted_as_disagreement() -> None:
    [v] = judge(oom(1.0, 100), exit_code(1.1, 100, 0))
    assert v.cause == "app_exit"
    assert v.disagreements


@pytest.mark.parametrize("n", [1, 3])
def test_oom_group_kills_give_one_verdict_each(n: int) -> None:
    events: list[Event] = [cgroup(20, "/grp")]
    for pid in range(100, 100 + n):
        events += [oom(1.0, pid), oom_killer_sigkill(1.0, pid, trigger=100)]
    events += [killed(1.1, pid, signal.SIGKILL) for pid in range(100, 100 + n)]
    verdicts = judge(*events)
    assert [v.cause for v in verdicts] == ["cgroup_oom"] * n
    assert {v.pid for v in verdicts} == set(range(100, 100 + n))


def test_pending_state_is_bounded() -> None:
    a = Analyzer()
    from tracer.analysis import verdicts as mod

    for pid in range(mod.MAX_PENDING + 10):
        a.feed(sent(1.0, 1, pid + 1000))
    assert a.evicted == 10
