"""The process's own exit: an exit code, a death passed on by an init or a main process
(another process of its unit died first), a stop it handled, a sign that memory ran out."""

from __future__ import annotations

from tracer.analysis import senders
from tracer.analysis import wording as say
from tracer.analysis.findings import (
    APP_EXIT,
    CGROUP_OOM,
    GLOBAL_OOM,
    HIGH,
    LOW,
    MEDIUM,
    Evidence_,
    Finding,
    Verdict,
)
from tracer.analysis.rules.supervisors import supervisor_record
from tracer.analysis.rules.view import SECOND, SETTLE_NS, ExitView, sender_of, sent_by
from tracer.events import (
    SI_KERNEL,
    signal_name,
)

ALLOC_FAIL_WINDOW_NS = 10 * SECOND  # "an allocation failure preceded" the exit


# A main process's non-zero exit this soon after another process of its unit was OOM-killed or
# killed by a signal passes that death on (an API server whose engine or worker process died:
# vllm's "Failed core proc(s)", a gunicorn master giving up on its workers). Seconds, not
# more: a later exit has had time for a cause of its own.
RELATED_DEATH_NS = 5 * SECOND


def app_exit(v: ExitView, had_oom: bool) -> Finding:
    ex = v.ex
    code = ex.wait.code if ex.wait.code is not None else -1
    disagree: tuple[str, ...] = (say.OOM_REPORTED_YET_EXITED,) if had_oom else ()
    evidence = [v.exit_ev]
    failures = alloc_failures(v) if code != 0 else []
    if failures:
        evidence = sorted([*failures, v.exit_ev])
    summary, advice = say.app_exit_text(code, bool(failures))
    return Finding(
        cause=APP_EXIT,
        confidence=HIGH,
        summary=summary,
        advice=advice,
        evidence=tuple(evidence),
        disagreements=disagree,
        exit_code=code,
    )


def init_exit(v: ExitView) -> Finding | None:
    """A container's init (tini, dumb-init, docker-init, a shell) exits 128 + N right after
    its child died of signal N: it passed the child's death on, and the unit restarted for
    the child's cause. Medium at most: the cause is the child's, inferred through the init."""
    child, ex = v.child_death, v.ex
    code = ex.wait.code
    if not v.main or child is None or code is None or code <= 128 or child.signal is None:
        return None
    if child.signal != signal_name(code - 128) or not 0 <= ex.ts - child.ts <= SETTLE_NS:
        return None
    summary = say.passed_on(code, child.pid, child.comm, child.summary)
    return _passed_on(child, summary, [v.exit_ev], code)


def _passed_on(child: Verdict, summary: str, more: list[Evidence_], code: int) -> Finding:
    """Another process's death as this exit's cause: its cause, facts and evidence, at medium
    at most (the link is inferred), with this exit's own evidence added."""
    return Finding(
        child.cause,
        MEDIUM if child.confidence != LOW else LOW,
        summary,
        child.advice,
        tuple(sorted([*child.evidence, *more])),
        disagreements=child.disagreements,
        sender_pid=child.sender_pid,
        sender_comm=child.sender_comm,
        sender_role=child.sender_role,
        limit_cgroup=child.limit_cgroup,
        limit_scope=child.limit_scope,
        limit_bytes=child.limit_bytes,
        usage_bytes=child.usage_bytes,
        peak_bytes=child.peak_bytes,
        peak_ts=child.peak_ts,
        breakdown=child.breakdown,
        stall_ns=child.stall_ns,
        host_available=child.host_available,
        exit_code=code,
    )


