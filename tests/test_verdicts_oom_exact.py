"""An OOM record proves an OOM kill, and the exact one decides (issue 31 item 6), on streams.

mark_victim is the kernel's "marked as an OOM victim", not "killed" (mm/oom_kill.c):
out_of_memory() and oom_kill_process() also mark a task already exiting by itself
(task_will_free_mem(): no SIGKILL, no "Killed process" line), and in a global OOM each further
thread of the killed process that enters out_of_memory() is marked again there, outside
oom_kill_process(), so with no oom_control: the walk rungs' guess. The kernel side sends one
record per victim process now and flags the exiting marks (bpf/whyrestart.bpf.c); these
streams hold what reaches user space from kernels or recordings where both still arrive, and a
kernel cannot show them on demand here (a global OOM of this shared host is not a test).
oom_control's constraint also tells a NUMA-constrained OOM (CONSTRAINT_CPUSET: cpuset.mems,
the Kubernetes Memory Manager; CONSTRAINT_MEMORY_POLICY: numactl --membind) from a host out of
memory.
"""

from __future__ import annotations

import signal

from tests.streams import MiB, cgroup, exit_code, killed, kmsg, one, oom, oom_killer_sigkill, sent
from tracer.analysis import wording


def test_a_later_guess_does_not_override_the_exact_scope() -> None:
    # a global OOM (fentry read oc->memcg == NULL), then another thread of the victim marked
    # outside the kill: the walk found its cgroup near its limit and guessed memcg
    v = one(
        cgroup(20, "/x", 64 * MiB),
        oom(1.0, 100, memcg=False, rung="fentry", constraint="none"),
        oom(1.02, 100, rung="tp_btf"),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert (v.cause, v.limit_cgroup) == ("global_oom", None)
    assert not v.disagreements
    # and the exact memcg record wins over a later guess of another cgroup
    v = one(
        cgroup(20, "/x", 64 * MiB),
        cgroup(30, "/x/y", 32 * MiB),
        oom(1.0, 100, limit_cgroup=20, rung="kprobe", constraint="memcg"),
        oom(1.02, 100, limit_cgroup=30, limit=32 * MiB, rung="tp_btf"),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert (v.cause, v.limit_cgroup, v.limit_bytes) == ("cgroup_oom", "/x", 64 * MiB)


def test_a_victim_marked_while_exiting_by_itself_was_not_oom_killed() -> None:
    # a memcg OOM during a container stop marks a worker that is exiting 0: no kill
    v = one(
        oom(1.0, 100, rung="fentry", constraint="memcg", exiting=True),
        exit_code(1.1, 100, 0),
    )
    assert v.cause == "app_exit"
    assert wording.OOM_REPORTED_YET_EXITED not in v.disagreements
    # ended by a pid namespace's SIGKILL (the kernel's, SI_KERNEL) while marked: not an OOM kill
    v = one(
        oom(1.0, 100, rung="fentry", constraint="memcg", exiting=True),
        oom_killer_sigkill(1.05, 100, 1),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert v.cause != "cgroup_oom"
    # docker stop's SIGKILL while marked: killed by the sender, not by the OOM killer
    v = one(
        oom(1.0, 100, rung="fentry", constraint="memcg", exiting=True),
        sent(1.05, 7, 100, signal.SIGKILL, comm="dockerd"),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert v.cause == "signal_kill"


def test_an_exiting_mark_does_not_hide_the_real_kill() -> None:
    v = one(
        oom(1.0, 100, limit_cgroup=20, rung="fentry", constraint="memcg"),
        oom(1.01, 100, limit_cgroup=0, memcg=False, rung="tp_btf", exiting=True),
        kmsg(1.0, 100, oom_memcg="/x"),
        cgroup(20, "/x", 64 * MiB),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert (v.cause, v.limit_cgroup, v.confidence) == ("cgroup_oom", "/x", "high")


def test_a_cpuset_constrained_oom_is_not_the_whole_machine() -> None:
    v = one(
        oom(1.0, 100, memcg=False, rung="fentry", constraint="cpuset"),
        kmsg(1.0, 100, memcg=False, constraint="CONSTRAINT_CPUSET"),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert v.cause == "numa_oom"
    assert "NUMA" in v.summary and "cpuset" in v.summary
    assert "whole machine" not in v.summary
    assert v.advice == wording.NUMA_OOM_ADVICE != wording.GLOBAL_OOM_ADVICE
    assert v.confidence == "high"


def test_a_mempolicy_oom_from_the_kernel_log_alone_is_numa_constrained() -> None:
    # the guessing rungs read no constraint; the kernel log's oom-kill line has it
    v = one(
        oom(1.0, 100, memcg=False, rung="tp_btf"),
        kmsg(1.0, 100, memcg=False, constraint="CONSTRAINT_MEMORY_POLICY"),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert v.cause == "numa_oom"
    assert "memory policy" in v.summary


def test_a_global_oom_stays_global() -> None:
    v = one(
        oom(1.0, 100, memcg=False, rung="fentry", constraint="none"),
        kmsg(1.0, 100, memcg=False),
        killed(1.1, 100, signal.SIGKILL),
    )
    assert v.cause == "global_oom"
