"""Every sentence the verdict rules say: summaries, advice, evidence lines and disagreements.
Pure string work, kept apart from the rules (tracer/analysis/rules/) so that a rule reads as
its logic and the words can change without touching it. (The GPU rules' verdict words are in
tracer/analysis/rules/gpu.py, beside the one rule family that uses them; the words a GPU event
and a verdict share are here.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from tracer.analysis.quantities import fmt_bytes, fmt_duration
from tracer.analysis.senders import ROLE_KUBELET, ROLE_OOM_DAEMON, ROLE_SUPERVISOR, Sender
from tracer.analysis.thrash import Thrash
from tracer.events import Exit, GpuLost, GpuXid, KmsgOom, OomKill, ProbeSample, signal_name
from tracer.parse.xid import xid_meaning

# -- exits -----------------------------------------------------------------------------------


# Exit.rung of exits no recording saw, known after the fact (post-mortem) from a report:
# the kernel log's OOM report, or a runtime's record of its container's or unit's last exit
REPORTED_EXITS = frozenset(("kmsg", "podman", "docker", "systemd"))


def describe_status(ex: Exit) -> str:
    ws = ex.wait
    who = f"pid {ex.pid} ({ex.comm})" if ex.pid else f"{ex.comm or 'its main process'}"
    if ws.signal is not None:
        what = f"{who} killed by {signal_name(ws.signal)}" + (
            " (core dumped)" if ws.core_dumped else ""
        )
    else:
        what = f"{who} exited with code {ws.code}"
    if ex.rung in REPORTED_EXITS:
        source = "the kernel log" if ex.rung == "kmsg" else ex.rung
        what += f" (known from {source}" + ("; it keeps no pid)" if not ex.pid else ")")
    return what


@functools.lru_cache(maxsize=1024)
def app_exit_text(code: int, alloc_failures: bool) -> tuple[str, str]:
    """An app_exit verdict's summary and advice: one shared copy per exit code (thousands of
    kept verdicts of a crash-looping program would each hold their own otherwise)."""
    note = "; memory allocation failures preceded it" if alloc_failures else ""
    advice = ""
    if code != 0:
        advice = f"the application chose to exit: read its own log for why it returned {code}"
        if note:
            advice += (
                "; it ran out of memory it was allowed and handled it itself: raise "
                "the limit or lower its memory use"
            )
    return f"exited on its own with code {code}{note}", advice


OOM_REPORTED_YET_EXITED = "an OOM kill was reported for this pid, yet it exited on its own"


def oom_reported_yet_killed(name: str) -> str:
    return f"an OOM kill was reported for this pid, yet it died of {name}"


def failcnt_rose(path: str, n: int) -> str:
    return f"memory.failcnt of {path} rose by {n}: charges failed"


def events_rose(key: str, path: str, n: int) -> str:
    return f"memory.events {key} of {path} rose by {n}"


def own_stalls(n: int, total_ns: int) -> str:
    return f"{n} long reclaim stalls ({total_ns / 1e6:.0f} ms) of this process"


# -- OOM kills -------------------------------------------------------------------------------


def bpf_oom(bpf: OomKill, limit_path: str | None) -> str:
    where = f" in {limit_path}" if limit_path else ""
    return (
        f"[{bpf.rung}] OOM killer chose pid {bpf.victim_pid}, "
        f"{'memcg' if bpf.memcg else _NODES.get(bpf.constraint, 'global')}{where}"
        + (" at its memory+swap limit (memory.memsw.limit_in_bytes)" if bpf.memsw else "")
        + (" (already exiting: marked, not killed)" if bpf.exiting else "")
    )


_NODES = {"cpuset": "cpuset-constrained (NUMA)", "mempolicy": "mempolicy-constrained (NUMA)"}


def scope_guess_overruled(rung: str, guessed_memcg: bool) -> str:
    guess = "a cgroup at its limit (memcg)" if guessed_memcg else "no cgroup at its limit (global)"
    return (
        f"the {rung} rung found {guess} by walking cgroups; the kernel log's constraint "
        "says otherwise and decides"
    )


def kmsg_oom(km: KmsgOom) -> str:
    rss = f", anon-rss {km.anon_rss_kb} kB" if km.anon_rss_kb is not None else ""
    return (
        f"kernel log: {km.constraint or 'OOM report'}"
        + (f", oom_memcg={km.oom_memcg}" if km.oom_memcg else "")
        + rss
    )


def oom_killer_signal(sender_comm: str) -> str:
    return f"SIGKILL from the kernel (the OOM killer, running in {sender_comm})"


def oom_counter_rose(path: str, n: int) -> str:
    return f"oom_kill counter of {path} rose by {n}"


def oom_count_reads(path: str, n: int) -> str:
    return f"oom_kill counter of {path} reads {n} (OOM kills since the cgroup was created)"


def runtime_exit_says(source: str, unit: str, code: int | None, oom_flag: bool | None) -> str:
    flag = "" if oom_flag is None else f" (its OOMKilled flag: {oom_flag})"
    return f"{source} says {unit} exited with code {code}{flag}"


def runtime_says_oom(source: str, unit: str) -> str:
    return f"{source} says {unit} was OOM-killed"


def counted_oom_text(where: str, limit_bytes: int | None) -> tuple[str, str]:
    """A SIGKILL that only a cgroup's OOM counter (or a runtime's flag read from one) explains."""
    return (
        f"OOM-killed, by the count of OOM kills in {where} (limit {fmt_bytes(limit_bytes)}); "
        "no OOM report for this process was seen to name the victim",
        f"raise the limit of {where} or lower its memory use; record the next one to see the "
        "kill itself (whyrestart record)",
    )


def cgroups_disagree(kmsg_memcg: str, bpf_path: str) -> str:
    return f"kernel log names {kmsg_memcg} as the OOM cgroup, BPF found {bpf_path} at its limit"


CONSTRAINTS_DISAGREE = "BPF and the kernel log disagree on memcg vs global constraint"


# Usage this close to the limit at the kill means the kill was at the limit: the memory the
# process wanted is unknown, only that it is more than the limit.
AT_LIMIT = 0.95


def cgroup_oom_text(
    where: str,
    limit_bytes: int | None,
    scope: str | None,
    host_avail: int | None,
    stall: int | None,
    peak: int | None,
    headroom: float,
    starting_probes: int | None = None,
) -> tuple[str, str]:
    """A cgroup OOM's summary and advice. ``starting_probes``: the health probes that ran
    from the process's start to the kill without one passing (it never became healthy)."""
    whose = {"own": "its own cgroup", "ancestor": "the ancestor"}.get(scope or "", "")
    summary = f"OOM-killed: {where} hit its limit {fmt_bytes(limit_bytes)}" + (
        f" ({whose})" if whose else ""
    )
    if starting_probes:
        summary += (
            f"; it was still starting (none of its {starting_probes} health "
            f"probe{'s' if starting_probes != 1 else ''} had passed)"
        )
    if host_avail is not None:
        summary += f"; the host had {fmt_bytes(host_avail)} available"
    if stall:
        summary += f"; {fmt_duration(stall)} of reclaim stalls in the minute before"
    which = "the parent" if scope == "ancestor" else "that"
    if limit_bytes and (peak is None or peak >= limit_bytes * AT_LIMIT):
        # a peak at the limit is the limit, not the need: "15% over the peak" would fail again
        when = " while it was still starting" if starting_probes else ""
        advice = (
            f"peak {fmt_bytes(peak or limit_bytes)} = the effective limit "
            f"{fmt_bytes(limit_bytes)} set on {where}{when}: it was killed at the limit, so "
            f"it needed more than {fmt_bytes(limit_bytes)} (its real need is unknown and "
            f"higher); raise {which} limit (find the smallest "
            "that holds with whyrestart repro --memory-max A,B,C -- COMMAND)"
        )
        return summary, advice
    target = int((peak or limit_bytes or 0) * (1 + headroom))
    advice = (
        f"peak {fmt_bytes(peak)} vs effective limit {fmt_bytes(limit_bytes)} set "
        f"on {where}: keep >= 15% headroom (>= {fmt_bytes(target)}) or raise "
        f"{which} limit"
    )
    return summary, advice


