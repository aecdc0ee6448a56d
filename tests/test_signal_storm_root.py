"""Tier 3 (root, real kernel): handled and ignored signals cost no ring-buffer record.

A process that handles SIGUSR1 and ignores SIGPIPE takes a paced storm of both (~50,000/s from
a small C sender: Python's os.kill does not reach that rate) while three cgroup OOM kills run
beside it, all under `whyrestart agent`. The kernel counts the storm instead of sending it
(whyrestart_signals_unrecorded_total; a handled or ignored signal from another process is sent
at most 8 times a second), nothing is lost, each OOM kill is judged, and the
handled SIGTERM that ends the receiver (its handler re-raises it with SIG_DFL, as Go's runtime
does) still names the process that sent it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.mt import build as mt_build
from tests.recording import record
from tests.test_agent_root import AgentProc, agent_state, history, until  # noqa: F401
from tests.workloads import HOG, in_cgroup
from tracer.events import Signal
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.root

MiB = 1024 * 1024
RATE = 50_000  # signals/s, half SIGUSR1 (handled), half SIGPIPE (ignored)
OOM_KILLS = 3

# Handles SIGUSR1, ignores SIGPIPE; on SIGTERM it puts SIG_DFL back and raises it again (the
# way Go's runtime and many C daemons die of a stop they caught). Prints "ready" once set up.
RECEIVER = r"""
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
static volatile sig_atomic_t got;
static void on_usr1(int s) { (void)s; got++; }
static void on_term(int s) { signal(s, SIG_DFL); raise(s); }
int main(void) {
	struct sigaction sa = {0};
	sa.sa_handler = on_usr1;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGUSR1, &sa, NULL);
	sa.sa_handler = on_term;
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	puts("ready");
	fflush(stdout);
	for (;;)
		pause();
}
"""

# wr-sig-sender PID RATE SECONDS: kill(PID, SIGUSR1) and kill(PID, SIGPIPE) in turn, paced on
# an absolute schedule (every 1 ms worth); prints "usr1=N pipe=N" (the kill() calls that
# returned 0: each is one signal_generate hit).
SENDER = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static long long now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}
int main(int argc, char **argv) {
	pid_t pid = atoi(argv[1]);
	double rate = atof(argv[2]);
	long long start = now(), end = start + (long long)(atof(argv[3]) * 1e9);
	long long usr1 = 0, pipe = 0, sent = 0;
	long per_tick = (long)(rate / 1000);
	while (now() < end) {
		for (long k = 0; k < per_tick; k++, sent++) {
			if (sent & 1)
				pipe += kill(pid, SIGPIPE) == 0;
			else
				usr1 += kill(pid, SIGUSR1) == 0;
		}
		long long due = start + (long long)(sent / rate * 1e9);
		struct timespec ts = {due / 1000000000LL, due % 1000000000LL};
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
	}
	printf("usr1=%lld pipe=%lld\n", usr1, pipe);
	return 0;
}
"""


