"""Time to the next memory limit: an estimate from the samples the recorder already takes. Pure.

``estimate(samples, limit)`` answers "at the growth of the last half-minute, when does this
cgroup reach its limit?" with an ``Eta`` (seconds, a band, the growth rate, what is used and
what of it is reclaimable), or None when there is nothing to warn about. ``Forecasts`` keeps the
current estimate of each watched cgroup up to date as the Analyzer is fed (the one place
samples are judged, so ``tail``, the agent and ``replay`` give the same warnings).

What grows. The kernel reclaims clean page cache before it OOM-kills, so file pages are not
what kills: the estimate follows the memory it cannot simply drop,
``unreclaimable = usage - (file - shmem - file_dirty - file_writeback)`` (anon, shmem/tmpfs,
kernel memory, and file pages still to be written), or ``anon + shmem + kernel`` where the
sample has no usage. The limit is the effective one: the smallest ``memory.max`` on the way to
the root (the recorder's ``EffectiveLimit``), or a smaller ``memory.high`` of the cgroup or an
ancestor (cgroup v2: where throttling starts); the samples read are those of the cgroup that
holds it, since a parent's limit counts its whole subtree.

The estimator, over the samples of the last ``window_s`` (30 s; at most ``MAX_POINTS`` of them,
evenly thinned), from the last fall of a quarter of the limit on (``since_last_fall``: a
restarted process's readings are its own):

1. **Robust slope.** Theil-Sen: the median of the slopes between every pair of points, so a
   few outliers (a sample taken mid-reclaim) do not move it. The band is the slopes' 25th and
   75th percentiles: ``low_s = headroom / p75`` and ``high_s = headroom / p25``.
2. **Sustained.** The points span at least ``min_span_s`` (15 s); the 25th percentile slope is
   above zero (three quarters of all pairs rose: noise around a flat line has about half);
   at least ``min_up_fraction`` (60%) of the steps that moved went up; and the growth the 25th
   percentile slope gives over the window is at least ``min_growth_bytes`` (4 MiB) and
   ``min_growth_fraction`` (1%) of the limit. Adversarial noise of peak-to-peak amplitude A
   cannot make the 25th percentile slope exceed 4*A over the span (75% of pairs must be
   more than half the span apart), so noise under a quarter of the minimum growth never warns.
3. **Not levelling off.** The Theil-Sen slope of the newest third of the window is at least
   ``min_recent_ratio`` (50%) of the oldest third's: a startup ramp that is flattening out
   (a load that slows as it completes, ``1 - exp(-t/tau)`` with tau up to 8 s) is not
   projected to the limit.
4. **Soon.** The projection, from the fitted level now (or the last reading, if higher), reaches
   the limit within ``horizon_s`` (5 minutes).

A ramp that levels off is never warned about once flat (step 3, then step 2); while it still
climbs at a steady rate for longer than ``min_span_s`` it is indistinguishable from a leak and
is warned about, as it should be if it were heading for the limit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from tracer.events import CgroupSample, EffectiveLimit
from tracer.parse.cgpath import ancestors, effective_limit

NS = 1_000_000_000
MiB = 1024 * 1024
MAX_POINTS = 48  # Theil-Sen is quadratic: 48 points are 1128 pairs (~0.3 ms here)
MAX_WATCHED = 4096
# a cgroup near its limit is sampled every 50 ms: it is estimated at most this often (an
# estimate over 600 samples costs ~0.8 ms here; 4 a second is 0.3% of a core while it grows)
EVERY_NS = 250_000_000

# (cgroup id, start, end) -> that cgroup's kept samples in [start, end], in time order
SamplesOf = Callable[[int, int, int], Sequence[CgroupSample]]


@dataclass(frozen=True, slots=True)
class Params:
    horizon_s: float = 300.0
    window_s: float = 30.0
    min_span_s: float = 15.0
    min_up_fraction: float = 0.6
    min_growth_bytes: int = 4 * MiB
    min_growth_fraction: float = 0.01
    min_recent_ratio: float = 0.5


DEFAULT = Params()


@dataclass(frozen=True, slots=True)
class Level:
    """What one sample says: all of it used, what of it the kernel could drop, and the parts
    that it could not (None: the sample does not say)."""

    ts: int
    used: int
    reclaimable: int
    unreclaimable: int
    anon: int | None
    shmem: int | None
    kernel: int | None


def level_of(s: CgroupSample) -> Level | None:
    """The sample's split into reclaimable and unreclaimable memory (module docstring)."""
    st = s.stat
    anon, shmem, kernel, file = st.get("anon"), st.get("shmem"), st.get("kernel"), st.get("file")
    dirty = st.get("file_dirty", 0) + st.get("file_writeback", 0)
    reclaimable = max(0, (file or 0) - (shmem or 0) - dirty)
    if s.usage_bytes is not None:
        used = s.usage_bytes
        unreclaimable = max(0, used - reclaimable)
    elif anon is not None:
        unreclaimable = anon + (shmem or 0) + (kernel or 0) + dirty
        used = unreclaimable + reclaimable
    else:
        return None
    return Level(s.ts, used, reclaimable, unreclaimable, anon, shmem, kernel)


