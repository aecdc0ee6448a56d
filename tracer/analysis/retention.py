"""Which verdicts are kept for the end-of-run table, bounded so that a week of ``--all`` on a
busy host stays small, and so that what matters is never the one dropped. Pure.

Routine verdicts (``app_exit``: a process that ended on its own, crashes included) give way
first: clean exits are kept up to ``MAX_CLEAN_KEPT``; all verdicts up to ``MAX_KEPT``, where a
kill (an OOM kill, a GPU OOM, a probe kill, a signal, a device reset, an unknown) that arrives
when the list is full evicts the oldest routine verdict. Only when every kept verdict is a kill
is a new one dropped, and counted (``kills_not_kept``). Everything dropped is counted in
``not_kept``; every verdict is still handed out as it is reached, to a live tail.
"""

from __future__ import annotations

from tracer.analysis.findings import APP_EXIT, Verdict

MAX_CLEAN_KEPT = 2000
MAX_KEPT = 5000


class Retention:
    def __init__(self, max_kept: int = MAX_KEPT, max_clean_kept: int = MAX_CLEAN_KEPT) -> None:
        """``max_kept=0``: nothing is kept, all is counted (the always-on agent, whose sinks
        take every verdict as it comes: the 5,000 kept from a storm's first second also
        pinned the heap they were made in, 4 MB of RSS after a 12k exits/s storm)."""
        self.max_kept = max_kept
        self.max_clean_kept = min(max_clean_kept, max_kept)
        self.verdicts: list[Verdict] = []
        self.clean_kept = 0
        self.routine_kept = 0
        self.not_kept = 0  # verdicts judged (or counted unjudged) but not kept
        self.kills_not_kept = 0  # of those, the ones that were not routine
        self._scan = 0  # no routine verdict is kept before this index

    def keep(self, v: Verdict) -> None:
        routine = v.cause == APP_EXIT
        clean = routine and v.exit_code == 0
        if clean and self.clean_kept >= self.max_clean_kept:
            self.not_kept += 1
            return
        if len(self.verdicts) >= self.max_kept:
            if routine or not self.routine_kept:
                self.not_kept += 1
                self.kills_not_kept += not routine
                return
            self._evict_routine()
        self.clean_kept += clean
        self.routine_kept += routine
        self.verdicts.append(v)

    def _evict_routine(self) -> None:
        """Drop the oldest routine verdict (the list stays in the order verdicts came)."""
        verdicts = self.verdicts
        i = self._scan
        while verdicts[i].cause != APP_EXIT:
            i += 1
        old = verdicts.pop(i)
        self._scan = i
        self.routine_kept -= 1
        self.clean_kept -= old.exit_code == 0
        self.not_kept += 1

    def drops_routine(self, clean: bool) -> bool:
        """A routine verdict (a clean one with ``clean``) would not be kept now."""
        return (clean and self.clean_kept >= self.max_clean_kept) or len(
            self.verdicts
        ) >= self.max_kept

    def full_of_kills(self) -> bool:
        """No verdict would be kept now: the list is full and none of it gives way."""
        return len(self.verdicts) >= self.max_kept and not self.routine_kept