def _build(tmp: Path, name: str, source: str) -> str:
    cc = mt_build.gcc()
    if cc is None:
        pytest.skip("no C compiler (gcc) to build the signal storm")
    src = tmp / f"{name}.c"
    src.write_text(source)
    exe = tmp / name
    subprocess.run([cc, "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    return str(exe)


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_a_handled_signal_storm_costs_no_record_and_loses_no_oom_kill(
    agent_state: Path,  # noqa: F811
    tmp_path: Path,
    layout: CgroupLayout,
) -> None:
    receiver = _build(tmp_path, "wr-sig-receiver", RECEIVER)
    sender = _build(tmp_path, "wr-sig-sender", SENDER)
    agent = AgentProc(agent_state)
    recv = None
    try:
        agent.wait_ready()
        recv = subprocess.Popen([receiver], stdout=subprocess.PIPE)
        assert recv.stdout is not None and recv.stdout.readline() == b"ready\n"
        seconds = 4.0
        storm = subprocess.Popen(
            [sender, str(recv.pid), str(RATE), str(seconds)], stdout=subprocess.PIPE, text=True
        )
        name = f"wr-sig-oom-{os.getpid()}"
        with ChildCgroup(own_memory_cgroup(layout=layout), name, 64 * MiB, layout=layout) as cg:
            path = cg.path
            hogs = [subprocess.run(in_cgroup(cg, sys.executable, "-c", HOG)) for _ in range(3)]
            # (the OOM kills ran inside the storm: it was still going after the last one)
            assert storm.poll() is None, "the storm ended before the OOM kills: raise seconds"
            out, _ = storm.communicate(timeout=60)
        assert [h.returncode for h in hogs] == [-signal.SIGKILL] * OOM_KILLS
        sent = dict(kv.split("=") for kv in out.split())
        usr1, pipe = int(sent["usr1"]), int(sent["pipe"])
        assert usr1 > 10_000 and pipe > 10_000, out
        os.kill(recv.pid, signal.SIGTERM)  # handled, then re-raised: dies of SIGTERM
        assert recv.wait(timeout=10) == -signal.SIGTERM

        def ours() -> list[dict[str, object]]:
            return [
                e
                for e in history(agent_state)
                if e["cause"] == "cgroup_oom" and e["verdict"]["limit_cgroup"] == path  # type: ignore[index]
            ]

        def stopped() -> list[dict[str, object]]:
            return [e for e in history(agent_state) if e["pid"] == recv.pid]

        until(lambda: len(ours()) >= OOM_KILLS and stopped(), timeout=60)
        # the housekeeping pass that reads the kernel's counts runs every 5 s
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            text = agent.metrics()
            counted = _samples(text, "whyrestart_signals_unrecorded_total")
            if counted.get((("signal", "SIGPIPE"),), 0) >= pipe - 8 * (seconds + 2):
                break
            time.sleep(0.5)
        code, _ = agent.stop()
        assert code == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
        if recv is not None and recv.poll() is None:
            recv.kill()
            recv.wait()
    # nothing lost, every OOM kill judged as one
    assert _samples(text, "whyrestart_events_lost_total") == {(): 0.0}
    kills = ours()
    assert len(kills) == OOM_KILLS and {k["confidence"] for k in kills} == {"high"}, kills
    # ... and not recorded: sent by another process (a stop of any number may be one, and a
    # stop's ignored SIGTERM is part of the stop), at most 8 of each a second
    stormed = {signal.SIGUSR1: 0, signal.SIGPIPE: 0}
    for seg in sorted((agent_state / "segments").glob("*.trace*")):
        for ev in read_trace(str(seg)).events:
            if isinstance(ev, Signal) and ev.target_pid == recv.pid and ev.sig in stormed:
                stormed[signal.Signals(ev.sig)] += 1
    assert max(stormed.values()) <= 8 * (seconds + 2), f"{stormed} of {usr1 + pipe} recorded"
    # the handled SIGTERM from this process is still what names who stopped the receiver
    [death] = stopped()
    verdict = death["verdict"]
    assert death["cause"] == "signal_kill", death
    assert verdict["sender_pid"] == os.getpid(), verdict  # type: ignore[index]
    # the storm was counted in the kernel (other processes on the host may add to the counts)
    unrecorded = _samples(text, "whyrestart_signals_unrecorded_total")
    assert unrecorded.get((("signal", "SIGUSR1"),), 0) >= usr1 - stormed[signal.SIGUSR1]
    assert unrecorded.get((("signal", "SIGPIPE"),), 0) >= pipe - stormed[signal.SIGPIPE]


# Faults FAULTS times under its own SIGSEGV handler (siglongjmp back out of each), as a JVM's
# safepoint polls do, then puts SIG_DFL back and raises SIGSEGV itself (as Python's
# faulthandler and crash reporters end): the last word is a raise(), not a fault.
FAULTER = r"""
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
static sigjmp_buf back;
static void on_segv(int s) { (void)s; siglongjmp(back, 1); }
int main(int argc, char **argv) {
	long n = atol(argv[1]);
	struct sigaction sa = {0};
	sa.sa_handler = on_segv;
	sa.sa_flags = SA_NODEFER;
	sigaction(SIGSEGV, &sa, NULL);
	for (volatile long i = 0; i < n; i++)
		if (!sigsetjmp(back, 1))
			*(volatile int *)0 = 1;
	signal(SIGSEGV, SIG_DFL);
	raise(SIGSEGV);
	return 0;
}
"""


def test_a_loop_of_handled_faults_is_capped_and_the_crash_still_reads_as_a_fault(
    tmp_path: Path,
) -> None:
    faults = 20_000
    exe = _build(tmp_path, "wr-sig-faulter", FAULTER)
    res = record(tmp_path, [exe, str(faults)])
    trace = read_trace(str(res.path))
    segv = [e for e in trace.events if isinstance(e, Signal) and e.sig == signal.SIGSEGV]
    faulted = [e for e in segv if e.si_code > 0]
    # the first handled faults of each second are kept (at most 8 a second), the rest counted
    assert 1 <= len(faulted) <= 8 * 10, len(faulted)
    assert trace.footer is not None
    counted = trace.footer.extra["signals_unsent"].get("SIGSEGV", 0)
    assert counted + len(faulted) == faults, (counted, len(faulted))
    assert res.lost == 0
    # the re-raise, with SIG_DFL, is sent; the verdict is a crash by a fault, not a kill
    assert any(e.si_code <= 0 for e in segv)
    [v] = res.verdicts
    assert v.cause == "app_exit" and "crashed with SIGSEGV" in v.summary, v
