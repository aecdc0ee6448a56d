"""Tier 1: the verdict rules, one small synthetic event stream per cause and hard case
(tests/streams.py keeps them readable: times in seconds, pids and cgroup ids chosen per test).
"""

from __future__ import annotations

import random
import signal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from tests.streams import (
    MiB,
    cgroup,
    execd,
    exit_code,
    forked,
    host,
    judge,
    killed,
    kmsg,
    one,
    oom,
    oom_killer_sigkill,
    probe,
    reclaim,
    runtime,
    sample,
    sent,
    t,
    unit_info,
)
from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.events import Event, Exec

GiB = 1024 * MiB


# -- plain causes --------------------------------------------------------------------------


def test_plain_exit_code() -> None:
    v = one(exit_code(1.0, 100, 23, comm="sh"))
    assert (v.cause, v.exit_code, v.confidence, v.pid) == ("app_exit", 23, "high", 100)
    assert "23" in v.summary


def test_signal_from_another_process_names_the_sender() -> None:
    v = one(sent(1.0, 200, 100, comm="kill"), killed(1.01, 100, signal.SIGTERM))
    assert v.cause == "signal_kill"
    assert (v.sender_pid, v.sender_comm, v.signal, v.sender_role) == (
        200,
        "kill",
        "SIGTERM",
        "other",
    )
    assert v.confidence == "high"


def test_the_first_delivered_signal_is_blamed_not_a_redundant_later_one() -> None:
    # a user's SIGKILL, then conmon's own while the group is already exiting: the kernel
    # reports conmon's as ignored (TRACE_SIGNAL_IGNORED), and the user's killed it
    late = replace(sent(1.02, 300, 100, signal.SIGKILL, comm="conmon"), result=1)
    v = one(sent(1.0, 200, 100, signal.SIGKILL), late, killed(1.03, 100, signal.SIGKILL))
    assert (v.cause, v.sender_pid, v.sender_comm, v.sender_role) == (
        "signal_kill",
        200,
        "kill",
        "other",
    )
    # a signal that was already pending is not the one either
    pending = replace(sent(0.9, 400, 100, signal.SIGTERM, comm="other"), result=2)
    v = one(pending, sent(1.0, 200, 100), killed(1.03, 100, signal.SIGTERM))
    assert (v.sender_pid, v.sender_comm) == (200, "kill")


def test_signal_exit_without_a_sender_is_unknown_and_says_what_is_missing() -> None:
    v = one(killed(1.0, 100, signal.SIGTERM))
    assert (v.cause, v.confidence, v.sender_pid) == ("unknown", "low", None)
    assert "no signal event" in v.disagreements[-1]


def test_exit_137_alone_is_not_a_memory_verdict() -> None:
    v = one(killed(1.0, 100, signal.SIGKILL))
    assert v.cause == "unknown"


def test_segfault_is_a_crash_not_a_kill() -> None:
    v = one(
        sent(1.0, 100, 100, signal.SIGSEGV, comm="app", code=1),
        killed(1.0, 100, signal.SIGSEGV, core=True),
    )
    assert v.cause == "app_exit"
    assert "SIGSEGV" in v.summary and "core dumped" in v.summary


def test_abort_is_the_app_itself() -> None:
    v = one(
        sent(1.0, 100, 100, signal.SIGABRT, comm="app", code=-6), killed(1.0, 100, signal.SIGABRT)
    )
    assert v.cause == "app_exit" and "abort" in v.summary
    assert v.summary == "aborted itself with SIGABRT (abort(), e.g. a failed assertion)"


def test_a_self_sent_sigkill_is_not_called_abort() -> None:
    """Issue 22 finding 7: `sh -c 'kill -9 $$'` was "killed itself with SIGKILL (e.g.
    abort())", but abort() raises SIGABRT."""
    v = one(
        sent(1.0, 100, 100, signal.SIGKILL, comm="sh", code=0), killed(1.0, 100, signal.SIGKILL)
    )
    assert v.cause == "app_exit" and "abort" not in v.summary + v.advice
    assert v.summary == "killed itself with SIGKILL (it sent the signal to itself, e.g. kill -9 $$)"


def test_an_offset_before_the_start_has_one_sign() -> None:
    """Finding 7: negative offsets printed as "+-0.008s"."""
    from tracer.outputs.text import Clock

    clock = Clock(10_000_000_000, None)
    assert clock.rel(9_992_000_000) == "-0.008s"
    assert clock.rel(10_008_000_000) == "+0.008s"
    assert clock.rel(10_000_000_000) == "+0.000s"


# -- memory --------------------------------------------------------------------------------


def test_cgroup_oom_names_the_limiting_cgroup_and_limit() -> None:
    v = one(
        cgroup(20, "/parent", 64 * MiB),
        oom(1.0, 100, limit_cgroup=20),
        oom_killer_sigkill(1.0, 100, trigger=100),
        kmsg(1.0, 100, oom_memcg="/parent"),
        killed(1.1, 100, signal.SIGKILL, cg=20),
    )
    assert (v.cause, v.limit_cgroup, v.limit_bytes, v.limit_scope) == (
        "cgroup_oom",
        "/parent",
        64 * MiB,
        "own",
    )
    assert v.confidence == "high"
    assert not v.disagreements