GLOBAL_OOM_SUMMARY = "OOM-killed by the host's OOM killer: the whole machine ran out of memory"
NUMA_OOM_ADVICE = (
    "the memory nodes it was confined to were exhausted while other nodes may have had memory "
    "free: widen the allowed nodes (cpuset.mems, numactl --membind, the Kubernetes Memory "
    "Manager's reservation), use a preferred or interleaved policy, or size it to one node"
)


def numa_oom_summary(kind: str) -> str:
    by = "its cpuset's memory nodes" if kind == "cpuset" else "its memory policy's nodes"
    return f"OOM-killed by the host's OOM killer: {by} ran out of memory (NUMA-constrained)"


GLOBAL_OOM_ADVICE = (
    "the host itself was exhausted: find the largest consumers, add memory, "
    "or set per-service limits so one service cannot starve the rest"
)

# -- signals ---------------------------------------------------------------------------------


def no_sender_text(name: str, core: str) -> tuple[str, str]:
    return (
        f"killed by {name}{core}, but neither its sender nor an OOM kill was seen",
        "record from before the exit with the signal hook attached "
        "(whyrestart doctor); exit status alone does not tell who killed it",
    )


NO_SIGNAL_EVENT = "no signal event for this exit"


def pdeath_text(name: str, core: str, pid: int, comm: str) -> tuple[str, str]:
    return (
        f"killed by {name}{core}: the parent-death signal it asked for (PR_SET_PDEATHSIG), sent "
        f"by the kernel as the thread of {comm} (pid {pid}) that started it exited",
        "the parent-death signal fires when the thread that forked the child exits, even "
        "though the parent process lives on: fork from a thread that lives as long as the "
        "parent (Go: runtime.LockOSThread around the start), or do not ask for it",
    )