def related_exit(v: ExitView, had_oom: bool) -> Finding | None:
    """A unit's main process exits non-zero within RELATED_DEATH_NS after another process of
    the unit (its worker, its engine process) was OOM-killed or killed by a signal that the
    main process did not send itself: that death is the cause, passed on with its evidence and
    the gap (an API server exiting 1 after its worker's OOM kill is not a bug of its own).
    Medium at most: the link is inferred from the timing; an OOM report about the main
    process itself (a disagreement app_exit states) leaves it to app_exit."""
    ex, code = v.ex, v.ex.wait.code
    if not v.main or had_oom or not code or not v.related_deaths:
        return None
    lo = max(ex.ts - RELATED_DEATH_NS, ex.start_ns)
    # (deaths the main process caused itself, stopping its workers on its way out, are its
    # doing, not a cause; a pid reused by the main process is not another process)
    near = [
        (d, ppid)
        for d, ppid in v.related_deaths
        if lo <= d.ts <= ex.ts and d.pid != ex.pid and d.sender_pid != ex.pid
    ]
    if not near:
        return None
    # the first death of a cascade is its cause; an OOM kill before any other death
    ooms = [n for n in near if n[0].cause in OOM_CAUSES]
    child, ppid = (ooms or near)[0]
    gap = ex.ts - child.ts
    oom = child.cause in OOM_CAUSES
    line = say.related_death(code, gap, child.pid, child.comm, ppid == ex.pid, oom, child.signal)
    summary = say.related_death_summary(line, child.summary)
    return _passed_on(child, summary, [v.exit_ev, (ex.ts, line)], code)


def handled_stop(v: ExitView) -> Finding | None:
    """A main process that exits 128 + N right after another process sent it signal N, which
    it handled (a shell's ``trap 'exit 143' TERM``, a server's graceful shutdown): stopped on
    request, as a runtime's graceful stop (``docker stop``, CRI StopContainer) ends it, not an
    exit of its own. Worded by who sent it, as a kill is."""
    ex = v.ex
    code = ex.wait.code
    if not v.main or code is None or code <= 128 or code - 128 > 64:
        return None
    sig = next(
        (
            s
            for s in reversed(v.signals)
            if s.sig == code - 128
            and s.sender_pid != ex.pid
            and s.si_code != SI_KERNEL
            and s.result == 0
            and 0 <= ex.ts - s.ts <= SETTLE_NS
        ),
        None,
    )
    if sig is None:
        return None
    who, exe = sender_of(v, sig)
    if who.role in (senders.ROLE_SELF, senders.ROLE_KERNEL):
        return None
    name = signal_name(sig.sig)
    summary, advice = say.sender_text(
        who, say.handled_how(name, code), sig.sender_comm, sig.sender_pid
    )
    evidence = [(sig.ts, say.signal_from(name, sig.sender_pid, sig.sender_comm)), v.exit_ev]
    if who.doubt:
        evidence.append((sig.ts, who.doubt))
    disagree: tuple[str, ...] = ()
    record = supervisor_record(v, sig.ts)
    if record is not None:
        # the runtime's word beside ours; an OOMKilled for a handled stop is its mistake
        # (kubernetes#140718), said so, not taken
        evidence.append((record[0].ts, record[1]))
        if record[0].oom_killed:
            disagree = (say.runtime_claims_oom(record[0].source),)
    return sent_by(sig, who, exe, summary, advice, evidence, disagree, code)


OOM_CAUSES = frozenset((CGROUP_OOM, GLOBAL_OOM))


def alloc_failures(v: ExitView) -> list[Evidence_]:
    """Signs that memory ran out shortly before an exit the process chose: the cgroup's
    charge-failure counters rose, or the process stalled in reclaim."""
    ex, store = v.ex, v.ev
    start = ex.ts - ALLOC_FAIL_WINDOW_NS
    out: list[Evidence_] = []
    if not store.by_cgroup and not v.stalls:
        return out
    for cid in store.ancestry(ex.cgroup_id):
        samples = store.samples_between(cid, start, ex.ts + SETTLE_NS)
        if len(samples) < 2:
            continue
        first, last = samples[0], samples[-1]
        if first.failcnt is not None and last.failcnt is not None and last.failcnt > first.failcnt:
            out.append((last.ts, say.failcnt_rose(last.path, last.failcnt - first.failcnt)))
        for key in ("max", "oom"):
            a, b = first.events.get(key), last.events.get(key)
            if a is not None and b is not None and b > a:
                out.append((last.ts, say.events_rose(key, last.path, b - a)))
    stalls = [s for s in v.stalls if start <= s.ts <= ex.ts]
    if stalls:
        out.append((stalls[-1].ts, say.own_stalls(len(stalls), sum(s.duration_ns for s in stalls))))
    return out
