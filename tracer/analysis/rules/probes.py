"""Health probes as evidence: the run of failures before an exit, a server that never became
healthy, and the failures listed on any verdict whose unit's probes were failing."""

from __future__ import annotations

from tracer.analysis import wording as say
from tracer.analysis.findings import (
    PROBE_KILL,
    Finding,
)
from tracer.analysis.rules.view import SECOND, ExitView, amend
from tracer.events import (
    ProbeSample,
)

PROBE_WINDOW_NS = 60 * SECOND


# A probe that answered this slowly counts as failing for a supervisor whose own timeout we do
# not know (Kubernetes' default timeoutSeconds is 1): a kill after only slow probes is a
# probe kill at medium confidence.
SLOW_PROBE_NS = 1 * SECOND


RUNTIME_HEALTHCHECK = "healthcheck"  # ProbeSample.target of a runtime's own exec health check


def failing_probes(v: ExitView, until: int) -> list[ProbeSample]:
    """The unit's probes that failed (or timed out, or answered slower than SLOW_PROBE_NS)
    without a break up to ``until``, oldest first: a probe that passed resets the count, as
    Kubernetes' failureThreshold does."""
    start = max(until - PROBE_WINDOW_NS, v.ex.start_ns)
    probes = v.ev.probes_between(start, until, v.unit, v.unlabelled_probes)
    run: list[ProbeSample] = []
    for p in reversed(probes):
        if p.ok and not p.timed_out and p.latency_ns < SLOW_PROBE_NS:
            break
        if not p.ok and not p.timed_out and p.ts + p.latency_ns > until:
            # in flight at the exit and refused or reset: the death's effect, not a failure
            # before it (a probe that timed out had waited on a silent server, and counts)
            continue
        run.append(p)
    run.reverse()
    return run


def never_healthy(v: ExitView, until: int) -> int | None:
    """How many of the unit's probes ran from this process's start to ``until`` with none
    passing (it was still starting); None when none ran or one passed, or when the probes
    began over PROBE_WINDOW_NS after its start (a recording that attached to a running server,
    or a start not known: it may have been healthy before)."""
    start = v.ex.start_ns
    probes = v.ev.probes_between(start, until, v.unit, v.unlabelled_probes)
    if not probes or probes[0].ts - start > PROBE_WINDOW_NS or any(p.ok for p in probes):
        return None
    return len(probes)


def with_probe_failures(v: ExitView, f: Finding) -> Finding:
    failing = failing_probes(v, v.ex.ts)
    if not failing:
        return f
    if f.cause == PROBE_KILL:
        return amend(f, probe_failures=len(failing))
    # not the cause, but part of the picture: the failures, and for how long
    lines = [(p.ts, say.probe_line(p)) for p in failing[-3:]]
    lines.append((v.ex.ts, say.probes_failed_before(len(failing), v.ex.ts - failing[0].ts)))
    return amend(f, evidence=tuple(sorted([*f.evidence, *lines])), probe_failures=len(failing))