def pdeath_line(name: str, pid: int, comm: str) -> str:
    return f"{name} from the kernel as a thread of {comm} (pid {pid}) exited (PR_SET_PDEATHSIG)"


def tty_text(name: str, core: str) -> tuple[str, str]:
    if name == "SIGHUP":
        return (
            f"killed by SIGHUP{core} from its terminal: the terminal or the ssh session it ran "
            "in hung up",
            "run it detached from the terminal (a service, setsid, nohup, tmux) if it must "
            "outlive the session",
        )
    key = "Ctrl-\\" if name == "SIGQUIT" else "Ctrl-C"
    return (
        f"interrupted with {name}{core} from its terminal ({key} typed there, sent by the tty "
        "driver)",
        f"someone pressed {key} at the terminal it runs on; run it detached from the terminal "
        "(a service, setsid, nohup) if that was not meant",
    )


def tty_line(name: str) -> str:
    return f"{name} from the terminal driver (a key typed at its terminal, or a hang-up)"


OWN_SIGNAL_SOURCES = {
    "timer": "its own POSIX timer (timer_create with SIGEV_SIGNAL)",
    "itimer": "its own interval timer (alarm() or setitimer())",
    "sigio": "its own asynchronous I/O notification (O_ASYNC / F_SETSIG)",
    "rlimit_cpu": "its CPU time limit (RLIMIT_CPU, ulimit -t)",
}


def own_source_text(source: str, name: str, core: str) -> tuple[str, str]:
    what = OWN_SIGNAL_SOURCES[source]
    if source == "rlimit_cpu":
        return (
            f"killed by {name}{core}: it used up {what}",
            "raise the CPU time limit where it is set (ulimit -t, LimitCPU=, "
            "setrlimit), or find what made it spin",
        )
    return (
        f"killed by {name}{core} from {what}: the kernel raised it, no process sent it",
        f"the program armed {name} without handling it: handle, block or ignore the signal "
        "before arming it",
    )


def own_source_line(source: str, name: str) -> str:
    return f"{name} from {OWN_SIGNAL_SOURCES[source]}"


def sent_by_kernel(name: str, pid: int, comm: str) -> str:
    return f"{name} sent by the kernel (in the context of pid {pid}, {comm})"


NO_OOM_REPORT = "no OOM report (BPF or kernel log) was seen for this process"


def kernel_kill_counted_text(where: str) -> tuple[str, str]:
    return (
        f"killed by the kernel with SIGKILL while the OOM kill counter of {where} rose: an OOM "
        "kill whose report was not seen (the kernel log late or lost)",
        f"{where} hit its memory limit: raise the limit or lower its use; record with the "
        "OOM hooks attached (whyrestart doctor) for the limit and the peak",
    )


def namespace_end_text(init_pid: int) -> tuple[str, str]:
    return (
        f"killed by the kernel with SIGKILL as its container's init (pid {init_pid}) exited: "
        "a PID namespace ends with its init",
        "look at why its container's main process ended: this process went down with it",
    )