@dataclass(frozen=True, slots=True)
class Limit:
    bytes: int
    path: str  # the cgroup whose limit it is
    kind: str = "max"  # "max": memory.max / limit_in_bytes; "high": memory.high (throttling)


@dataclass(frozen=True, slots=True)
class Eta:
    """A warning: the limit is reached in about ``seconds`` (between ``low_s`` and ``high_s``)."""

    ts: int  # the newest sample's time
    seconds: float
    low_s: float
    high_s: float
    rate: float  # bytes per second of unreclaimable growth (Theil-Sen)
    growing: str  # what grew most: "anon", "shmem", "kernel", or "unreclaimable" memory
    used: int
    reclaimable: int
    unreclaimable: int
    limit: Limit

    def to_json(self) -> dict[str, object]:
        return {
            "ts": self.ts,
            "seconds": round(self.seconds, 1),
            "low_s": round(self.low_s, 1),
            "high_s": round(self.high_s, 1),
            "rate_bytes_per_s": round(self.rate),
            "growing": self.growing,
            "used_bytes": self.used,
            "reclaimable_bytes": self.reclaimable,
            "unreclaimable_bytes": self.unreclaimable,
            "limit_bytes": self.limit.bytes,
            "limit_kind": self.limit.kind,
            "limit_path": self.limit.path,
        }


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    i = q * (len(sorted_values) - 1)
    lo = int(i)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (i - lo)


def _slopes(points: Sequence[Level]) -> list[float]:
    """Every pairwise slope (bytes per second), sorted."""
    out = []
    for i, a in enumerate(points):
        for b in points[i + 1 :]:
            dt = (b.ts - a.ts) / NS
            if dt > 0:
                out.append((b.unreclaimable - a.unreclaimable) / dt)
    out.sort()
    return out


def _thin(points: Sequence[Level], n: int) -> list[Level]:
    if len(points) <= n:
        return list(points)
    step = (len(points) - 1) / (n - 1)
    return [points[round(i * step)] for i in range(n)]


def _growing(first: Level, last: Level) -> str:
    deltas = {
        name: (getattr(last, name) or 0) - (getattr(first, name) or 0)
        for name in ("anon", "shmem", "kernel")
        if getattr(last, name) is not None
    }
    if not deltas:
        return "unreclaimable"
    name = max(deltas, key=lambda k: deltas[k])
    return name if deltas[name] > 0 else "unreclaimable"


# A fall of the unreclaimable memory by this much of the limit between two readings is a new
# run (the process died or was killed and its restart begins from its own floor): the readings
# before it say nothing about the new run's growth.
FALL_FRACTION = 0.25


def since_last_fall(levels: list[Level], limit: Limit) -> list[Level]:
    """``levels`` from the last fall of FALL_FRACTION of the limit on. Without this, a restart
    loop's readings at the limit before each kill stay in the window and pull the slope below
    zero: a leak restarted after an OOM kill was warned about 8.8 s before its next kill, its
    first run 22 s before (bench eta, eta_restarts_leak4_oom)."""
    fall = FALL_FRACTION * limit.bytes
    for i in range(len(levels) - 1, 0, -1):
        if levels[i - 1].unreclaimable - levels[i].unreclaimable >= fall:
            return levels[i:]
    return levels


