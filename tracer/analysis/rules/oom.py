"""The kernel's OOM killer: the OOM verdict (scope, limiting cgroup, peak, the sources that
agree), an OOM known only from a counter, and when an OOM-killed exit's evidence is all in."""

from __future__ import annotations

import signal as _signal

from tracer.analysis import wording as say
from tracer.analysis.evidence import HISTORY_NS, Evidence
from tracer.analysis.findings import (
    CGROUP_OOM,
    GLOBAL_OOM,
    HIGH,
    LOW,
    MEDIUM,
    NUMA_OOM,
    Evidence_,
    Finding,
)
from tracer.analysis.rules.composition import breakdown, with_composition
from tracer.analysis.rules.probes import never_healthy
from tracer.analysis.rules.view import SECOND, SETTLE_NS, ExitView
from tracer.events import (
    SI_KERNEL,
    Exit,
    KmsgOom,
    OomKill,
)

HEADROOM = 0.15


def oom_evidence_complete(ex: Exit, store: Evidence) -> bool:
    """Whether an OOM-killed exit's evidence is all in before SETTLE_NS has passed: the
    kernel's OOM record (BPF) and its report (the kernel log) for this process, and, where the
    limiting cgroup is sampled, a sample taken at or after the kill (its OOM counter's rise).
    What the settle window waits for is exactly these; with them in, nothing later changes
    the verdict, and a live consumer (the agent) need not wait the rest of the second."""
    if ex.wait.signal != _signal.SIGKILL:
        return False
    pe = store.by_pid.get(ex.pid)
    if pe is None or not pe.ooms or not pe.kmsg:
        return False
    lo = ex.start_ns or ex.ts - HISTORY_NS
    bpf = [o for o in pe.ooms if lo <= o.ts <= ex.ts]
    if not bpf or not any(lo <= k.ts for k in pe.kmsg):
        return False
    oom = best_oom(bpf)
    if oom is None:
        return False
    if not oom.memcg:
        return True  # (a global OOM: no cgroup counter is read)
    cg = store.by_cgroup.get(oom.limit_cgroup_id or ex.cgroup_id)
    return cg is None or not cg.samples or cg.sample_ts[-1] >= oom.ts


def oom_kill(v: ExitView) -> Finding:
    ex, store = v.ex, v.ev
    evidence: list[Evidence_] = []
    disagree: list[str] = []
    bpf = best_oom(v.ooms)
    km = v.kmsg[-1] if v.kmsg else None
    # The mark_victim rungs guess the scope (a cgroup found at its limit by walking up from
    # the victim); the kernel log states the OOM's constraint. Where both exist, the kernel's
    # word settles the scope: a cgroup that happened to sit near its limit during a global OOM
    # is not the cause. (fentry/kprobe read oc->memcg: exact, a vote like the log's.)
    guessed = bpf is not None and km is not None and bpf.rung not in EXACT_RUNGS
    votes = [e.memcg for e in (bpf, km) if e is not None and not (guessed and e is bpf)]
    if bpf is not None:
        evidence.append((bpf.ts, say.bpf_oom(bpf, store.path(bpf.limit_cgroup_id))))
    if km is not None:
        evidence.append((km.ts, say.kmsg_oom(km)))
    limit_id, limit_path, limit_bytes, usage, differ = limiting_cgroup(v, bpf, km)
    if differ:
        disagree.append(differ)
    oom_ts = min([o.ts for o in v.ooms if not o.exiting] + [k.ts for k in v.kmsg])
    for s in v.signals:
        # __oom_kill_process() sends the SIGKILL just before mark_oom_victim(): the signal
        # may precede the OOM event by microseconds.
        if s.sig == _signal.SIGKILL and s.si_code == SI_KERNEL and abs(s.ts - oom_ts) < SECOND:
            evidence.append((s.ts, say.oom_killer_signal(s.sender_comm)))
    memcg = any(votes)
    numa = numa_constraint(bpf, km)
    if len(set(votes)) > 1:
        disagree.append(say.CONSTRAINTS_DISAGREE)
    if guessed and bpf is not None and km is not None and bpf.memcg != km.memcg:
        disagree.append(say.scope_guess_overruled(bpf.rung, bpf.memcg))
    sources = int(bpf is not None) + int(km is not None)
    counter = oom_counter(store, limit_id or ex.cgroup_id, oom_ts) if memcg else None
    if counter is not None:
        evidence.append(counter)
        sources += 1
    said = runtime_exit(store, ex)
    if said is not None:
        evidence.append(said)
        sources += 1
    evidence.append(v.exit_ev)
    peak, peak_ts, parts, stall, host_avail = around_kill(store, ex, km, limit_id, usage, oom_ts)
    scope = None
    if limit_id:
        scope = "own" if limit_id == ex.cgroup_id else "ancestor"
    confidence = HIGH if sources >= 2 and not disagree else MEDIUM if sources >= 1 else LOW
    evidence.sort()
    if memcg:
        cause = CGROUP_OOM
        where = store.cgroup_label(limit_id, limit_path)
        summary, advice = say.cgroup_oom_text(
            where, limit_bytes, scope, host_avail, stall, peak, HEADROOM, never_healthy(v, oom_ts)
        )
        summary, advice, said = with_composition(
            v, km, oom_ts, limit_id, limit_bytes or usage, summary, advice
        )
        if said is not None:
            evidence.append(said)
            evidence.sort()
    elif numa:
        cause, summary, advice = NUMA_OOM, say.numa_oom_summary(numa), say.NUMA_OOM_ADVICE
    else:
        cause, summary, advice = GLOBAL_OOM, say.GLOBAL_OOM_SUMMARY, say.GLOBAL_OOM_ADVICE
    return Finding(
        cause,
        confidence,
        summary,
        advice,
        tuple(evidence),
        tuple(disagree),
        signal="SIGKILL",
        limit_cgroup=limit_path if memcg else None,
        limit_scope=scope if memcg else None,
        limit_bytes=limit_bytes if memcg else None,
        usage_bytes=usage if memcg else None,
        peak_bytes=peak if memcg else None,
        peak_ts=peak_ts if memcg else None,
        breakdown=parts,
        stall_ns=stall,
        host_available=host_avail,
    )


