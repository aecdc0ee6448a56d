"""Kills by a supervisor or a user-space OOM killer: a probe kill (the unit's health probes
were failing), an eviction or oomd kill (the memory pressure it acted on), and the
supervisor's own record of the kill."""

from __future__ import annotations

from dataclasses import dataclass

from tracer.analysis import senders
from tracer.analysis import wording as say
from tracer.analysis.evidence import HISTORY_NS
from tracer.analysis.findings import (
    HIGH,
    MEDIUM,
    PROBE_KILL,
    USERSPACE_OOM,
    Evidence_,
    Finding,
)
from tracer.analysis.rules.probes import (
    PROBE_WINDOW_NS,
    RUNTIME_HEALTHCHECK,
    failing_probes,
    never_healthy,
)
from tracer.analysis.rules.view import SECOND, SETTLE_NS, ExitView, SenderKill
from tracer.analysis.thrash import Thrash, detect
from tracer.events import (
    CgroupSample,
    RuntimeSample,
)

# Memory pressure that a user-space OOM killer (or a kubelet eviction) acts on, in the minute
# before its kill: any one of these.
PRESSURE_PSI_SOME = 10.0  # % (avg10), host or the victim's cgroups


PRESSURE_AVAILABLE = 0.10  # of MemTotal


PRESSURE_USAGE = 0.90  # of a cgroup's limit


PRESSURE_STALL_NS = 1 * SECOND


THRASH_WINDOW_NS = 10 * SECOND  # a thrash this close before a probe kill slowed its probes


def probe_kill(v: ExitView, kill: SenderKill) -> Finding | None:
    """A supervisor's kill (a runtime, the kubelet, systemd, a --supervisor pid, or the
    process that started the victim) while the unit's health probes were failing or slow."""
    ex, store, last = v.ex, v.ev, kill.last
    failing = failing_probes(v, last.ts)
    # a runtime's own health check (podman/docker HEALTHCHECK) is counted by the runtime,
    # which kills after its own --health-retries: the failed check just before its kill is its
    # decision; our probes need the recording's threshold
    need = 1 if failing and failing[-1].target == RUNTIME_HEALTHCHECK else v.probe_failures
    if not failing or len(failing) < max(1, need):
        return None
    start = last.ts - PROBE_WINDOW_NS
    recent = failing[-max(3, min(len(failing), 8)) :]
    stall = store.stall_ns(store.ancestry(ex.cgroup_id), start, last.ts)
    psi = store.psi_peak(start, last.ts)
    ev = [*kill.evidence, *((p.ts, say.probe_line(p)) for p in recent)]
    # the page cache re-read from disk while the probes failed: slow work, not a hang
    t = thrash_before(v, failing[0].ts, last.ts)
    if t is not None:
        ev.append((t.ts, say.thrash_evidence(t)))
    # (a server re-reading its weights on every request is serving slowly, not starting: a
    # load reads its files once, which is never thrash)
    starting = t is None and never_healthy(v, last.ts) is not None
    # only slow, never failed: the supervisor's patience is inferred, not recorded
    slow_only = all(p.ok and not p.timed_out for p in failing)
    summary, advice = say.probe_kill_text(
        kill.who.description,
        kill.how,
        say.probe_latencies(recent[-3:]),
        stall,
        psi,
        failed_for_ns=last.ts - failing[0].ts,
        slow_only=slow_only,
        starting_ns=last.ts - ex.start_ns if starting else None,
        thrash=t,
    )
    return kill.finding(
        PROBE_KILL,
        # two sources: the prober's failures and the signal hook's record of the kill
        MEDIUM if slow_only else HIGH,
        summary,
        advice,
        ev,
        stall_ns=stall or None,
        probe_failures=len(failing),
    )


def thrash_before(v: ExitView, since: int, until: int) -> Thrash | None:
    """Page-cache thrash of the victim's cgroup or an ancestor in the THRASH_WINDOW_NS before
    ``until`` (or from ``since``, the first failed probe, when that is earlier): the one
    nearest the victim (tracer/analysis/thrash.py)."""
    store = v.ev
    start = min(since, until - THRASH_WINDOW_NS)
    for cid in store.ancestry(v.ex.cgroup_id, at=until):
        info = store.cgroups.get(cid)
        found = detect(store.samples_between(cid, start, until), info.limit_bytes if info else None)
        if found is not None:
            return found
    return None


@dataclass(frozen=True, slots=True)
class Pressure:
    """Memory pressure in the minute before a kill, from the samples: what a user-space OOM
    killer acts on."""

    evidence: tuple[Evidence_, ...]
    words: str  # "PSI some 42%, MemAvailable 180 MiB of 8 GiB, ..." ("" when none seen)
    high: bool  # over a threshold a user-space killer would act on
    stall_ns: int
    host_available: int | None


