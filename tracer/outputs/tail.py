"""The live ``tail`` view: notable memory-pressure events as one line each. Pure.

Fed events in time order (and the verdict an exit produced), it returns the lines to show:
OOM kills, exits with their verdicts, long stalls, usage crossing 90% of the effective limit,
PSI over thresholds, memory.high throttling, lost events, the time-to-limit warnings of
``tracer/analysis/eta.py`` (when a warning starts, when its time left halves, when it ends), and
page-cache thrash (``tracer/analysis/thrash.py``: when it starts, when its rate doubles, when it
ends).
Storms are folded: per cgroup and kind, at most ``MAX_STALL_LINES`` single-stall lines per
window, and a summary line per window
("312 reclaim stalls, 4.1 s total, in /x over 2.0 s") once the window closes. Routine clean
exits (code 0, not a unit's main process) are folded the same way, per unit: at most
``MAX_CLEAN_LINES`` per window, then one "N more clean exits" line. A line older than one
already shown (a verdict is final only once the kernel log had its time to arrive) says how late
it is, so the stream never silently goes back in time. ``replay --tail`` runs the same code on a
trace, so it shows exactly what ``tail`` showed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.analysis.eta import Eta
from tracer.analysis.quantities import fmt_bytes, fmt_duration
from tracer.analysis.thrash import Thrash
from tracer.analysis.wording import lost_records, stall_kind, thrash_line
from tracer.events import (
    CgroupSample,
    EffectiveLimit,
    Event,
    HostSample,
    Lost,
    OomKill,
    ReclaimStall,
    ReclaimSummary,
)

INFO, WARN, CRIT = "info", "warn", "crit"

WINDOW_NS = 2_000_000_000
MAX_STALL_LINES = 3  # single-stall lines per cgroup/kind/window before folding into a summary
MAX_CLEAN_LINES = 3  # clean-exit lines per unit/window before folding
SUMMARY_MIN_STALLS = 100  # a window with fewer stalls and little stall time stays quiet
SUMMARY_MIN_NS = 100_000_000
USAGE_WARN = 0.90
USAGE_REARM = 0.85
PSI_SOME_WARN = 10.0  # avg10 %, "some": at least one task stalled on memory
PSI_FULL_WARN = 5.0  # "full": all non-idle tasks stalled at once
ETA_REPEAT_S = 20.0  # a time-to-limit warning is shown again at half the time, down to this


@dataclass(frozen=True, slots=True)
class TailLine:
    ts: int
    severity: str
    text: str
    eta: Eta | None = None  # a time-to-limit warning's estimate (``--json`` carries it)
    thrash: Thrash | None = None  # page cache re-read from disk (``--json`` carries it)


@dataclass
class _Window:
    start: int
    count: int = 0
    total_ns: int = 0
    lines: int = 0


@dataclass
class PressureFeed:
    """Turns events into tail lines. ``cgroup_path`` names cgroup ids (from CgroupInfo)."""

    cgroup_path: Callable[[int], str | None]
    # the Analyzer's time-to-limit warning of a watched cgroup (``Analyzer.forecast``), and the
    # unit a cgroup is (``Analyzer.unit_of_cgroup``'s label): without them, no warning lines
    forecast: Callable[[int], Eta | None] | None = None
    thrash: Callable[[int], Thrash | None] | None = None  # ``Analyzer.thrash``
    unit_of: Callable[[int, str], str | None] | None = None
    _eta_shown: dict[int, float] = field(default_factory=dict)  # cgroup id -> seconds shown
    _thrash_shown: dict[int, float] = field(default_factory=dict)  # cgroup id -> rate shown
    _windows: dict[tuple[int, str], _Window] = field(default_factory=dict)
    _limits: dict[int, int | None] = field(default_factory=dict)  # cgroup id -> effective limit
    _usage_high: set[int] = field(default_factory=set)
    _psi_high: set[tuple[int, str]] = field(default_factory=set)
    _high_events: dict[int, int] = field(default_factory=dict)
    _clean: dict[str, _Window] = field(default_factory=dict)  # unit -> its clean exits
    _newest: int = 0  # the newest line shown so far

    def _mark_late(self, lines: list[TailLine]) -> list[TailLine]:
        out = []
        for line in lines:
            if line.ts < self._newest:
                late = fmt_duration(self._newest - line.ts)
                line = replace(line, text=f"{line.text} (shown {late} late)")
            self._newest = max(self._newest, line.ts)
            out.append(line)
        return out

    def _name(self, cgroup_id: int) -> str:
        if cgroup_id == 0:
            return "the host"
        return self.cgroup_path(cgroup_id) or f"cgroup id {cgroup_id}"

    def feed(self, ev: Event | None, verdicts: Sequence[Verdict] = ()) -> list[TailLine]:
        """Lines for one event and for the verdicts that became final with it (``ev`` None:
        verdicts reached at the end of the stream)."""
        return self._mark_late(self._feed(ev, verdicts))

    def _feed(self, ev: Event | None, verdicts: Sequence[Verdict]) -> list[TailLine]:
        out = self._close_windows(ev.ts) if ev is not None else []
        for v in verdicts:
            clean = v.cause == "app_exit" and v.exit_code == 0
            sev = INFO if clean else CRIT
            if clean and not v.main and self._fold_clean(v):
                continue
            unit = f" [{v.unit}{'' if v.main else ', child'}]" if v.unit else ""
            out.append(
                TailLine(
                    v.ts,
                    sev,
                    f"exit    pid {v.pid} ({v.comm}){unit}: {v.cause} "
                    f"({v.confidence}) - {v.summary}",
                )
            )
        if ev is None:
            pass
        elif isinstance(ev, OomKill):
            where = (
                f"{self._name(ev.limit_cgroup_id)} at its limit {fmt_bytes(ev.limit_bytes)}"
                if ev.memcg
                else "the host out of memory"
            )
            out.append(
                TailLine(
                    ev.ts,
                    CRIT,
                    f"OOM     kill of pid {ev.victim_pid} ({ev.victim_comm or '?'}): {where}",
                )
            )
        elif isinstance(ev, ReclaimStall):
            out.extend(self._stall(ev))
        elif isinstance(ev, ReclaimSummary):
            self._summary(ev)
        elif isinstance(ev, EffectiveLimit):
            self._limits[ev.cgroup_id] = ev.limit_bytes
        elif isinstance(ev, CgroupSample):
            out.extend(self._cgroup_sample(ev))
        elif isinstance(ev, HostSample):
            out.extend(self._psi(ev.ts, 0, ev.psi_some_avg10, ev.psi_full_avg10))
        elif isinstance(ev, Lost):
            out.append(TailLine(ev.ts, WARN, f"LOST    {lost_records(ev.count)}"))
        return out

    def flush(self, ts: int) -> list[TailLine]:
        """Close every open window (end of the stream)."""
        return self._mark_late(self._close_windows(ts, force=True))

    def _fold_clean(self, v: Verdict) -> bool:
        """Count a routine clean exit; True when its line is folded into the window's."""
        unit = v.unit or ""
        w = self._clean.get(unit)
        if w is None:
            w = self._clean[unit] = _Window(start=v.ts)
        w.lines += 1
        if w.lines <= MAX_CLEAN_LINES:
            return False
        w.count += 1
        return True

    # -- storms ----------------------------------------------------------------------------

    def _window(self, key: tuple[int, str], ts: int) -> _Window:
        w = self._windows.get(key)
        if w is None:
            w = self._windows[key] = _Window(start=ts)
        return w

    def _stall(self, ev: ReclaimStall) -> list[TailLine]:
        w = self._window((ev.cgroup_id, ev.kind), ev.ts)
        w.lines += 1
        if w.lines > MAX_STALL_LINES:
            return []
        return [
            TailLine(
                ev.ts,
                WARN,
                f"stall   pid {ev.pid} ({ev.comm}) "
                f"{ev.duration_ns / 1e6:.0f} ms in "
                f"{stall_kind(ev.kind)} of "
                f"{self._name(ev.cgroup_id)}",
            )
        ]

    def _summary(self, ev: ReclaimSummary) -> None:
        if ev.kind == "kswapd":
            return
        w = self._window((ev.cgroup_id, ev.kind), ev.ts - ev.interval_ns)
        w.count += ev.count
        w.total_ns += ev.total_ns

    def _close_windows(self, ts: int, force: bool = False) -> list[TailLine]:
        out = []
        for unit in sorted(self._clean):
            c = self._clean[unit]
            if not force and ts - c.start < WINDOW_NS:
                continue
            del self._clean[unit]
            if c.count:
                span = max(ts - c.start, 1) if force else WINDOW_NS
                out.append(
                    TailLine(
                        ts,
                        INFO,
                        f"exits   {c.count} more clean exits (code 0) in {unit or 'no unit'} "
                        f"over {span / 1e9:.1f} s",
                    )
                )
        for key in sorted(self._windows):
            w = self._windows[key]
            if not force and ts - w.start < WINDOW_NS:
                continue
            del self._windows[key]
            if w.count >= SUMMARY_MIN_STALLS or w.total_ns >= SUMMARY_MIN_NS:
                span = max(ts - w.start, 1) if force else WINDOW_NS
                cgroup_id, kind = key
                out.append(
                    TailLine(
                        ts,
                        WARN,
                        f"storm   {w.count} {stall_kind(kind)} "
                        f"stalls, {fmt_duration(w.total_ns)} total, in "
                        f"{self._name(cgroup_id)} over {span / 1e9:.1f} s",
                    )
                )
        return out

    # -- samples ---------------------------------------------------------------------------

    def _cgroup_sample(self, ev: CgroupSample) -> list[TailLine]:
        out = self._eta(ev) + self._thrash(ev)
        limit = self._limits.get(ev.cgroup_id) or ev.limit_bytes
        if limit and ev.usage_bytes is not None:
            frac = ev.usage_bytes / limit
            if frac >= USAGE_WARN and ev.cgroup_id not in self._usage_high:
                self._usage_high.add(ev.cgroup_id)
                out.append(
                    TailLine(
                        ev.ts,
                        WARN,
                        f"usage   {ev.path} at {frac:.0%} of its "
                        f"effective limit ({fmt_bytes(ev.usage_bytes)}"
                        f" of {fmt_bytes(limit)})",
                    )
                )
            elif frac < USAGE_REARM:
                self._usage_high.discard(ev.cgroup_id)
        high = ev.events.get("high")
        if high is not None:
            prev = self._high_events.get(ev.cgroup_id)
            self._high_events[ev.cgroup_id] = high
            if prev is not None and high > prev:
                out.append(
                    TailLine(
                        ev.ts,
                        WARN,
                        f"high    {ev.path} over memory.high "
                        f"{high - prev} times: allocations throttled",
                    )
                )
        out.extend(self._psi(ev.ts, ev.cgroup_id, ev.psi_some_avg10, ev.psi_full_avg10, ev.path))
        return out

    def _eta(self, ev: CgroupSample) -> list[TailLine]:
        """A line when a watched cgroup's warning starts, again when its time left has halved
        since the last line (while that was ETA_REPEAT_S or more: not a line a second in the
        last seconds), and one when the growth stops (tracer/analysis/eta.py)."""
        if self.forecast is None:
            return []
        est = self.forecast(ev.cgroup_id)
        shown = self._eta_shown.get(ev.cgroup_id)
        unit = (self.unit_of(ev.cgroup_id, ev.path) if self.unit_of else None) or ev.path
        if est is None:
            if shown is None:
                return []
            del self._eta_shown[ev.cgroup_id]
            return [TailLine(ev.ts, INFO, f"eta     {unit}: no longer heading for its limit")]
        if shown is not None and (est.seconds >= shown / 2 or shown < ETA_REPEAT_S):
            return []
        self._eta_shown[ev.cgroup_id] = est.seconds
        return [TailLine(ev.ts, WARN, f"eta     {eta_text(unit, est)}", est)]

    def _thrash(self, ev: CgroupSample) -> list[TailLine]:
        """A line when a watched cgroup starts re-reading its page cache from disk, again when
        the rate has doubled since the last line, and one when it stops."""
        if self.thrash is None:
            return []
        now = self.thrash(ev.cgroup_id)
        shown = self._thrash_shown.get(ev.cgroup_id)
        unit = (self.unit_of(ev.cgroup_id, ev.path) if self.unit_of else None) or ev.path
        if now is None:
            if shown is None:
                return []
            del self._thrash_shown[ev.cgroup_id]
            return [TailLine(ev.ts, INFO, f"thrash  {unit}: no longer re-reading its page cache")]
        if shown is not None and now.rate < 2 * shown:
            return []
        self._thrash_shown[ev.cgroup_id] = now.rate
        return [TailLine(ev.ts, WARN, f"thrash  {thrash_line(unit, now)}", thrash=now)]

    def _psi(
        self,
        ts: int,
        cgroup_id: int,
        some: float | None,
        full: float | None,
        path: str | None = None,
    ) -> list[TailLine]:
        out = []
        where = path or self._name(cgroup_id)
        for name, value, limit in (("some", some, PSI_SOME_WARN), ("full", full, PSI_FULL_WARN)):
            key = (cgroup_id, name)
            if value is None:
                continue
            if value >= limit and key not in self._psi_high:
                self._psi_high.add(key)
                out.append(
                    TailLine(
                        ts,
                        WARN,
                        f"psi     memory {name} avg10 {value:.1f}% in "
                        f"{where}: tasks are waiting on memory",
                    )
                )
            elif value < limit / 2:
                self._psi_high.discard(key)
        return out