def unexplained_kernel_kill_text(lost: int) -> tuple[str, str]:
    why = (
        f"; {lost} records were lost around it" if lost else ": the kernel log may be late or lost"
    )
    return (
        f"killed by the kernel with SIGKILL, but no OOM report or other reason was seen{why}",
        "an OOM kill is likely but not shown: check the kernel log (dmesg) around this time "
        "and the memory cgroup's oom_kill counter; record with a larger buffer if records "
        "were lost",
    )


# a stall's kind (ReclaimStall.kind, tracer.analysis.quantities.STALL_KINDS) in words
_STALL_WORDS = {
    "memcg": "reclaim",
    "direct": "host direct reclaim",
    "high": "memory.high throttling",
    # not the cgroup's own stall (quantities.STALL_KINDS leaves it out)
    "external": "reclaim by a task outside the cgroup (memory.reclaim or a limit write)",
}


def stall_kind(kind: str) -> str:
    return _STALL_WORDS.get(kind, kind)


def lost_records(n: int) -> str:
    """Records the kernel could not hand over, worded once for every output."""
    return f"{n} records lost (the ring buffer was full)"


def lost_evidence(n: int) -> str:
    return f"{lost_records(n)}: evidence may be missing"


def oom_reported_yet_sent(name: str, sender_pid: int, sender_comm: str) -> str:
    return (
        f"an OOM kill was reported for this pid, yet the {name} that ended it came from "
        f"pid {sender_pid} ({sender_comm}), not the kernel"
    )


def killed_by_other(name: str, sender_pid: int, sender_comm: str) -> str:
    return f"it was killed with {name} by pid {sender_pid} ({sender_comm})"


def passed_on(code: int, pid: int, comm: str, summary: str) -> str:
    return f"exited with code {code}, passing on the death of pid {pid} ({comm}): {summary}"


def related_death(
    code: int, gap_ns: int, pid: int, comm: str, worker: bool, oom: bool, sig: str | None
) -> str:
    who = f"its worker pid {pid} ({comm})" if worker else f"pid {pid} ({comm}) of the same unit"
    how = "was OOM-killed" if oom else f"was killed by {sig or 'a signal'}"
    return f"exited {code}, {fmt_duration(gap_ns)} after {who} {how}"


def related_death_summary(line: str, summary: str) -> str:
    # (the line already says how it died: "... was OOM-killed: OOM-killed: ..." says it twice)
    return f"{line}: {summary.removeprefix('OOM-killed: ')}"


def raised_by_itself(name: str) -> str:
    return f"{name} raised by the process itself"


def self_inflicted_text(name: str, core: str, fault: bool) -> tuple[str, str]:
    if fault:
        return (
            f"crashed with {name}{core}",
            "the process faulted: look at its core dump or stack trace",
        )
    if name == "SIGABRT":
        return (
            f"aborted itself with SIGABRT{core} (abort(), e.g. a failed assertion)",
            "the application aborted: read its own log for the reason",
        )
    return (
        f"killed itself with {name}{core} (it sent the signal to itself, e.g. kill -9 $$)"
        if name == "SIGKILL"
        else f"killed itself with {name}{core} (it sent the signal to itself)",
        f"the application sent itself {name}: read its own log for the reason",
    )


def tmpfs_full_text(
    name: str, core: str, mount_point: str, size: int, used: int
) -> tuple[str, str]:
    """A SIGBUS at a fault while a tmpfs it sees was full (rules/signals.py, tmpfs_crash)."""
    where = mount_point  # (outputs escape a verdict's text: tracer/outputs/text.py)
    return (
        f"crashed with {name}{core}: the tmpfs {where} was full ({fmt_bytes(used)} of "
        f"{fmt_bytes(size)} used); a write to a memory-backed file with no room left faults "
        "instead of failing",
        f"give {where} more room: for a container's /dev/shm, --shm-size (docker/podman run; "
        "Kubernetes: an emptyDir with medium: Memory mounted there), for another tmpfs a bigger "
        "size= (mount -o remount,size=...); or delete the files left on it. Not a memory "
        "limit: raising the memory limit does not help",
    )


def tmpfs_full_line(mount_point: str, size: int, used: int, avail: int, via_pid: int) -> str:
    via = f" (read through pid {via_pid}, in its mount namespace)" if via_pid else ""
    return (
        f"tmpfs {mount_point} full after the fault: {fmt_bytes(used)} of "
        f"{fmt_bytes(size)} used, {fmt_bytes(avail)} free{via}"
    )


