"""Memory that rose in steps and never came back down (issue 29: the prompt-cache waves): what
a cache that requests fill looks like before the kill, told apart from a load ramp (one rise),
a leak (one long rise, which ``eta`` projects) and a server whose requests come and go.

A pure function over (time, bytes) points; the rules read the points from the limiting
cgroup's memory.stat samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MiB = 1 << 20
SECOND = 1_000_000_000

# A step: the per-second maximum rising by at least this, over consecutive rising seconds.
STEP_BYTES = 16 * MiB
# A second counts as rising when its maximum is this much above the last one's.
RISING_BYTES = 2 * MiB
# Between steps: at least this long with no rise (a wave of requests, then a pause).
PLATEAU_NS = 2 * SECOND
# "Never came back down": no second below the highest level so far by more than this.
GIVEN_BACK_BYTES = 8 * MiB
# Steps it takes: one is a load, two could be a load and one burst.
MIN_STEPS = 3


@dataclass(frozen=True, slots=True)
class Steps:
    levels: tuple[int, ...]  # the level before the first step, then after each step
    start_ns: int  # the first point's time
    end_ns: int  # the last point's time

    @property
    def steps(self) -> int:
        return len(self.levels) - 1


def _per_second(points: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The largest value in each second (the sampler reads every 50 ms near a limit, every
    second elsewhere), in time order."""
    out: list[tuple[int, int]] = []
    for ts, v in points:
        sec = ts // SECOND
        if out and out[-1][0] == sec:
            if v > out[-1][1]:
                out[-1] = (sec, v)
        else:
            out.append((sec, v))
    return out


def stepwise(points: Sequence[tuple[int, int]]) -> Steps | None:
    """The steps ``points`` rose in, when there were at least MIN_STEPS of STEP_BYTES or more,
    each after a pause of PLATEAU_NS, and the value never gave back more than GIVEN_BACK_BYTES
    of its highest level; None otherwise."""
    secs = _per_second(points)
    if len(secs) < 2:
        return None
    # runs of rising and of flat seconds: [rising, value before, value after, first s, last s]
    runs: list[list[int]] = []
    top = prev = secs[0][1]
    for sec, v in secs[1:]:
        if v < top - GIVEN_BACK_BYTES:
            return None
        top = max(top, v)
        rising = int(v - prev >= RISING_BYTES)
        if runs and runs[-1][0] == rising:
            runs[-1][2], runs[-1][4] = v, sec
        else:
            runs.append([rising, prev, v, sec, sec])
        prev = v
    # a rise less than PLATEAU_NS after the last one continues its step. The pause is the time
    # from the last rising second to the next rising one (each rise happened within the second
    # before its reading: give or take a second); counting the flat seconds between made it a
    # second short, and waves 2.4 s apart, read once a second, looked like one long rise
    steps: list[list[int]] = []  # [value before, value after]
    last_rise: int | None = None
    for rising, before, after, first, last in runs:
        if not rising:
            continue
        if last_rise is not None and (first - last_rise) * SECOND < PLATEAU_NS:
            steps[-1][1] = after
        else:
            steps.append([before, after])
        last_rise = last
    levels = [secs[0][1]] + [after for before, after in steps if after - before >= STEP_BYTES]
    if len(levels) - 1 < MIN_STEPS:
        return None
    return Steps(tuple(levels), points[0][0], points[-1][0])
