"""Judging one run: its outcome (survived, degraded, killed, failed, error) from the verdicts
of its recording, its probes and the thrash seen in it, and `RunResult`, what a run left for
the comparison.

``degraded`` is a run that nothing killed but that did not serve either: probes failed or timed
out once the workload had answered one (earlier failures are it starting, as a kubelet's
startup probe allows; a run that never answered counts them all), or its page cache was
re-read from disk as fast as it could hold it (``tracer.analysis.thrash``: a model's mapped
weights under a limit below them, where /health stays fast and every request re-reads the
model). Such a limit is not one that "survived"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracer.analysis.analyzer import APP_EXIT, Verdict
from tracer.analysis.thrash import Thrash
from tracer.analysis.wording import thrash_words
from tracer.events import ProbeSample
from tracer.repro.plan import Setting

SURVIVED, DEGRADED, KILLED, FAILED = "survived", "degraded", "killed", "failed"
ERROR = "error"


@dataclass(frozen=True, slots=True)
class Degraded:
    """Why a run that was not killed did not survive: its counted probes that failed (see
    `counted_probes`), the thrash seen in it, or both."""

    probes: int  # probes counted
    failures: int  # of them, failed or timed out
    timed_out: int  # of the failures, timed out
    thrash: Thrash | None

    def reasons(self) -> list[str]:
        out = []
        if self.failures:
            late = f" ({self.timed_out} timed out)" if self.timed_out else ""
            out.append(f"{self.failures} of {self.probes} probes failed{late}")
        if self.thrash is not None:
            out.append(thrash_words(self.thrash))
        return out

    def label(self) -> str:
        """The table's short form: "degraded (3/10 probes failed, thrash)"."""
        parts = [f"{self.failures}/{self.probes} probes failed"] if self.failures else []
        parts += ["thrash"] if self.thrash is not None else []
        return f"{DEGRADED} ({', '.join(parts)})"

    def to_json(self) -> dict[str, Any]:
        return {
            "reasons": self.reasons(),
            "probes_counted": self.probes,
            "probe_failures_counted": self.failures,
            "probe_timeouts_counted": self.timed_out,
            "thrash": self.thrash.to_json() if self.thrash is not None else None,
        }


def counted_probes(probes: Sequence[ProbeSample], end_ns: int) -> list[ProbeSample]:
    """The probes that judge a run: those that ended by ``end_ns`` (when the workload exited or
    was told to stop: later ones fail because it is going), from the first that succeeded on
    (the failures before it are the workload starting); all of them when none succeeded."""
    done = [p for p in probes if p.ts + p.latency_ns <= end_ns]
    first_ok = next((i for i, p in enumerate(done) if p.ok and not p.timed_out), None)
    return done if first_ok is None else done[first_ok:]


def degradation(
    probes: Sequence[ProbeSample], end_ns: int, thrash: Thrash | None
) -> Degraded | None:
    """Why the run was degraded, or None when its counted probes all succeeded and nothing
    thrashed."""
    counted = counted_probes(probes, end_ns)
    failed = [p for p in counted if not p.ok or p.timed_out]
    if not failed and thrash is None:
        return None
    return Degraded(len(counted), len(failed), sum(1 for p in failed if p.timed_out), thrash)


@dataclass
class RunResult:
    run: int
    setting: Setting
    repeat: int
    trace: str
    outcome: str = ERROR
    exit_status: int | None = None
    verdict: Verdict | None = None
    peak_bytes: int | None = None
    time_to_kill_s: float | None = None
    duration_s: float = 0.0
    stall_ns: int = 0
    probes: int = 0
    probe_failures: int = 0
    max_probe_latency_s: float | None = None
    liveness_kill: bool = False  # repro killed it after failing probes
    thrash: Thrash | None = None  # the fastest page-cache re-reading seen in the run
    degraded: Degraded | None = None  # why, when the outcome is DEGRADED
    error: str | None = None
    stop_signal: int | None = None  # a signal to repro interrupted this run

    @property
    def survived(self) -> bool:
        return self.outcome == SURVIVED

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "run": self.run,
            "setting": self.setting.text,
            "value": self.setting.value,
            "repeat": self.repeat,
            "trace": self.trace,
            "outcome": self.outcome,
            "survived": self.survived,
            "exit_status": self.exit_status,
            "cause": v.cause if v else None,
            "verdict": (
                {
                    "pid": v.pid,
                    "comm": v.comm,
                    "cause": v.cause,
                    "confidence": v.confidence,
                    "summary": v.summary,
                    "advice": v.advice,
                }
                if v
                else None
            ),
            "peak_bytes": self.peak_bytes,
            "time_to_kill_s": self.time_to_kill_s,
            "duration_s": round(self.duration_s, 3),
            "stall_s": round(self.stall_ns / 1e9, 3),
            "probes": self.probes,
            "probe_failures": self.probe_failures,
            "max_probe_latency_s": self.max_probe_latency_s,
            "liveness_kill": self.liveness_kill,
            "thrash": self.thrash.to_json() if self.thrash is not None else None,
            "degraded": self.degraded.to_json() if self.degraded is not None else None,
            "error": self.error,
        }


def deciding_verdict(verdicts: Sequence[Verdict], stopped_by: int | None = None) -> Verdict | None:
    """The verdict that says how a run ended: the first process that did not end on its own
    (a kill anywhere in the workload decides), else the main process's, else the last.
    ``stopped_by``: the pid that ended the run when its ``--duration`` was up (repro's own
    recorder): its signals are the end of the run, not a kill."""
    if stopped_by is not None:
        verdicts = [v for v in verdicts if v.sender_pid != stopped_by]
    for v in verdicts:
        if v.cause != APP_EXIT:
            return v
    mains = [v for v in verdicts if v.main] or list(verdicts)
    return mains[-1] if mains else None


def judge(
    verdicts: Sequence[Verdict],
    command_status: int | None,
    liveness_kill: bool,
    degraded: Degraded | None = None,
    stopped_by: int | None = None,
) -> tuple[str, Verdict | None]:
    """The outcome of one run: killed (by a limit, a signal, a liveness check), failed (the
    workload exited non-zero or crashed on its own), degraded (neither, but ``degraded`` says
    it did not serve), or survived (exit 0, or still running when ``--duration`` ended the
    run). ``stopped_by``: the pid that stopped the workload at the end of ``--duration``
    (None when it ended on its own): a workload that dies of that SIGTERM ran to the end."""
    v = deciding_verdict(verdicts, stopped_by)
    if liveness_kill:
        return KILLED, v
    if v is not None and v.cause != APP_EXIT:
        return KILLED, v
    if v is not None and (v.exit_code not in (0, None) or v.signal is not None):
        return FAILED, v
    if command_status not in (0, None) and stopped_by is None:
        return FAILED, v
    if degraded is not None:
        return DEGRADED, v
    return SURVIVED, v
