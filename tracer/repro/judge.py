"""Judging one run: its outcome (survived, killed, failed, error) from the verdicts of its
recording, and `RunResult`, what a run left for the comparison."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracer.analysis.analyzer import APP_EXIT, Verdict
from tracer.repro.plan import Setting

SURVIVED, KILLED, FAILED, ERROR = "survived", "killed", "failed", "error"


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
            "error": self.error,
        }


def deciding_verdict(verdicts: Sequence[Verdict]) -> Verdict | None:
    """The verdict that says how a run ended: the first process that did not end on its own
    (a kill anywhere in the workload decides), else the main process's, else the last."""
    for v in verdicts:
        if v.cause != APP_EXIT:
            return v
    mains = [v for v in verdicts if v.main] or list(verdicts)
    return mains[-1] if mains else None


def judge(
    verdicts: Sequence[Verdict], command_status: int | None, liveness_kill: bool
) -> tuple[str, Verdict | None]:
    """The outcome of one run: killed (by a limit, a signal, a liveness check), failed (the
    workload exited non-zero or crashed on its own), or survived (exit 0, or still running
    when ``--duration`` ended the run)."""
    v = deciding_verdict(verdicts)
    if liveness_kill:
        return KILLED, v
    if v is not None and v.cause != APP_EXIT:
        return KILLED, v
    if v is not None and (v.exit_code not in (0, None) or v.signal is not None):
        return FAILED, v
    if command_status not in (0, None):
        return FAILED, v
    return SURVIVED, v