def test_the_limit_on_an_ancestor_is_named_as_such() -> None:
    v = one(
        cgroup(20, "/model.slice", 8 * GiB),
        cgroup(30, "/model.slice/llm.service", 16 * GiB),
        oom(1.0, 100, limit_cgroup=20, limit=8 * GiB, usage=8 * GiB, victim_cg=30),
        kmsg(1.0, 100, oom_memcg="/model.slice"),
        killed(1.1, 100, signal.SIGKILL, cg=30),
    )
    assert (v.limit_cgroup, v.limit_scope) == ("/model.slice", "ancestor")
    assert "raise the parent limit" in v.advice


def test_oom_killers_own_sigkill_is_not_a_second_cause() -> None:
    verdicts = judge(
        oom(1.0, 100), oom_killer_sigkill(1.0, 100, trigger=300), killed(1.1, 100, signal.SIGKILL)
    )
    assert [v.cause for v in verdicts] == ["cgroup_oom"]
    assert verdicts[0].sender_pid is None
    assert any("OOM killer" in what for _, what in verdicts[0].evidence)


def test_bpf_only_oom_is_medium_confidence() -> None:
    v = one(cgroup(20, "/x"), oom(1.0, 100), killed(1.1, 100, signal.SIGKILL))
    assert (v.cause, v.confidence) == ("cgroup_oom", "medium")


def test_kmsg_only_oom_still_names_the_memcg_with_medium_confidence() -> None:
    v = one(kmsg(1.0, 100, oom_memcg="/slice/app"), killed(1.1, 100, signal.SIGKILL))
    assert (v.cause, v.limit_cgroup, v.confidence) == ("cgroup_oom", "/slice/app", "medium")


