"""The comparison of the runs: what they show (`Comparison.conclusion`), the table and the
``--json`` document (its shape is documented in `tracer.outputs`)."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracer import safetext
from tracer.analysis.analyzer import (
    CGROUP_OOM,
    GLOBAL_OOM,
    NUMA_OOM,
    PROBE_KILL,
    USERSPACE_OOM,
)
from tracer.analysis.quantities import fmt_bytes
from tracer.repro.judge import DEGRADED, ERROR, FAILED, KILLED, SURVIVED, RunResult
from tracer.repro.plan import MEMORY_HIGH, PROBE_TIMEOUT, Plan, Setting

SCHEMA = 1
# The causes that say a run ended for memory: only these make a memory setting the answer.
MEMORY_CAUSES = frozenset({CGROUP_OOM, GLOBAL_OOM, NUMA_OOM, USERSPACE_OOM})
# Comparison.conclusion()'s kinds (the "conclusion" of --json)
ALL_SURVIVED, SMALLEST_SURVIVED = "all_survived", "smallest_survived"
NONE_SURVIVED, OTHER_REASONS, INTERRUPTED = "none_survived", "other_reasons", "interrupted"


@dataclass
class Comparison:
    plan: Plan
    runs: list[RunResult]
    cgroup_version: int
    parent_cgroup: str
    interrupted: bool = False
    warnings: list[str] = field(default_factory=list)
    stop_signal: int | None = None  # the signal that interrupted the experiment

    def setting_decided(self, r: RunResult) -> bool:
        """Whether a run that did not survive ended for a reason the varied setting governs:
        for a memory setting a memory kill, or a degraded run or a liveness kill while its
        page cache thrashed (the limit is what slowed it; failing probes alone may be anything
        else); a liveness or probe kill for the probe timeout."""
        if self.plan.kind == PROBE_TIMEOUT:
            return r.liveness_kill or (r.verdict is not None and r.verdict.cause == PROBE_KILL)
        if r.outcome == DEGRADED or r.liveness_kill:
            return r.thrash is not None
        return r.outcome == KILLED and r.verdict is not None and r.verdict.cause in MEMORY_CAUSES

    def conclusion(self) -> tuple[str, str]:
        """(kind, text): what the runs show, derived from their verdicts. Advice to try larger
        values only when runs ended for the reason the setting governs; runs that ended for
        other reasons are named as such."""
        name = self._setting_name()
        reason = "the probe timeout" if self.plan.kind == PROBE_TIMEOUT else "memory"
        if self.interrupted:
            sig = signal.Signals(self.stop_signal).name if self.stop_signal else "a signal"
            return INTERRUPTED, (
                f"interrupted by {sig} after {len(self.runs)} of "
                f"{len(self.plan.runs())} runs: no conclusion"
            )
        failed = [r for r in self.runs if not r.survived]
        other = [r for r in failed if not self.setting_decided(r)]
        best = self.smallest_surviving()
        other_text = ", ".join(f"run {r.run} ({self._row_verdict(r)})" for r in other)
        if best is not None:
            s, runs = best
            text = f"{'all runs survived: the smallest' if not failed else 'smallest'} {name}"
            text += f" {'tried is' if not failed else 'that survived:'} {s.text}"
            text += self._headroom_text(s, runs)
            if other:
                text += f"; failed for reasons other than {reason}: {other_text}"
            return (ALL_SURVIVED if not failed else SMALLEST_SURVIVED), text
        if other and len(other) == len(failed):
            return OTHER_REASONS, (
                f"every run failed for reasons other than {reason}: {other_text}; the {name} "
                "did not decide these runs: fix that failure first"
            )
        decided = sorted({self._row_verdict(r) for r in failed if self.setting_decided(r)})
        text = f"no {name} survived every run ({', '.join(decided)}): try larger values"
        if other:
            text += f"; failed for reasons other than {reason}: {other_text}"
        return NONE_SURVIVED, text

    def _headroom_text(self, s: Setting, runs: Sequence[RunResult]) -> str:
        room = self.headroom(s, runs)
        if room is None:
            return ""
        if self.plan.kind == PROBE_TIMEOUT:
            return (
                f" (slowest probe {s.value - room[0]:.3f} s, headroom {room[0]:.3f} s = "
                f"{room[1]:.0f}%)"
            )
        return (
            f" (peak {fmt_bytes(s.value - room[0])}, headroom {fmt_bytes(room[0])} = "
            f"{room[1]:.0f}% of the limit)"
        )

    def by_setting(self) -> list[tuple[Setting, list[RunResult]]]:
        out: dict[str, tuple[Setting, list[RunResult]]] = {}
        for r in self.runs:
            out.setdefault(r.setting.text, (r.setting, []))[1].append(r)
        return list(out.values())

    def smallest_surviving(self) -> tuple[Setting, list[RunResult]] | None:
        """The smallest setting whose every run survived (all ``--runs`` repeats)."""
        ok = [
            (s, runs)
            for s, runs in self.by_setting()
            if len(runs) == self.plan.repeats and all(r.survived for r in runs)
        ]
        return min(ok, key=lambda x: x[0].value) if ok else None

    def headroom(self, setting: Setting, runs: Sequence[RunResult]) -> tuple[float, float] | None:
        """How far the runs stayed from the setting: bytes below a memory setting, seconds
        below a probe timeout; and that as a percentage of the setting."""
        if self.plan.kind == PROBE_TIMEOUT:
            lat = [r.max_probe_latency_s for r in runs if r.max_probe_latency_s is not None]
            if not lat:
                return None
            room: float = setting.value - max(lat)
        else:
            peaks = [r.peak_bytes for r in runs if r.peak_bytes is not None]
            if not peaks:
                return None
            room = setting.value - max(peaks)
        return room, room / setting.value * 100 if setting.value else 0.0

    def check_monotonic(self) -> None:
        """A larger setting that fails where a smaller one survived means the runs are noisy
        (or the setting is not what limits the workload): say so rather than trust one run."""
        ordered = sorted(self.by_setting(), key=lambda x: x[0].value)
        survived_below: Setting | None = None
        for s, runs in ordered:
            if all(r.survived for r in runs):
                survived_below = survived_below or s
            elif survived_below is not None:
                self.warnings.append(
                    f"{s.text} did not survive although {survived_below.text} did: the runs "
                    "disagree (try --runs 3) or this setting is not what limits the workload"
                )

    def to_json(self) -> dict[str, Any]:
        best = self.smallest_surviving()
        smallest = None
        if best is not None:
            room = self.headroom(*best)
            smallest = {
                "setting": best[0].text,
                "value": best[0].value,
                "headroom": room[0] if room else None,
                "headroom_pct": round(room[1], 1) if room else None,
            }
        return {
            "schema": SCHEMA,
            "kind": "repro",
            "setting": self.plan.kind,
            "fixed": self.plan.fixed(),
            "command": self.plan.command,
            "cgroup_version": self.cgroup_version,
            "parent_cgroup": self.parent_cgroup,
            "out_dir": self.plan.out_dir,
            "interrupted": self.interrupted,
            "runs": [r.to_json() for r in self.runs],
            "smallest_surviving": smallest,
            "conclusion": dict(zip(("kind", "text"), self.conclusion(), strict=True)),
            "warnings": self.warnings,
        }

    # -- text ----------------------------------------------------------------------------------

    def _setting_name(self) -> str:
        if self.plan.kind == PROBE_TIMEOUT:
            return "probe timeout"
        from tracer.parse.cgroup import MEMORY_FILES, MEMORY_V2

        if self.plan.kind == MEMORY_HIGH:
            return MEMORY_V2.high
        return MEMORY_FILES[self.cgroup_version].limit

    @staticmethod
    def _row_verdict(r: RunResult) -> str:
        """The verdict column: the cause, and what qualifies it."""
        v = r.verdict
        if r.outcome == ERROR:
            return safetext.field(r.error or "error")
        if r.outcome == SURVIVED and v is None:
            return "still running at the end"
        if r.outcome == DEGRADED and r.degraded is not None:
            return r.degraded.label()
        text = v.cause if v else "-"
        if r.liveness_kill:
            text += " (liveness kill)"
        if r.outcome == FAILED and v is not None and v.exit_code not in (None, 0):
            text += f" (exit {v.exit_code})"
        elif r.outcome == FAILED and v is not None and v.signal is not None:
            text += f" ({v.signal})"
        elif r.outcome == FAILED and r.exit_status is not None:
            text += f" (exit status {r.exit_status})"
        return text

    def _value_text(self, s: Setting) -> str:
        if self.plan.kind == PROBE_TIMEOUT:
            return s.text
        # bytes written as a bare number are hard to read: show them in MiB/GiB too
        return f"{s.text} ({fmt_bytes(s.value)})" if s.text.isdigit() else s.text

    def table(self) -> str:
        header = (
            self._setting_name(),
            "run",
            "outcome",
            "verdict",
            "peak usage",
            "time to kill",
            "stall",
            "probe failures",
        )
        rows = [header]
        for r in self.runs:
            rows.append(
                (
                    self._value_text(r.setting),
                    f"{r.repeat}/{self.plan.repeats}",
                    r.outcome,
                    self._row_verdict(r),
                    fmt_bytes(r.peak_bytes) if r.peak_bytes is not None else "-",
                    f"{r.time_to_kill_s:.2f} s" if r.time_to_kill_s is not None else "-",
                    f"{r.stall_ns / 1e6:.0f} ms",
                    f"{r.probe_failures}/{r.probes}" if self.plan.probe else "-",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        out = "\n".join(lines) + "\n\n"
        for r in self.runs:
            if r.degraded is not None:
                why = "; ".join(r.degraded.reasons())
                out += f"run {r.run} ({r.setting.text}) degraded: {why}\n"
        out += self.conclusion()[1] + "\n"
        for w in self.warnings:
            out += f"warning: {w}\n"
        out += f"traces in {self.plan.out_dir}\n"
        return out