def signal_from(name: str, sender_pid: int, sender_comm: str) -> str:
    return f"{name} from pid {sender_pid} ({sender_comm})"


def stop_how(grace_s: float) -> str:
    return f"SIGTERM, then SIGKILL {grace_s:.1f} s later (the stop grace period ran out)"


def handled_how(name: str, code: int) -> str:
    return f"{name}, which it handled: it exited with code {code}"


def runtime_claims_oom(source: str) -> str:
    """A runtime's OOMKilled for an exit that was no OOM kill (containerd derives it from the
    cgroup's cumulative OOM counter: a child's earlier OOM kill marks every later exit)."""
    return f"{source} says OOMKilled"


def supervisor_recorded(source: str, unit: str, code: int | None, oom_flag: bool | None) -> str:
    """A supervisor's own record of an exit, quoted (systemd: Result=, ExecMainStatus)."""
    what = f"exit code {code}" if code is not None else "an exit"
    if source == "systemd":
        flag = ", Result=oom-kill" if oom_flag else ""
    else:
        flag = "" if oom_flag is None else f" (its OOMKilled flag: {oom_flag})"
    return f"{source} recorded {what} for {unit}{flag}"


def userspace_oom_text(
    who: str, how: str, pressure: str, kubelet: bool, recorded_oom_by: str = ""
) -> tuple[str, str]:
    """``recorded_oom_by``: the supervisor that recorded this kill as an OOM kill, if one
    did (systemd's Result=oom-kill after systemd-oomd's kill)."""
    seen = f"; in the minute before: {pressure}" if pressure else "; no pressure samples seen"
    if recorded_oom_by:
        seen += f"; {recorded_oom_by} recorded it as an OOM kill"
    if kubelet:
        return (
            f"evicted by {who} with {how} under memory pressure{seen}",
            "the node ran short of memory and the kubelet evicted the pod: set memory requests "
            "that match its use (a pod using more than its request goes first), or give the "
            "node more memory; `kubectl describe pod` shows the eviction",
        )
    return (
        f"killed by {who} with {how}: a user-space OOM killer acting on memory pressure{seen}",
        "a user-space OOM killer acted on memory pressure before the kernel would have: "
        "check its thresholds (PSI, free memory) and this service's memory use; the host's "
        "free memory is not the number it watches",
    )


def known_by_name_only(comm: str) -> str:
    return (
        f"the sender was known only by its name ({comm}): its executable and cgroup were not "
        "seen (recorded from before it started, or gone when its signal was read)"
    )


def pressure_words(
    psi_some: float | None,
    available: int | None,
    fullest: tuple[str, float, int] | None,
    stall_ns: int,
) -> str:
    """The pressure of the minute before a kill, in a few words ("" when none was seen)."""
    words = []
    if psi_some is not None:
        words.append(f"host memory PSI some {psi_some:.0f}%")
    if available is not None:
        words.append(f"MemAvailable {fmt_bytes(available)}")
    if fullest is not None:
        path, ratio, limit = fullest
        words.append(f"{path} at {ratio:.0%} of {fmt_bytes(limit)}")
    if stall_ns:
        words.append(f"{fmt_duration(stall_ns)} of reclaim stalls")
    return ", ".join(words)


def host_psi(some: float, full: float | None) -> str:
    tail = f", full {full:.1f}%" if full is not None else ""
    return f"host memory PSI some peaked at {some:.1f}%{tail} (avg10)"


def host_available(available: int, total: int) -> str:
    return f"host MemAvailable fell to {fmt_bytes(available)} of {fmt_bytes(total)}"


def cgroup_usage(path: str, usage: int, limit: int) -> str:
    return f"{path} used {fmt_bytes(usage)} of its {fmt_bytes(limit)} limit ({usage / limit:.0%})"


def cgroup_psi(path: str, some: float) -> str:
    return f"memory PSI some of {path} peaked at {some:.1f}% (avg10)"


def kubelet_text(how: str) -> tuple[str, str]:
    return (
        f"killed by the kubelet with {how}",
        "the kubelet killed it: a failing liveness probe, an eviction or a pod "
        "deletion; check `kubectl describe pod` events for which",
    )