def test_bpf_and_the_oom_kill_counter_agree_for_high_confidence() -> None:
    v = one(
        cgroup(20, "/x", 64 * MiB),
        sample(0.5, 20, "/x", usage=60 * MiB, events={"oom_kill": 0}),
        oom(1.0, 100),
        sample(1.05, 20, "/x", usage=10 * MiB, events={"oom_kill": 1}),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert (v.cause, v.confidence) == ("cgroup_oom", "high")
    assert any("oom_kill counter" in what for _, what in v.evidence)


def test_global_oom() -> None:
    v = one(
        oom(1.0, 100, memcg=False), kmsg(1.0, 100, memcg=False), killed(1.1, 100, signal.SIGKILL)
    )
    assert (v.cause, v.limit_cgroup, v.confidence) == ("global_oom", None, "high")


def test_the_kernel_logs_constraint_wins_over_a_walk_rungs_guessed_scope() -> None:
    # a global OOM while the victim's cgroup sat near its limit: the walk guessed memcg
    v = one(
        cgroup(20, "/x", 64 * MiB),
        oom(1.0, 100, rung="tp_btf"),
        kmsg(1.0, 100, memcg=False),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert (v.cause, v.limit_cgroup, v.limit_bytes) == ("global_oom", None, None)
    assert any("kernel log's constraint" in d for d in v.disagreements)
    # an OOM bound by a limit the walk did not see (e.g. v1 memory+swap): the log names it
    v = one(
        oom(1.0, 100, memcg=False, rung="tracepoint"),
        kmsg(1.0, 100, oom_memcg="/memsw-bound"),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert (v.cause, v.limit_cgroup) == ("cgroup_oom", "/memsw-bound")
    # oom_kill_process's own oc->memcg is no guess: a disagreement keeps both views
    v = one(
        oom(1.0, 100, rung="kprobe"), kmsg(1.0, 100, memcg=False), killed(1.1, 100, signal.SIGKILL)
    )
    assert v.cause == "cgroup_oom" and v.confidence == "medium"


def test_bpf_and_kmsg_disagreeing_on_the_cgroup_is_reported() -> None:
    v = one(
        cgroup(20, "/a"),
        oom(1.0, 100, limit_cgroup=20),
        kmsg(1.0, 100, oom_memcg="/b"),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert v.cause == "cgroup_oom"
    assert v.confidence == "medium"
    assert any("/b" in d for d in v.disagreements)


def test_memory_verdict_has_peak_breakdown_stalls_and_host_memory() -> None:
    v = one(
        cgroup(20, "/model.slice", 8 * GiB),
        cgroup(30, "/model.slice/llm.service"),
        host(0.5, 17 * GiB),
        sample(0.2, 20, "/model.slice", usage=7 * GiB),
        sample(0.6, 20, "/model.slice", usage=8 * GiB - MiB),
        sample(
            0.9,
            30,
            "/model.slice/llm.service",
            usage=7 * GiB,
            stat={"anon": 6 * GiB, "file": GiB, "shmem": 0, "file_mapped": 100 * MiB},
        ),
        reclaim(0.95, 30, total_s=4.2, count=300),
        oom(1.0, 100, limit_cgroup=20, limit=8 * GiB, usage=8 * GiB - 2 * MiB, victim_cg=30),
        kmsg(1.0, 100, oom_memcg="/model.slice"),
        killed(1.1, 100, signal.SIGKILL, cg=30),
    )
    assert v.peak_bytes == 8 * GiB - MiB and v.peak_ts == t(0.6)
    # The limiting cgroup has no sample after or just before the kill, so the victim's
    # cgroup's last read stands in; the page cache is split into mapped and unmapped, and
    # the victim's own RSS from the kernel log follows under its own names.
    parts = dict(v.breakdown)
    assert {k: parts[k] for k in ("anon", "shmem", "file_mapped", "file_unmapped")} == {
        "anon": 6 * GiB,
        "shmem": 0,
        "file_mapped": 100 * MiB,
        "file_unmapped": GiB - 100 * MiB,
    }
    assert "anon_rss" in parts
    assert v.stall_ns == t(4.2)
    assert v.host_available == 17 * GiB
    assert "the host had 17.0 GiB available" in v.summary
    assert "4.2 s of reclaim stalls" in v.summary


def test_oom_of_another_pid_does_not_leak() -> None:
    verdicts = judge(oom(1.0, 101), killed(1.1, 100, signal.SIGKILL))
    assert verdicts[0].cause == "unknown"


def test_oom_before_the_process_started_belongs_to_a_reused_pid() -> None:
    v = one(oom(1.0, 100), killed(5.0, 100, signal.SIGKILL, start=2.0))
    assert v.cause == "unknown"


def test_oom_reported_but_clean_exit_is_noted_as_disagreement() -> None:
    v = one(oom(1.0, 100), exit_code(1.1, 100, 0))
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


def test_app_that_handles_an_allocation_failure_and_exits_1() -> None:
    v = one(
        cgroup(20, "/svc.scope"),
        sample(0.0, 20, "/svc.scope", usage=60 * MiB, failcnt=0),
        sample(0.9, 20, "/svc.scope", usage=64 * MiB, failcnt=37),
        exit_code(1.0, 100, 1, cg=20),
    )
    assert v.cause == "app_exit" and v.exit_code == 1
    assert "allocation failures preceded" in v.summary
    assert any("failcnt" in what and "37" in what for _, what in v.evidence)


def test_a_clean_exit_after_memory_pressure_claims_nothing() -> None:
    v = one(
        cgroup(20, "/s"),
        sample(0.0, 20, "/s", failcnt=0),
        sample(0.9, 20, "/s", failcnt=3),
        exit_code(1.0, 100, 0, cg=20),
    )
    assert "allocation" not in v.summary


# -- senders -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("comm", "cause", "role", "words"),
    [
        # (known by name only, no pressure seen: medium; tests/test_userspace_oom.py has more)
        ("systemd-oomd", "userspace_oom", "oom_daemon", "user-space OOM killer"),
        ("earlyoom", "userspace_oom", "oom_daemon", "user-space OOM killer"),
        ("kubelet", "signal_kill", "kubelet", "kubelet"),
        ("conmon", "signal_kill", "supervisor", "stopped by conmon"),
        ("bash", "signal_kill", "other", "from bash"),
    ],
)
def test_sender_roles(comm: str, cause: str, role: str, words: str) -> None:
    v = one(sent(1.0, 300, 100, signal.SIGKILL, comm=comm), killed(1.0, 100, signal.SIGKILL))
    assert (v.cause, v.sender_role) == (cause, role)
    assert v.confidence == ("medium" if cause == "userspace_oom" else "high")
    assert words in v.summary


def test_runtime_plumbing_is_known_by_name_and_the_memo_stays_bounded() -> None:
    from tracer.analysis.senders import IS_PLUMBING

    assert IS_PLUMBING["runc:[2:INIT]"] and IS_PLUMBING["conmon"] and IS_PLUMBING["crun"]
    assert not IS_PLUMBING["python3"] and not IS_PLUMBING["xrunc"]
    for i in range(10_000):
        assert not IS_PLUMBING[f"worker-{i}"]
    assert len(IS_PLUMBING) <= 4096
    assert IS_PLUMBING["runc"] and not IS_PLUMBING["worker-1"]


def test_a_stop_is_sigterm_then_sigkill_after_the_grace_period() -> None:
    v = one(
        sent(1.0, 300, 100, signal.SIGTERM, comm="conmon"),
        sent(11.0, 300, 100, signal.SIGKILL, comm="conmon"),
        killed(11.0, 100, signal.SIGKILL),
    )
    assert v.sender_role == "supervisor"
    assert "SIGTERM, then SIGKILL 10.0 s later" in v.summary


def test_a_handled_sigterm_then_exit_143_is_a_stop_not_an_exit_of_its_own() -> None:
    """A graceful stop (the runtime's SIGTERM, handled: the process exits 128 + 15 at once) is
    the sender's doing; an exit 143 with no SIGTERM before it, or a SIGTERM long before it, is
    the process's own."""
    v = one(sent(1.0, 300, 100, signal.SIGTERM, comm="runc"), exit_code(1.001, 100, 143))
    assert (v.cause, v.sender_role, v.exit_code, v.confidence) == (
        "signal_kill",
        "supervisor",
        143,
        "high",
    )
    assert "SIGTERM, which it handled: it exited with code 143" in v.summary
    assert one(exit_code(1.0, 100, 143)).cause == "app_exit"
    late = one(sent(1.0, 300, 100, signal.SIGTERM, comm="runc"), exit_code(9.0, 100, 143))
    assert late.cause == "app_exit"
    other = one(sent(1.0, 300, 100, signal.SIGHUP, comm="runc"), exit_code(1.001, 100, 143))
    assert other.cause == "app_exit"


def test_configured_supervisor_pid() -> None:
    a = Analyzer(supervisor_pids=[777])
    [v] = a.feed_all([sent(1.0, 777, 100, comm="my-watchdog"), killed(1.0, 100, signal.SIGTERM)])
    assert v.sender_role == "supervisor"


# -- units and restarts --------------------------------------------------------------------


def unit_stream() -> list[Event]:
    return [
        cgroup(40, "/system.slice/llm.service", 4 * GiB),
        execd(0.0, 100, 40, "llm"),
        forked(0.5, 100, 101, 40, "llm"),
    ]


def test_a_child_oom_is_an_event_of_the_unit_not_a_restart() -> None:
    a = Analyzer()
    events = [
        *unit_stream(),
        oom(1.0, 101, limit_cgroup=40, victim_cg=40),
        killed(1.1, 101, signal.SIGKILL, cg=40, ppid=100),
    ]
    [v] = a.feed_all(events)
    assert (v.cause, v.unit, v.main) == ("cgroup_oom", "llm.service", False)
    assert a.restarts == []


def test_the_main_process_killed_then_restarted_is_one_restart() -> None:
    a = Analyzer()
    events = [
        *unit_stream(),
        oom(1.0, 100, limit_cgroup=40, victim_cg=40),
        killed(1.1, 100, signal.SIGKILL, cg=40),
        execd(3.1, 200, 40, "llm"),
    ]
    [v] = a.feed_all(events)
    assert (v.unit, v.main) == ("llm.service", True)
    [r] = a.restarts
    assert (r.unit, r.old_pid, r.new_pid, r.cause) == ("llm.service", 100, 200, "cgroup_oom")
    assert r.downtime_ns == t(2.0)


def _oom_kill_then(*later: Event) -> list[Event]:
    """A cgroup OOM kill with all its evidence but the sample after it, then ``later``."""
    path = "/system.slice/llm.service"
    return [
        *unit_stream(),
        sample(0.5, 40, path, usage=4 * GiB, events={"oom_kill": 0}),
        oom(1.0, 100, limit_cgroup=40, victim_cg=40, limit=4 * GiB, usage=4 * GiB),
        kmsg(1.0, 100, oom_memcg=path),
        killed(1.1, 100, signal.SIGKILL, cg=40),
        *later,
    ]


def test_an_early_judging_analyzer_judges_an_oom_kill_once_its_evidence_is_in() -> None:
    """The agent's analyzer judges an OOM kill as soon as the cgroup's sample after it is in,
    not a settle window later, and to the very verdict the settle window gives."""
    after = sample(1.15, 40, "/system.slice/llm.service", events={"oom_kill": 1})
    early = Analyzer(early_oom=True)
    [v] = early.feed_many(_oom_kill_then(after, forked(1.2, 100, 102, 40, "llm")))
    late = Analyzer()
    assert late.feed_many(_oom_kill_then(after, forked(1.2, 100, 102, 40, "llm"))) == []
    [w] = late.feed_many([forked(2.5, 1, 103, 40, "llm")])
    assert v == w and v.cause == "cgroup_oom"
    assert early.feed_many([forked(2.5, 1, 103, 40, "llm")]) == []  # judged once


def test_an_early_judging_analyzer_waits_for_the_sample_after_the_kill() -> None:
    a = Analyzer(early_oom=True)
    assert a.feed_many(_oom_kill_then(forked(1.2, 100, 102, 40, "llm"))) == []
    [v] = a.feed_many([forked(2.5, 1, 103, 40, "llm")])  # the settle window, as always
    assert v.cause == "cgroup_oom"


def test_an_always_on_consumer_takes_each_restart_once_with_its_exits_verdict() -> None:
    """The agent hands restarts on as they happen. A new main process that starts within the
    second after the old one's exit is linked before that exit is judged: the restart waits
    for the verdict instead of going out as "pending" (a metric labelled with no cause)."""
    a = Analyzer()
    a.feed_many(
        [
            *unit_stream(),
            oom(1.0, 100, limit_cgroup=40, victim_cg=40),
            killed(1.1, 100, signal.SIGKILL, cg=40),
            execd(1.4, 200, 40, "llm"),
        ]
    )
    assert [r.cause for r in a.restarts] == ["pending"]
    assert a.take_restarts() == []  # linked, not judged yet
    a.feed_many([forked(3.0, 200, 201, 40, "llm")])  # the stream moves past the settle window
    [r] = a.take_restarts()
    assert (r.unit, r.old_pid, r.new_pid, r.cause) == ("llm.service", 100, 200, "cgroup_oom")
    assert a.take_restarts() == [] and a.restarts == []  # handed on once, none kept


def test_a_restart_whose_old_exit_is_never_judged_goes_as_unknown() -> None:
    a = Analyzer()
    a.feed_many(
        [
            *unit_stream(),
            oom(1.0, 100, limit_cgroup=40, victim_cg=40),
            killed(1.1, 100, signal.SIGKILL, cg=40),
            execd(1.4, 200, 40, "llm"),
            forked(3.0, 200, 201, 40, "llm"),  # (judged by now)
        ]
    )
    a.table.cause.clear()  # (as if the verdict had been evicted before the restart went out)
    a.feed_many([forked(30.0, 200, 202, 40, "llm")])
    assert a.take_restarts() == []  # not a minute yet: it may still come
    a.feed_many([forked(62.0, 200, 203, 40, "llm")])
    assert [(r.old_pid, r.new_pid, r.cause) for r in a.take_restarts()] == [(100, 200, "unknown")]


# -- properties ----------------------------------------------------------------------------


def _key(vs: list[Verdict]) -> list[tuple[int, str, str, str | None]]:
    return sorted((v.pid, v.cause, v.confidence, v.limit_cgroup) for v in vs)


def _rich_stream() -> list[Event]:
    return [
        cgroup(20, "/p", 64 * MiB),
        sample(0.5, 20, "/p", usage=60 * MiB, events={"oom_kill": 0}),
        oom(1.0, 100),
        oom_killer_sigkill(1.0, 100, trigger=100),
        kmsg(1.0, 100, oom_memcg="/p"),
        killed(1.0, 100, signal.SIGKILL, cg=20),
        sample(1.0, 20, "/p", usage=1 * MiB, events={"oom_kill": 1}),
        sent(2.0, 300, 101, comm="kill"),
        killed(2.0, 101, signal.SIGTERM),
        exit_code(2.0, 102, 3),
        sent(3.0, 102, 102, signal.SIGSEGV, code=1),
        killed(3.0, 102, signal.SIGSEGV, start=2.5),
    ]


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False))
def test_simultaneous_events_in_any_order_give_the_same_verdicts(rnd: random.Random) -> None:
    events = _rich_stream()
    expected = _key(judge(*events))
    # shuffle within each group of equal timestamps (the stream stays in time order)
    groups: dict[int, list[Event]] = {}
    for ev in events:
        groups.setdefault(ev.ts, []).append(ev)
    shuffled = []
    for ts in sorted(groups):
        g = groups[ts][:]
        rnd.shuffle(g)
        shuffled += g
    assert _key(judge(*shuffled)) == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 99), min_size=2, max_size=2))