def feed_of(analyzer: Callable[[], Analyzer]) -> PressureFeed:
    """The tail's feed, naming cgroups and units and taking the time-to-limit warnings from
    the analyzer ``analyzer()`` returns (live, the recorder's, once it exists; on replay, the
    replay's): ``tail`` and ``replay --tail`` / ``--warnings`` are built here alike."""

    def unit_of(cgroup_id: int, path: str) -> str | None:
        unit = analyzer().unit_of_cgroup(cgroup_id, path)
        return unit.label if unit is not None else None

    return PressureFeed(
        lambda cid: analyzer().cgroup_path(cid),
        forecast=lambda cid: analyzer().forecast(cid),
        thrash=lambda cid: analyzer().thrash(cid),
        unit_of=unit_of,
    )


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def eta_text(unit: str, est: Eta) -> str:
    """A time-to-limit warning in words (the unit and path are escaped where the line is
    printed, with the rest of it)."""
    lim = est.limit
    what = "limit" if lim.kind == "max" else "memory.high (allocations throttled)"
    where = "" if lim.path == unit else f" on {lim.path}"
    low, high = _seconds(est.low_s), _seconds(est.high_s)
    band = f" ({low}-{high})" if low != high else ""
    return (
        f"{unit} will reach its {fmt_bytes(lim.bytes)} {what}{where} in "
        f"~{_seconds(est.seconds)}{band} at +{fmt_bytes(est.rate)}/s {est.growing}; "
        f"{fmt_bytes(est.used)} used, {fmt_bytes(est.reclaimable)} of it reclaimable"
    )