def supervisor_text(who: str, how: str) -> tuple[str, str]:
    return (
        f"stopped by {who} with {how}",
        "the supervisor stopped it (a stop, redeploy or restart policy): check "
        "the supervisor's log for why",
    )


def sender_text(who: Sender, how: str, sender_comm: str, sender_pid: int) -> tuple[str, str]:
    """A kill by another process, worded by who sent it."""
    if who.role == ROLE_OOM_DAEMON:  # (a userspace_oom: rules/supervisors.py words it)
        return userspace_oom_text(who.description, how, "", False)
    if who.role == ROLE_KUBELET:
        return kubelet_text(how)
    if who.role == ROLE_SUPERVISOR:
        return supervisor_text(who.description, how)
    return other_sender_text(who.description, how, sender_comm, sender_pid)


def other_sender_text(who: str, how: str, sender_comm: str, sender_pid: int) -> tuple[str, str]:
    return (
        f"killed by {how} from {who}",
        f"{sender_comm} (pid {sender_pid}) stopped it: check why that "
        "sender acted (a redeploy, a stop, a manual kill, a watchdog)",
    )


# -- health probes ---------------------------------------------------------------------------


def probe_latencies(recent: list[ProbeSample]) -> str:
    return ", ".join(
        f"{p.latency_ns / 1e6:.0f} ms{' (timed out)' if p.timed_out else ''}"
        f"{'' if p.ok else ' failed'}"
        for p in recent
    )


def probe_line(p: ProbeSample) -> str:
    outcome = "timed out" if p.timed_out else "ok" if p.ok else f"failed ({p.error or p.status})"
    return f"probe {p.target}: {p.latency_ns / 1e6:.0f} ms, {outcome}"


def probes_failed_before(n: int, for_ns: int) -> str:
    return f"health probes had failed for {fmt_duration(for_ns)} ({n} in a row) before this exit"


def probe_kill_text(
    who: str,
    how: str,
    lat: str,
    stall: int,
    psi: float | None,
    failed_for_ns: int = 0,
    slow_only: bool = False,
    starting_ns: int | None = None,
    thrash: Thrash | None = None,
) -> tuple[str, str]:
    context = ""
    if thrash is not None:
        context += f"; its cgroup's {thrash_words(thrash)} as its probes failed"
    if stall:
        context += f"; {fmt_duration(stall)} of reclaim stalls in the minute before"
    if psi is not None:
        context += f"; memory PSI some peaked at {psi:.1f}%"
    what = "slow health probes" if slow_only else "failing health probes"
    during = f" for {fmt_duration(failed_for_ns)}" if failed_for_ns else ""
    summary = f"killed by {who} with {how} after {what}{during} (last: {lat}){context}"
    if starting_ns is not None:
        summary += (
            "; it was still starting: it had never answered its probe healthy in the "
            f"{fmt_duration(starting_ns)} since it started"
        )
        advice = (
            "killed while starting, not hung: its start-up (a model loading) outlasts the "
            "probe's failure budget (failures x period); give it a startup probe (Kubernetes "
            "startupProbe) or a longer initial delay, not more memory"
        )
    elif thrash is not None:
        advice = (
            "it was not hung but starved of page cache: its limit leaves no room for the "
            "files it reads (a model's mapped weights, read again on every request), so "
            "requests crawled; raise the memory limit above those files plus the process's "
            "own memory, or load the model without mmap where its anon memory fits; a longer "
            "probe timeout only hides it"
        )
    elif stall:
        advice = (
            f"the probe failed during {fmt_duration(stall)} of reclaim stalls: give the "
            "service memory headroom and raise the probe timeout; don't hide real "
            "hangs"
        )
    else:
        advice = (
            "the health probe failed and the supervisor killed it: find why the "
            "service stopped answering (its log, a deadlock, CPU starvation) before "
            "loosening the probe"
        )
    return summary, advice


RSS_KEYS = {"anon_rss": "anon-rss", "file_rss": "file-rss", "shmem_rss": "shmem-rss"}