# BPF rungs that read the OOM's memory cgroup from the kernel's own oom_control; the others
# walk the victim's ancestors for one at its limit, a guess the kernel log can overrule
EXACT_RUNGS = frozenset(("kprobe", "fentry"))


# The kernel's CONSTRAINT_CPUSET / CONSTRAINT_MEMORY_POLICY (oom_control, and the kernel log's
# oom-kill line): the allocation could only use some NUMA nodes, and those ran out.
_NUMA_CONSTRAINTS = {
    "cpuset": "cpuset",
    "mempolicy": "mempolicy",
    "CONSTRAINT_CPUSET": "cpuset",
    "CONSTRAINT_MEMORY_POLICY": "mempolicy",
}


def best_oom(ooms: list[OomKill]) -> OomKill | None:
    """The record that says most about the kill: never a mark of a victim that was already
    exiting by itself (task_will_free_mem(): the OOM killer marked it and killed nothing); the
    exact rungs' (oom_control read) before the guesses; the first of equals (a later mark of the
    same process is another of its threads, outside the kill). Not simply the last: a guess
    that came after the exact record would override its scope."""
    kills = [o for o in ooms if not o.exiting]
    exact = [o for o in kills if o.rung in EXACT_RUNGS]
    return exact[0] if exact else kills[0] if kills else None


def numa_constraint(bpf: OomKill | None, km: KmsgOom | None) -> str | None:
    """ "cpuset" or "mempolicy" when the OOM was confined to some NUMA nodes, as oom_control
    (the exact rungs) or the kernel log's constraint says; None otherwise."""
    for said in (bpf.constraint if bpf else "", km.constraint if km else ""):
        if said in _NUMA_CONSTRAINTS:
            return _NUMA_CONSTRAINTS[said]
    return None


def limiting_cgroup(
    v: ExitView, bpf: OomKill | None, km: KmsgOom | None
) -> tuple[int, str | None, int | None, int | None, str | None]:
    """The memory cgroup whose limit killed: (id, path, limit, usage at the kill, what
    disagreed). BPF's, unless it was the ancestor walk's guess and the kernel log names
    another (the log prints the OOM's own memcg); the kernel log's alone, as the cgroup that
    was at that path at the kill (a restart may have made a new one there since)."""
    ex, store = v.ex, v.ev
    limit_id = 0
    limit_path: str | None = None
    limit_bytes = usage = None
    differ = None
    if bpf is not None and bpf.memcg:
        limit_id = bpf.limit_cgroup_id
        limit_path = store.path(limit_id) if limit_id else None
        limit_bytes, usage = bpf.limit_bytes or None, bpf.usage_bytes or None
    if km is not None and km.memcg and km.oom_memcg and limit_path != km.oom_memcg:
        if limit_path is not None:
            differ = say.cgroups_disagree(km.oom_memcg, limit_path)
        if limit_path is None or (bpf is not None and bpf.rung not in EXACT_RUNGS):
            limit_path = km.oom_memcg
            if store.path(ex.cgroup_id) == km.oom_memcg:
                limit_id = ex.cgroup_id
            else:
                limit_id = store.id_of_path(km.oom_memcg, at=km.ts) or 0
            limit_bytes = usage = None
    if limit_bytes is None and limit_id:
        info = store.cgroups.get(limit_id)
        limit_bytes = info.limit_bytes if info else None
    return limit_id, limit_path, limit_bytes, usage, differ