def test_samples_delayed_within_their_interval_give_the_same_verdicts(ms: list[int]) -> None:
    events = _rich_stream()
    expected = _key(judge(*events))
    delayed = []
    for ev, delay in zip(events, ms * len(events), strict=False):
        if ev.KIND == "cg_sample":
            ev = replace(ev, ts=ev.ts + delay * 1_000_000)  # within the 100 ms interval
        delayed.append(ev)
    delayed.sort(key=lambda e: e.ts)
    assert _key(judge(*delayed)) == expected


def test_an_exit_is_judged_in_the_first_round_a_settle_past_it() -> None:
    """Late evidence may arrive for SETTLE_NS after an exit; verdicts are then reached in rounds
    of stream time: never before the settle, at most a round (and an event) after it."""
    from tracer.analysis.analyzer import ROUND_NS, SETTLE_NS

    a = Analyzer()
    assert a.feed(exit_code(1.0, 100, 3)) == []
    reached_at = None
    at = 1.0
    while reached_at is None and at < 3.0:
        at += 0.001
        if a.feed(host(at, GiB)):
            reached_at = t(at)
    assert reached_at is not None
    assert t(1.0) + SETTLE_NS <= reached_at <= t(1.0) + SETTLE_NS + ROUND_NS + t(0.001)