def memory_at_kill(breakdown: tuple[tuple[str, int], ...], fmt: Callable[[int], str]) -> str:
    """A verdict's breakdown, each part named for what it measured: the limiting cgroup's
    charge (the kernel's OOM report or memory.stat), and the victim's RSS from the kernel log
    (which is not the cgroup's page cache)."""
    cgroup = [(k, b) for k, b in breakdown if k not in RSS_KEYS]
    victim = [(k, b) for k, b in breakdown if k in RSS_KEYS]
    said = []
    if cgroup:
        said.append(f"the limiting cgroup's memory at the kill: {composition_parts(cgroup, fmt)}")
    if victim:
        parts = ", ".join(f"{RSS_KEYS[k]} {fmt(b)}" for k, b in victim)
        said.append(
            f"the victim's RSS at the kill (kernel log): {parts} (file-rss is mapped files, "
            "which may be charged to other cgroups)"
        )
    return "; ".join(said)


# What each part of the limiting cgroup's composition is called (the keys of split_stat in
# rules/composition.py; the older "file" of traces recorded before the split keeps its name).
COMPOSITION_KEYS = {
    "anon": "anon",
    "shmem": "tmpfs/shared memory",
    "file_mapped": "mapped files",
    "file_unmapped": "unmapped page cache",
    "kernel": "kernel",
    "slab": "of it slab",
    "pagetables": "of it page tables",
    "sock": "sockets",
    "swap": "swap",
}
# The parts the kernel can drop under pressure (clean page cache; dirty pages after
# writeback). anon and shmem need swap, kernel memory is mostly pinned.
_RECLAIMABLE = ("file_mapped", "file_unmapped")
_UNRECLAIMABLE = ("anon", "shmem", "kernel", "sock")


def composition_parts(parts: list[tuple[str, int]], fmt: Callable[[int], str]) -> str:
    """The limiting cgroup's parts, named, and what of them was reclaimable."""
    named = ", ".join(f"{COMPOSITION_KEYS.get(k, k)} {fmt(b)}" for k, b in parts)
    return named + _reclaimable(parts, fmt)


def _reclaimable(parts: list[tuple[str, int]], fmt: Callable[[int], str]) -> str:
    got = dict(parts)
    if not any(k in got for k in _RECLAIMABLE):
        return ""
    free = sum(got.get(k, 0) for k in _RECLAIMABLE)
    pinned = sum(got.get(k, 0) for k in _UNRECLAIMABLE)
    return f" ({fmt(free)} reclaimable page cache, {fmt(pinned)} not reclaimable)"


def composition_source_kmsg(path: str) -> str:
    return f"kernel OOM report: memory cgroup stats for {path or 'the OOM memcg'}"


def composition_source_sample(path: str, after_ns: int) -> str:
    ms = after_ns / 1e6
    when = f"{ms:.0f} ms after the kill" if ms >= 0 else f"{-ms:.0f} ms before the kill"
    return f"memory.stat of {path} read {when}"


def stepwise_growth(levels: tuple[int, ...], span_ns: int) -> tuple[str, str]:
    """Anon memory that rose in steps and never came back down (analysis.growth), for the
    summary and the advice."""
    path = " -> ".join(fmt_bytes(v) for v in levels)
    return (
        f"its anon memory rose in {len(levels) - 1} steps over {span_ns / 1e9:.0f} s and never "
        f"came back down ({path})",
        "each burst of work added memory that nothing gave back: a cache the requests fill "
        "(a server's prompt or KV cache, kept per request) or a leak; bound that cache, or a "
        "higher limit only moves the kill",
    )


def composition_text(
    parts: tuple[tuple[str, int], ...], limit_bytes: int | None
) -> tuple[str, str] | None:
    """What filled the limiting cgroup, for the summary, and what to do about it, for the
    advice: the dominant part named in words a user acts on. None without a composition."""
    got = dict(parts)
    groups = {
        "shmem": got.get("shmem", 0),
        "file": got.get("file_mapped", 0) + got.get("file_unmapped", 0),
        "anon": got.get("anon", 0),
        "kernel": got.get("kernel", 0) + got.get("sock", 0),
    }
    used = sum(groups.values())
    if used <= 0:
        return None
    total = limit_bytes or used
    top = max(groups, key=lambda k: groups[k])
    size, of = fmt_bytes(groups[top]), fmt_bytes(total)
    if top == "shmem":
        return (
            f"{size} of the {of} were tmpfs/shared memory",
            "files in a memory-backed filesystem (tmpfs, /dev/shm) stay charged to the cgroup "
            "after the process dies, so the restarted process starts with them already used: "
            "delete or cap those files (tmpfs size=, --shm-size) rather than only raising the "
            "limit",
        )
    if top == "file":
        mapped = got.get("file_mapped", 0)
        return (
            f"{size} of the {of} was page cache (mapped files {fmt_bytes(mapped)}), reclaimable",
            f"the page cache (e.g. a mapped model file, {fmt_bytes(mapped)} mapped) was "
            f"reclaimable: the anon {fmt_bytes(groups['anon'])} and "
            f"{fmt_bytes(groups['shmem'] + groups['kernel'])} of shmem and kernel memory are "
            "what did not fit",
        )
    if top == "kernel":
        pct = 100 * groups["kernel"] // total
        detail = ", ".join(
            f"{name} {fmt_bytes(got[k])}"
            for k, name in (("slab", "slab"), ("sock", "sockets"), ("pagetables", "page tables"))
            if got.get(k)
        )
        return (
            f"kernel memory was {pct}% of the {of}" + (f" ({detail})" if detail else ""),
            "kernel memory is charged to the cgroup: look for many connections (socket "
            "buffers), many files or directories (slab) or huge address spaces (page tables)",
        )
    return (
        f"{size} of the {of} was anon memory (the processes' own allocations, not reclaimable "
        "without swap)",
        "the processes' own allocations filled it (not page cache or tmpfs)",
    )


