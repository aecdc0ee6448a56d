"""Which verdicts are kept for the end-of-run table, bounded so that a week of ``--all`` on a
busy host stays small: clean exits up to ``MAX_CLEAN_KEPT``, the rest up to ``MAX_KEPT``;
beyond, they are only counted in ``not_kept`` (every verdict is still handed out as it is
reached, to a live tail). Pure.
"""

from __future__ import annotations

from tracer.analysis.findings import APP_EXIT, Verdict

MAX_CLEAN_KEPT = 2000
MAX_KEPT = 5000


class Retention:
    def __init__(self) -> None:
        self.verdicts: list[Verdict] = []
        self.clean_kept = 0
        self.not_kept = 0  # verdicts judged (or counted unjudged) but not kept

    def keep(self, v: Verdict) -> None:
        clean = v.cause == APP_EXIT and v.exit_code == 0
        if (clean and self.clean_kept >= MAX_CLEAN_KEPT) or len(self.verdicts) >= MAX_KEPT:
            self.not_kept += 1
            return
        self.clean_kept += clean
        self.verdicts.append(v)

    def full_for_clean(self) -> bool:
        """A clean exit would not be kept now."""
        return self.clean_kept >= MAX_CLEAN_KEPT or len(self.verdicts) >= MAX_KEPT

    def full(self) -> bool:
        """No verdict would be kept now."""
        return len(self.verdicts) >= MAX_KEPT