def test_state_is_bounded() -> None:
    from tracer.analysis import evidence

    a = Analyzer()
    for pid in range(evidence.MAX_PIDS + 10):
        a.feed(sent(1.0, 1, pid + 1000))
    assert a.ev.evicted == 10


def _busy_stream(n: int) -> list[Event]:
    """A unit whose main process restarts now and then among many short-lived children that
    exit 0, 1 or by a signal: past every keep cap."""
    rng = random.Random(7)
    events: list[Event] = [cgroup(50, "/system.slice/model.service", 64 * MiB)]
    main, at = 100, 0.0
    events.append(execd(at, main, 50, "model"))
    for i in range(n):
        at += 0.001
        child = 1000 + i
        events.append(forked(at, main, child, 50, "worker"))
        roll = rng.random()
        if roll < 0.05:
            events.append(sent(at + 0.0004, main, child, signal.SIGTERM))
            events.append(killed(at + 0.0005, child, signal.SIGTERM, cg=50, ppid=main))
        else:
            code = 1 if roll < 0.12 else 0
            events.append(exit_code(at + 0.0005, child, code, cg=50, ppid=main))
        if i % 2500 == 2499:  # the main process dies and the unit starts a new one
            events.append(exit_code(at + 0.0006, main, 3 * (i // 2500 % 2), cg=50))
            main = 90_000 + i
            events.append(execd(at + 0.0008, main, 50, "model"))
    return events


def test_unread_verdicts_are_counted_not_built_with_the_same_outcome() -> None:
    from tracer.analysis import analyzer as vmod

    events = _busy_stream(vmod.MAX_KEPT + vmod.MAX_CLEAN_KEPT + 2000)
    every, lean = Analyzer(every_verdict=True), Analyzer(every_verdict=False)
    returned = every.feed_all(events)
    for ev in events:
        lean.feed(ev)
    lean.finish()
    assert len(returned) == len(every.verdicts) + every.not_kept  # every one was handed out
    assert lean.verdicts == every.verdicts  # the kept ones are the same, in the same order
    assert lean.not_kept == every.not_kept > 0
    assert lean.restarts == every.restarts and len(lean.restarts) >= 3
    assert {r.cause for r in lean.restarts} == {"app_exit"}
    # feed_all (replay's loop), feed_many over ring-buffer-sized batches (the recorder's) and
    # feed (one event at a time, under a live tail) agree
    batch = Analyzer(every_verdict=False)
    batch.feed_all(events)
    chunked = Analyzer(every_verdict=False)
    for at in range(0, len(events), 4096):
        chunked.feed_many(events[at : at + 4096])
    chunked.finish()
    for a in (batch, chunked):
        assert (a.verdicts, a.not_kept, a.restarts) == (lean.verdicts, lean.not_kept, lean.restarts)


def test_a_long_lived_parent_outlives_the_process_table_churn() -> None:
    from tracer.analysis import evidence

    a = Analyzer()
    a.feed(cgroup(50, "/system.slice/model.service", 64 * MiB))
    a.feed(execd(0.0, 100, 50, "model"))
    for i in range(evidence.MAX_PIDS * 2):
        at = 1.0 + i * 1e-4
        a.feed(forked(at, 100, 10_000 + i, 50, "worker"))
        a.feed(exit_code(at + 5e-5, 10_000 + i, 0, cg=50, ppid=100))
    assert a.evicted > evidence.MAX_PIDS  # the children churned through the table
    assert a.table.procs[100].comm == "model"  # the server that forks them is still known
    [v] = [v for v in a.feed_all([exit_code(9.0, 100, 1, cg=50)]) if v.pid == 100]
    assert (v.main, v.unit, v.exit_code) == (True, "model.service", 1)


def test_a_signal_storm_at_one_process_keeps_its_newest_signals_only() -> None:
    from tracer.analysis import evidence

    a = Analyzer()
    for i in range(10_000):
        a.feed(sent(1.0 + i * 1e-6, 1, 500, signal.SIGUSR1))
    a.feed(sent(1.5, 77, 500, signal.SIGTERM, comm="supervisor"))
    kept = a.ev.by_pid[500].signals
    assert len(kept) <= 2 * evidence.MAX_SIGNALS_PER_PID
    assert a.ev.evicted >= 10_000 - 2 * evidence.MAX_SIGNALS_PER_PID
    [v] = a.feed_all([killed(1.6, 500, signal.SIGTERM)])
    assert (v.cause, v.sender_pid, v.sender_comm) == ("signal_kill", 77, "supervisor")


def test_old_cgroup_samples_are_dropped_as_the_stream_moves_on() -> None:
    from tracer.analysis import evidence

    a = Analyzer()
    a.feed(cgroup(50, "/demo", 64 * MiB))
    for i in range(3000):  # 300 s at 100 ms
        a.feed(sample(i * 0.1, 50, "/demo", usage=MiB))
    kept = a.ev.by_cgroup[50].sample_ts
    window = (evidence.HISTORY_NS + evidence.SAMPLE_MARGIN_NS) / 1e9
    assert len(kept) <= window * 10 + 20  # about the window's worth, not the count cap
    assert kept == sorted(kept) and kept[-1] == t(299.9)


# -- containers, supervisors, probes -------------------------------------------------------


def container_stream(pid: int, at: float) -> list[Event]:
    return [
        cgroup(50, "/libpod_parent/libpod-" + "a" * 64, 64 * MiB),
        unit_info(50, "podman", "model"),
        execd(at, pid, 50, "llm"),
    ]


def test_an_exec_caught_in_runc_init_when_the_container_dies_is_no_main_process() -> None:
    """Docker's health check is a `docker exec`: one caught in runc init when the container's
    init is killed is killed by the kernel with it, just after; it is neither a main exit nor
    the run a restart starts from (seen once in a Compose health-check restart)."""
    a = Analyzer()
    events = [
        *container_stream(100, 0.0),
        forked(1.0, 90, 150, 50, "runc:[2:INIT]"),  # (its parent: the runtime, outside)
        killed(2.0, 100, signal.SIGKILL, cg=50),
        killed(2.002, 150, signal.SIGKILL, comm="runc:[2:INIT]", cg=50, ppid=90),
        execd(2.2, 200, 50, "llm"),
        forked(5.0, 200, 201, 50, "llm"),
    ]
    verdicts = a.feed_all(events)
    assert [(v.pid, v.main) for v in verdicts] == [(100, True), (150, False)]
    assert [(r.old_pid, r.new_pid) for r in a.restarts] == [(100, 200)]


def test_container_units_are_named_by_the_runtime_and_restarts_linked() -> None:
    a = Analyzer()
    events = [
        *container_stream(100, 0.0),
        runtime(0.5, "podman model", 0),
        oom(1.0, 100, limit_cgroup=50, victim_cg=50),
        kmsg(1.0, 100),
        killed(1.1, 100, signal.SIGKILL, cg=50),
        execd(2.0, 200, 50, "llm"),
        oom(3.0, 200, limit_cgroup=50, victim_cg=50),
        killed(3.1, 200, signal.SIGKILL, cg=50),
        execd(4.0, 300, 50, "llm"),
        runtime(4.5, "podman model", 2),
        exit_code(5.0, 300, 0, cg=50),
    ]
    verdicts = a.feed_all(events)
    assert [(v.unit, v.cause) for v in verdicts] == [
        ("podman model", "cgroup_oom"),
        ("podman model", "cgroup_oom"),
        ("podman model", "app_exit"),
    ]
    assert [(r.old_pid, r.new_pid, r.cause) for r in a.restarts] == [
        (100, 200, "cgroup_oom"),
        (200, 300, "cgroup_oom"),
    ]
    assert a.restart_counts() == [("podman model", 2, 2, "podman")]


def test_runc_executing_itself_in_the_new_cgroup_is_not_the_containers_main_process() -> None:
    """On a loaded host runc's exec of /proc/self/exe (comm "exe") lands in a restarted
    container's new cgroup before the entrypoint's (seen in 1 of 301 restarts of a crash
    loop): the entrypoint is still the main process, and the restart is linked."""
    a = Analyzer()
    events = [
        *container_stream(100, 0.0),
        exit_code(1.0, 100, 3, cg=50),
        Exec(ts=t(2.0), pid=150, comm="exe", filename="/proc/self/exe", cgroup_id=50),
        Exec(ts=t(2.01), pid=150, comm="runc", filename="/dev/fd/6", cgroup_id=50),
        forked(2.02, 150, 151, 50, "runc:[0:PARENT]"),
        forked(2.03, 151, 152, 50, "runc:[1:CHILD]"),
        exit_code(2.04, 151, 0, "runc:[1:CHILD]", cg=50),
        exit_code(2.05, 150, 0, "runc:[0:PARENT]", cg=50),
        execd(2.1, 152, 50, "llm"),
        exit_code(2.2, 152, 3, "llm", cg=50),
    ]
    verdicts = a.feed_all(events)
    assert [(v.pid, v.unit, v.main, v.exit_code) for v in verdicts] == [
        (100, "podman model", True, 3),
        (152, "podman model", True, 3),
    ]
    assert [(r.old_pid, r.new_pid) for r in a.restarts] == [(100, 152)]


def test_a_restart_count_mismatch_shows() -> None:
    a = Analyzer()
    a.feed_all(
        [
            *container_stream(100, 0.0),
            runtime(0.5, "podman model", 0),
            runtime(5.0, "podman model", 3),
        ]
    )
    assert a.restart_counts() == [("podman model", 0, 3, "podman")]


def test_probe_kill_after_failing_probes_with_stall_context() -> None:
    v = one(
        *container_stream(100, 0.0),
        probe(1.0, True),
        probe(2.0, False, 1000, timed_out=True),
        probe(2.5, False, 1000, timed_out=True),
        probe(3.0, False, 1000, timed_out=True),
        reclaim(3.0, 50, total_s=1.5, count=80),
        sent(3.5, 400, 100, signal.SIGKILL, comm="conmon"),
        killed(3.5, 100, signal.SIGKILL, cg=50),
    )
    assert (v.cause, v.confidence, v.sender_role) == ("probe_kill", "high", "supervisor")
    assert "timed out" in v.summary and "reclaim stalls" in v.summary
    assert "raise the probe timeout" in v.advice
    assert sum("probe" in what for _, what in v.evidence) == 3


def test_a_probe_the_death_broke_is_not_a_failure_before_it() -> None:
    """A probe in flight at a kill -9 is reset by the death itself: it says nothing about the
    server before, so a kill while the probes passed has no failing probes (CI flake, Dec 2026);
    a probe that had already waited on a silent server until the exit still counts."""
    reset = msgspec.structs.replace(probe(2.99, False, 20), error="connection reset by peer")
    stream = [*container_stream(100, 0.0), probe(1.0, True), probe(2.0, True), reset]
    kill = [
        sent(3.0, 400, 100, signal.SIGKILL, comm="bash"),
        killed(3.0, 100, signal.SIGKILL, cg=50),
    ]
    v = one(*stream, *kill)
    assert (v.cause, v.probe_failures, v.confidence) == ("signal_kill", 0, "high")
    hung = probe(2.5, False, 1000, timed_out=True)
    v = one(*stream[:-1], hung, *kill)
    assert v.probe_failures == 1


@pytest.mark.parametrize(
    ("probes_ok", "sig", "sender", "role"),
    [
        # a stop by the runtime while its probes were healthy
        (True, signal.SIGTERM, "conmon", "supervisor"),
        # a manual kill while the probes were failing
        (False, signal.SIGKILL, "bash", "other"),
    ],
)
def test_a_kill_without_both_failing_probes_and_a_supervisor_is_not_a_probe_kill(
    probes_ok: bool, sig: int, sender: str, role: str
) -> None:
    v = one(
        *container_stream(100, 0.0),
        probe(1.0, probes_ok),
        probe(2.0, probes_ok),
        sent(3.0, 400, 100, sig, comm=sender),
        killed(3.0, 100, sig, cg=50),
    )
    assert (v.cause, v.sender_role) == ("signal_kill", role)


def test_supervisord_programs_are_units_and_their_restarts_link() -> None:
    a = Analyzer()
    events: list[Event] = [
        execd(0.0, 10, 10, "supervisord"),
        forked(0.1, 10, 11, 10, "supervisord"),
        execd(0.1, 11, 10, "worker"),
        exit_code(1.0, 11, 2, cg=10, ppid=10),
        forked(1.2, 10, 12, 10, "supervisord"),
        execd(1.2, 12, 10, "worker"),
    ]
    [v] = a.feed_all(events)
    assert (v.unit, v.main, v.cause) == ("worker under supervisord", True, "app_exit")
    assert [(r.unit, r.old_pid, r.new_pid) for r in a.restarts] == [
        ("worker under supervisord", 11, 12)
    ]


def test_pm2s_daemon_renamed_after_its_exec_still_makes_its_programs_units() -> None:
    """pm2's daemon execs as node, then renames itself "PM2 v5.3.1: God Daemon (...)" (its
    comm: "PM2 v5.3.1: God"): its programs are units "app under pm2", and a rerun a restart."""
    a = Analyzer()
    events: list[Event] = [
        execd(0.0, 10, 10, "node"),
        forked(0.5, 10, 11, 10, "PM2 v5.3.1: God"),
        execd(0.5, 11, 10, "app"),
        exit_code(1.0, 11, 1, comm="app", cg=10, ppid=10),
        forked(1.2, 10, 12, 10, "PM2 v5.3.1: God"),
        execd(1.2, 12, 10, "app"),
    ]
    [v] = a.feed_all(events)
    assert (v.unit, v.main, v.cause) == ("app under pm2", True, "app_exit")
    assert [(r.unit, r.old_pid, r.new_pid) for r in a.restarts] == [("app under pm2", 11, 12)]


def test_a_program_of_supervisord_as_a_containers_init_is_its_own_unit() -> None:
    """Issue 31 item 7: supervisord as PID 1 of a podman container (the s6-overlay, runit, pm2
    pattern) runs its program in the container's cgroup, as the agent sees it (a fork record
    for a supervisor's child only): the program is its own unit, its failure its main exit and
    its next run a restart; supervisord is still the container's main process."""
    a = Analyzer()
    events: list[Event] = [
        cgroup(50, "/libpod_parent/libpod-" + "a" * 64, 64 * MiB),
        unit_info(50, "podman", "web"),
        execd(0.0, 10, 50, "supervisord"),
        forked(0.1, 10, 11, 50, "supervisord"),
        execd(0.1, 11, 50, "worker"),
        exit_code(1.0, 11, 3, comm="worker", cg=50, ppid=10),
        forked(1.2, 10, 12, 50, "supervisord"),
        execd(1.2, 12, 50, "worker"),
        exit_code(2.0, 12, 3, comm="worker", cg=50, ppid=10),
        forked(2.2, 10, 13, 50, "supervisord"),
        execd(2.2, 13, 50, "worker"),
        exit_code(3.0, 13, 0, comm="worker", cg=50, ppid=10),
        exit_code(3.1, 10, 0, comm="supervisord", cg=50, ppid=1),
    ]
    verdicts = a.feed_all(events)
    assert [(v.pid, v.unit, v.main, v.exit_code) for v in verdicts] == [
        (11, "worker under supervisord", True, 3),
        (12, "worker under supervisord", True, 3),
        (13, "worker under supervisord", True, 0),
        (10, "podman web", True, 0),
    ]
    assert [(r.unit, r.old_pid, r.new_pid, r.cause) for r in a.restarts] == [
        ("worker under supervisord", 11, 12, "app_exit"),
        ("worker under supervisord", 12, 13, "app_exit"),
    ]


def test_the_kernel_logs_rss_is_not_called_the_cgroups_memory() -> None:
    """Issue 22 finding 5: "memory at the kill: anon 63.6 MiB, file 5.1 MiB" exceeded the
    64 MiB limit: the kernel log's anon-rss/file-rss are the victim's RSS (file-rss counts
    mapped files charged elsewhere), not the cgroup's page cache."""
    from tracer.analysis.quantities import fmt_bytes
    from tracer.analysis.wording import memory_at_kill

    rss = (("anon_rss", 65280 * 1024), ("file_rss", 6656 * 1024), ("shmem_rss", 0))
    assert memory_at_kill(rss, fmt_bytes) == (
        "the victim's RSS at the kill (kernel log): anon-rss 63.8 MiB, file-rss 6.5 MiB, "
        "shmem-rss 0 B (file-rss is mapped files, which may be charged to other cgroups)"
    )
    stat = (("anon", 6 * GiB), ("file", GiB))
    assert memory_at_kill(stat, fmt_bytes) == (
        "the limiting cgroup's memory at the kill: anon 6.0 GiB, file 1.0 GiB"
    )


# -- a kill at the limit is a lower bound of the need (issue 29) ---------------------------------


def _oom_at_limit(*probes: Event, usage: int = 64 * MiB) -> Verdict:
    """A podman container's main process OOM-killed at its 64 MiB limit at 2 s."""
    return one(
        *container_stream(100, 0.0),
        *probes,
        oom(2.0, 100, limit_cgroup=50, usage=usage, victim_cg=50),
        kmsg(2.0, 100, oom_memcg="/libpod_parent/libpod-" + "a" * 64),
        killed(2.0, 100, signal.SIGKILL, cg=50),
    )


def test_a_kill_at_the_limit_says_the_need_is_unknown_and_higher() -> None:
    """The peak of a process killed at its limit is the limit: "keep 15% over the peak"
    would fail again (a model loaded at twice the limit)."""
    v = _oom_at_limit()
    assert (v.cause, v.confidence) == ("cgroup_oom", "high")
    assert "killed at the limit" in v.advice and "real need is unknown and higher" in v.advice
    assert "15% headroom" not in v.advice and "raise that limit" in v.advice
    assert "still starting" not in v.summary


def test_a_kill_below_the_limit_keeps_the_headroom_advice() -> None:
    v = _oom_at_limit(usage=40 * MiB)
    assert "keep >= 15% headroom" in v.advice and "unknown" not in v.advice


def test_a_kill_before_any_probe_passed_was_while_starting() -> None:
    """A model server OOM-killed while loading: its /health answered 503 (or nothing) on
    every probe from its start to the kill."""
    starting = [probe(0.5, False), probe(1.0, False), probe(1.5, False)]
    v = _oom_at_limit(*starting)
    assert "it was still starting (none of its 3 health probes had passed)" in v.summary
    assert "while it was still starting" in v.advice
    v = _oom_at_limit(probe(0.5, True), *starting[1:])
    assert "starting" not in v.summary + v.advice


def test_a_runtimes_oomkilled_for_a_handled_stop_is_quoted_and_disagrees() -> None:
    """containerd's reason for a graceful stop's exit 143 can be OOMKilled (read from the
    cgroup's OOM counter, which an earlier child's OOM kill raised): quoted beside the stop,
    a disagreement (so medium), never the cause."""
    events = [
        cgroup(50, "/kubepods/burstable/pod" + "1" * 36 + "/" + "a" * 64, 64 * MiB),
        unit_info(50, "containerd", "hog"),
        execd(0.0, 100, 50, "sh"),
        sent(5.0, 300, 100, signal.SIGTERM, comm="runc"),
        exit_code(5.001, 100, 143, comm="sh", cg=50),
        replace(runtime(5.2, "containerd hog", 0, "containerd"), exit_code=143, oom_killed=True),
    ]
    [v] = Analyzer().feed_all(events)
    assert (v.cause, v.unit, v.confidence) == ("signal_kill", "containerd hog", "medium")
    assert v.disagreements == ("containerd says OOMKilled",)
    assert any(
        "containerd recorded exit code 143 for containerd hog (its OOMKilled flag: True)" in what
        for _, what in v.evidence
    )