# -- the GPU ---------------------------------------------------------------------------------


def n_failures(n: int) -> str:
    """ "3 failures", "1 failure"."""
    return f"{n} failure{'s' if n != 1 else ''}"


def gpu_down(e: GpuXid | GpuLost) -> str:
    """A lost device or an Xid as the driver reports it: "Xid 79 on 0000:3b:00: GPU has fallen off
    the bus", "GPU 0000:3b:00: GPU is lost"."""
    if isinstance(e, GpuXid):
        dev = f" on {e.device}" if e.device else ""
        return f"Xid {e.xid}{dev}: {xid_meaning(e.xid)}"
    dev = f" {e.device}" if e.device else ""
    what = {
        "gpu_is_lost": "GPU is lost",
        "reset_required": "GPU requires a reset",
        "fallen_off_bus": "GPU has fallen off the bus",
    }.get(e.reason, e.reason)
    return f"GPU{dev}: {what}"


# -- page-cache thrash (tracer/analysis/thrash.py) -------------------------------------------


def thrash_words(t: Thrash) -> str:
    """What thrash is, with its numbers: "page cache re-read from disk at 610 MiB/s (3.0 GiB
    in 5 s, 34 times the 90 MiB of file pages it can keep, 90 MiB of them mapped)"."""
    seconds = (t.ts - t.since) / 1e9
    times = t.refaulted / t.cache if t.cache else 0.0
    keep = (
        f", {times:.0f} times the {fmt_bytes(t.cache)} of file pages it can keep" if times else ""
    )
    mapped = f", {fmt_bytes(t.mapped)} of them mapped" if t.mapped and times else ""
    return (
        f"page cache re-read from disk at {fmt_bytes(t.rate)}/s ({fmt_bytes(t.refaulted)} in "
        f"{seconds:.0f} s{keep}{mapped})"
    )


def thrash_evidence(t: Thrash) -> str:
    """An evidence line: the cgroup, the thrash."""
    return f"{t.path}: {thrash_words(t)}"


def thrash_line(unit: str, t: Thrash) -> str:
    """The tail's line: the unit, the thrash, and what it means."""
    at = ""
    if t.limit and t.usage is not None:
        at = f" at {fmt_bytes(t.usage)} of its {fmt_bytes(t.limit)} limit"
    return (
        f"{unit}: {thrash_words(t)}{at}: the limit leaves no room for the files it reads "
        "(a model's mapped weights are read again on every request); raise the limit above "
        "them plus the process's own memory"
    )


def carried_memory(path: str, used: int, shmem: int | None, cache: int | None) -> str:
    """A restart that began with memory already charged: how much, and what it was."""
    parts = []
    if shmem:
        parts.append(f"{fmt_bytes(shmem)} tmpfs/shared memory")
    if cache:
        parts.append(f"{fmt_bytes(cache)} page cache")
    what = f" ({', '.join(parts)})" if parts else ""
    why = (
        ": files in a memory-backed filesystem outlive the process and count against the "
        "limit of the next run"
        if shmem and shmem * 2 >= used
        else ": left by the previous run, charged to the cgroup until reclaimed"
    )
    return f"the new run started with {fmt_bytes(used)} already charged to {path}{what}{why}"