def pressure_before(v: ExitView, until: int) -> Pressure:
    ex, store = v.ex, v.ev
    start = until - HISTORY_NS
    evidence: list[Evidence_] = []
    high = False
    some: float | None = None
    worst_words: tuple[str, float, int] | None = None
    hosts = [h for h in store.host if start <= h.ts <= until]
    psi = [h for h in hosts if h.psi_some_avg10 is not None]
    if psi:
        top = max(psi, key=lambda h: h.psi_some_avg10 or 0.0)
        some = top.psi_some_avg10 or 0.0
        evidence.append((top.ts, say.host_psi(some, top.psi_full_avg10)))
        high |= some >= PRESSURE_PSI_SOME
    avail = [(h.mem_available, h) for h in hosts if h.mem_total and h.mem_available is not None]
    host_available = None
    if avail:
        host_available, low = min(avail, key=lambda a: a[0])
        evidence.append((low.ts, say.host_available(host_available, low.mem_total)))
        high |= host_available < PRESSURE_AVAILABLE * low.mem_total
    worst: tuple[float, CgroupSample, int] | None = None
    cg_psi: CgroupSample | None = None
    for cid in store.ancestry(ex.cgroup_id, at=until):
        info = store.cgroups.get(cid)
        for smp in store.samples_between(cid, start, until):
            limit = smp.limit_bytes or (info.limit_bytes if info else None)
            if limit and smp.usage_bytes is not None:
                ratio = smp.usage_bytes / limit
                if worst is None or ratio > worst[0]:
                    worst = (ratio, smp, limit)
            if smp.psi_some_avg10 is not None and (
                cg_psi is None or smp.psi_some_avg10 > (cg_psi.psi_some_avg10 or 0.0)
            ):
                cg_psi = smp
    if worst is not None:
        ratio, smp, limit = worst
        evidence.append((smp.ts, say.cgroup_usage(smp.path, smp.usage_bytes or 0, limit)))
        worst_words = (smp.path, ratio, limit)
        high |= ratio >= PRESSURE_USAGE
    if cg_psi is not None and cg_psi.psi_some_avg10:
        evidence.append((cg_psi.ts, say.cgroup_psi(cg_psi.path, cg_psi.psi_some_avg10)))
        high |= cg_psi.psi_some_avg10 >= PRESSURE_PSI_SOME
    stall = store.stall_ns(store.ancestry(ex.cgroup_id), start, until)
    high |= stall >= PRESSURE_STALL_NS
    words = say.pressure_words(some, host_available, worst_words, stall)
    return Pressure(tuple(evidence), words, high, stall, host_available)


def supervisor_record(v: ExitView, kill_ts: int) -> tuple[RuntimeSample, str] | None:
    """The supervisor's own record of this kill (systemd's Result=oom-kill and exit status of
    a unit's main process, read by the recorder as the process ended): the first sample of
    the victim's unit, from the kill to the settle past its exit, that records an exit. Its
    word is quoted beside the kernel's, not trusted over it."""
    if not v.unit or not v.main:
        return None
    end = v.ex.ts + SETTLE_NS
    for r in v.ev.runtime.get(v.unit, ()):
        if kill_ts <= r.ts <= end and (r.oom_killed or r.exit_code is not None):
            return r, say.supervisor_recorded(r.source, r.unit, r.exit_code, r.oom_killed)
    return None


def userspace_oom(v: ExitView, kill: SenderKill) -> Finding | None:
    """A user-space memory killer's kill (systemd-oomd, earlyoom, nohang, lmkd; the kubelet
    evicting under memory pressure), with the pressure it acted on. The killer is known by its
    executable or cgroup (high, with pressure seen), or by its name only (medium); a kubelet's
    kill is an eviction only when the pressure is there (medium: its decision is inferred)."""
    last, who, evidence = kill.last, kill.who, kill.evidence
    p = pressure_before(v, last.ts)
    kubelet = who.role == senders.ROLE_KUBELET
    if kubelet and not p.high:
        return None  # a pod deletion or a redeploy: a signal_kill by the kubelet
    strong = who.identified_by in (senders.BY_EXECUTABLE, senders.BY_CGROUP)
    confidence = HIGH if strong and p.evidence and not kubelet else MEDIUM
    record = supervisor_record(v, last.ts)
    summary, advice = say.userspace_oom_text(
        who.description,
        kill.how,
        p.words,
        kubelet,
        record[0].source if record and record[0].oom_killed else "",
    )
    if record is not None:
        evidence = [*evidence, (record[0].ts, record[1])]
    if not strong:
        evidence = [*evidence, (last.ts, say.known_by_name_only(last.sender_comm))]
    return kill.finding(
        USERSPACE_OOM,
        confidence,
        summary,
        advice,
        [*evidence, *p.evidence],
        stall_ns=p.stall_ns or None,
        host_available=p.host_available,
    )
