"""Tier 1 (event streams): a fatal signal that the kernel raised for the process's own set-up
is not read as a kill by whichever task happened to run (issue 31 item 8): the parent-death
signal (PR_SET_PDEATHSIG, sent by the parent's exiting thread), the terminal's Ctrl-C and
hang-up (sent from a kworker as SEND_SIG_PRIV), the process's own timers, asynchronous I/O and
CPU time limit (sent from interrupt context, where the current task is anyone)."""

from __future__ import annotations

import signal

from msgspec.structs import replace

from tests.streams import killed, one, sent
from tracer.analysis.rules.signals import SI_SIGIO, SI_TIMER
from tracer.events import SI_KERNEL


def test_the_parent_death_signal_names_the_exiting_parent_thread_not_a_kill() -> None:
    pdeath = replace(sent(1.0, 50, 100, signal.SIGKILL, comm="server"), sender_exiting=True)
    v = one(pdeath, killed(1.01, 100, signal.SIGKILL, ppid=50))
    assert v.cause == "signal_kill" and v.sender_role == "kernel"
    assert "PR_SET_PDEATHSIG" in v.summary and "thread of server (pid 50)" in v.summary
    assert "LockOSThread" in v.advice
    # the same signal from the parent while it runs is its kill, as before
    v = one(sent(1.0, 50, 100, signal.SIGKILL, comm="server"), killed(1.01, 100, signal.SIGKILL))
    assert "PR_SET_PDEATHSIG" not in v.summary and v.sender_pid == 50


def test_ctrl_c_and_a_hang_up_come_from_the_terminal_not_the_kernel_or_a_crash() -> None:
    for sig, words in (
        (signal.SIGINT, "Ctrl-C"),
        (signal.SIGQUIT, "Ctrl-\\"),
        (signal.SIGHUP, "hung up"),
    ):
        tty = sent(1.0, 77, 100, sig, comm="kworker/u4:2", code=SI_KERNEL)
        v = one(tty, killed(1.01, 100, sig, core=sig == signal.SIGQUIT))
        assert v.cause == "signal_kill" and v.sender_role == "kernel", v
        assert "terminal" in v.summary and words in v.summary + v.advice, v.summary
        assert "crashed" not in v.summary and "kworker" not in v.summary


def test_a_processs_own_timer_or_sigio_is_no_process_sender() -> None:
    cases = (
        (signal.SIGALRM, SI_KERNEL, "interval timer"),  # alarm(), setitimer(ITIMER_REAL)
        (signal.SIGPROF, SI_KERNEL, "interval timer"),
        (signal.SIGUSR1, SI_TIMER, "POSIX timer"),
        (signal.SIGIO, SI_SIGIO, "asynchronous I/O"),
        (signal.SIGIO, 1, "asynchronous I/O"),  # POLL_IN from send_sigio()
        (signal.SIGXCPU, SI_KERNEL, "RLIMIT_CPU"),
    )
    for sig, code, words in cases:
        # (from interrupt context: the current task is whatever ran, here swapper/1)
        ev = sent(1.0, 0, 100, sig, comm="swapper/1", code=code)
        v = one(ev, killed(1.01, 100, sig))
        assert v.cause == "app_exit" and v.sender_role == "self", (sig, code, v)
        assert words in v.summary and "swapper" not in v.summary, v.summary


def test_a_fault_and_a_kill_by_another_process_read_as_before() -> None:
    v = one(
        sent(1.0, 100, 100, signal.SIGSEGV, comm="app", code=1), killed(1.01, 100, signal.SIGSEGV)
    )
    assert v.cause == "app_exit" and "crashed with SIGSEGV" in v.summary
    v = one(sent(1.0, 200, 100, signal.SIGALRM, comm="kill"), killed(1.01, 100, signal.SIGALRM))
    assert v.cause == "signal_kill" and v.sender_pid == 200