def estimate(samples: Sequence[CgroupSample], limit: Limit, params: Params = DEFAULT) -> Eta | None:
    """The time to ``limit`` from ``samples`` (time order; those of the cgroup holding the
    limit), or None when the growth is not sustained or would not reach it within the horizon
    (module docstring)."""
    if not samples or limit.bytes <= 0:
        return None
    start = samples[-1].ts - int(params.window_s * NS)
    levels = since_last_fall(
        [lv for s in samples if s.ts >= start and (lv := level_of(s)) is not None], limit
    )
    if len(levels) < 4:
        return None
    points = _thin(levels, MAX_POINTS)
    first, last = points[0], points[-1]
    span = (last.ts - first.ts) / NS
    if span < params.min_span_s:
        return None
    steps = [b.unreclaimable - a.unreclaimable for a, b in pairwise(points)]
    moved = [d for d in steps if d != 0]
    if not moved or sum(1 for d in moved if d > 0) < params.min_up_fraction * len(moved):
        return None
    slopes = _slopes(points)
    p25, slope, p75 = (_quantile(slopes, q) for q in (0.25, 0.5, 0.75))
    min_growth = max(params.min_growth_bytes, params.min_growth_fraction * limit.bytes)
    if p25 <= 0 or p25 * span < min_growth:
        return None
    third = (last.ts - first.ts) // 3
    older = [p for p in points if p.ts <= first.ts + third]
    newer = [p for p in points if p.ts >= last.ts - third]
    if len(older) >= 2 and len(newer) >= 2:
        old_slope = _quantile(_slopes(older), 0.5)
        if old_slope > 0 and _quantile(_slopes(newer), 0.5) < params.min_recent_ratio * old_slope:
            return None
    # the fitted line's level now (median intercept), or the last reading where it is higher
    fitted = sorted(p.unreclaimable - slope * (p.ts - last.ts) / NS for p in points)
    level = max(_quantile(fitted, 0.5), last.unreclaimable)
    headroom = max(0.0, limit.bytes - level)
    seconds = headroom / slope
    if seconds > params.horizon_s:
        return None
    return Eta(
        ts=last.ts,
        seconds=seconds,
        low_s=headroom / p75,
        high_s=headroom / p25,
        rate=slope,
        growing=_growing(first, last),
        used=last.used,
        reclaimable=last.reclaimable,
        unreclaimable=last.unreclaimable,
        limit=limit,
    )


# ---------------------------------------------------------------------------------------------
# Live: one estimate per watched cgroup, kept current as samples arrive


class Forecasts:
    """The current ``Eta`` of each watched cgroup (one the recorder sent an ``EffectiveLimit``
    for), updated at each of its samples. ``samples_of(cgroup_id, start, end)`` gives the kept
    samples of a cgroup (the Analyzer's evidence store: nothing is kept twice)."""

    def __init__(self, samples_of: SamplesOf, params: Params = DEFAULT) -> None:
        self.samples_of = samples_of
        self.params = params
        self._limits: OrderedDict[int, EffectiveLimit] = OrderedDict()
        # path -> (its id, its newest memory.high), from the samples: the limit's holder is
        # named by path, and an ancestor may have no CgroupInfo
        self._sampled: dict[str, tuple[int, int | None]] = {}
        self._current: dict[int, Eta] = {}
        self._estimated: dict[int, int] = {}  # cgroup id -> when it was last estimated

    def current(self, cgroup_id: int) -> Eta | None:
        return self._current.get(cgroup_id)

    @property
    def warnings(self) -> dict[int, Eta]:
        """Every watched cgroup with a warning now: id -> estimate."""
        return dict(self._current)

    def limit(self, ev: EffectiveLimit) -> None:
        self._limits[ev.cgroup_id] = ev
        self._limits.move_to_end(ev.cgroup_id)
        if len(self._limits) > MAX_WATCHED:
            old, _ = self._limits.popitem(last=False)
            self._current.pop(old, None)
            self._estimated.pop(old, None)

    def forget(self, cgroup_ids: Sequence[int]) -> None:
        for cid in cgroup_ids:
            self._limits.pop(cid, None)
            self._current.pop(cid, None)
            self._estimated.pop(cid, None)

    def sample(self, ev: CgroupSample) -> Eta | None:
        """Take a sample (already in the store); returns the watched cgroup's new estimate
        when ``ev`` is a watched cgroup's own sample. (A round samples ancestors before their
        descendants, so the holder of the limit has been read by then.)"""
        self._sampled[ev.path] = (ev.cgroup_id, ev.high_bytes)
        if len(self._sampled) > MAX_WATCHED:
            del self._sampled[next(iter(self._sampled))]
        eff = self._limits.get(ev.cgroup_id)
        if eff is None:
            return None
        when = self._estimated.get(ev.cgroup_id)
        if when is not None and when <= ev.ts < when + EVERY_NS:
            return self._current.get(ev.cgroup_id)
        self._estimated[ev.cgroup_id] = ev.ts
        limit = self._effective(ev.path, eff)
        est = None
        holder = self._sampled.get(limit.path) if limit is not None else None
        if limit is not None and holder is not None:
            window = int(self.params.window_s * NS)
            samples = self.samples_of(holder[0], ev.ts - window, ev.ts)
            est = estimate(samples, limit, self.params)
        if est is None:
            self._current.pop(ev.cgroup_id, None)
        else:
            self._current[ev.cgroup_id] = est
        return est

    def _effective(self, path: str, eff: EffectiveLimit) -> Limit | None:
        """The recorder's effective limit, or a smaller memory.high on the way to the root."""
        best = Limit(eff.limit_bytes, eff.set_by or path) if eff.limit_bytes else None
        # the throttle point follows the effective limit's own rule, over memory.high
        high, where = effective_limit(
            (p, self._sampled.get(p, (0, None))[1]) for p in ancestors(path)
        )
        if high is not None and where is not None and (best is None or high < best.bytes):
            best = Limit(high, where, "high")
        return best