def around_kill(
    store: Evidence, ex: Exit, km: KmsgOom | None, limit_id: int, usage: int | None, oom_ts: int
) -> tuple[int | None, int | None, tuple[tuple[str, int], ...], int | None, int | None]:
    """The picture around an OOM kill: (peak usage of the limiting cgroup and when, the
    memory breakdown, reclaim stall time in the minute before, the host's available memory)."""
    window = oom_ts - HISTORY_NS
    peak = peak_ts = None
    for smp in store.samples_between(limit_id, window, oom_ts) if limit_id else []:
        if smp.usage_bytes is not None and (peak is None or smp.usage_bytes > peak):
            peak, peak_ts = smp.usage_bytes, smp.ts
    if usage is not None and (peak is None or usage >= peak):
        peak, peak_ts = usage, oom_ts
    parts = breakdown(store, ex, km, oom_ts, limit_id)
    stall = store.stall_ns([*store.ancestry(ex.cgroup_id), limit_id], window, oom_ts) or None
    host = store.host_at(oom_ts)
    return peak, peak_ts, parts, stall, host.mem_available if host else None


def oom_counter(store: Evidence, cgroup_id: int, oom_ts: int) -> Evidence_ | None:
    """memory.events oom_kill (v2) / memory.oom_control oom_kill (v1) rising across the
    kill: a third, independent source."""
    samples = store.samples_between(cgroup_id, oom_ts - HISTORY_NS, oom_ts + SETTLE_NS)
    before = [s for s in samples if s.ts < oom_ts and "oom_kill" in s.events]
    after = [s for s in samples if s.ts >= oom_ts and "oom_kill" in s.events]
    if before and after and after[-1].events["oom_kill"] > before[-1].events["oom_kill"]:
        n = after[-1].events["oom_kill"] - before[-1].events["oom_kill"]
        return (after[-1].ts, say.oom_counter_rose(after[-1].path, n))
    # read after the fact (post-mortem): a counter that started at 0 before the kill
    total = store.oom_counts.get(cgroup_id)
    if total is not None and total.count > 0 and total.ts <= oom_ts <= total.read_ns:
        return (total.read_ns, say.oom_count_reads(total.path, total.count))
    return None


def runtime_exit(store: Evidence, ex: Exit) -> Evidence_ | None:
    """The supervisor's own record of this very exit, read after the fact (post-mortem): its
    main process ended by SIGKILL (code 137) at this time. The runtime saw the death itself
    (conmon, containerd-shim and systemd wait for their child), so it is a source beside the
    kernel's log; its OOMKilled flag is quoted, not trusted (podman 4.3 says false for real
    OOM kills)."""
    for r in store.runtime_exits.get(ex.cgroup_id, ()):
        if (
            r.exit_code == 128 + _signal.SIGKILL
            and r.pid in (0, ex.pid)
            and abs(r.ts - ex.ts) <= SETTLE_NS
        ):
            return (r.ts, say.runtime_exit_says(r.source, r.unit, r.exit_code, r.oom_killed))
    return None


def counted_oom(v: ExitView) -> Finding | None:
    """A SIGKILL with no sender and no OOM report seen, where a memory cgroup's OOM counter
    (or a runtime's flag read from one: Docker's OOMKilled, systemd's Result=oom-kill) says an
    OOM kill happened in its cgroup during its life: cgroup_oom at medium confidence, since a
    counter names no victim."""
    ex, store = v.ex, v.ev
    evidence: list[Evidence_] = []
    where_id = 0
    for cid in store.ancestry(ex.cgroup_id):
        total = store.oom_counts.get(cid)
        if total is not None and total.count > 0 and total.ts <= ex.ts <= total.read_ns:
            evidence.append((total.read_ns, say.oom_count_reads(total.path, total.count)))
            where_id = where_id or cid
    for r in store.runtime_exits.get(ex.cgroup_id, ()):
        if r.oom_killed and r.pid in (0, ex.pid) and abs(r.ts - ex.ts) <= SETTLE_NS:
            evidence.append((r.ts, say.runtime_says_oom(r.source, r.unit)))
            where_id = where_id or ex.cgroup_id
    if not evidence:
        return None
    path = store.path(where_id)
    info = store.cgroups.get(where_id)
    limit = info.limit_bytes if info else None
    summary, advice = say.counted_oom_text(store.cgroup_label(where_id, path), limit)
    return Finding(
        CGROUP_OOM,
        MEDIUM,
        summary,
        advice,
        tuple(sorted([*evidence, v.exit_ev])),
        signal="SIGKILL",
        limit_cgroup=path,
        limit_scope=("own" if where_id == ex.cgroup_id else "ancestor") if path else None,
        limit_bytes=limit,
    )
