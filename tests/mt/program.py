"""What every multi-threaded twin asserts of a recording of tests/mt/mtwork.c (threads named
wrk1, wrk2, ...): one exit record per run of the program and one verdict for each, all naming
the program; no record and no verdict naming a worker thread."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tracer.analysis.findings import Verdict
from tracer.events import Event, Exit


def the_program(
    events: Iterable[Event], verdicts: Sequence[Verdict], runs: int = 1, comm: str = "mtwork"
) -> list[tuple[Verdict, Exit]]:
    """The (verdict, exit record) of each of the program's ``runs`` processes, in exit order."""
    exits = [e for e in events if isinstance(e, Exit)]
    assert not [e for e in exits if e.comm.startswith("wrk")], exits
    assert not [v for v in verdicts if v.comm.startswith("wrk")], verdicts
    mine = [e for e in exits if e.comm == comm]
    assert len(mine) == runs and len({e.pid for e in mine}) == runs, mine
    out = []
    for ex in mine:
        [v] = [v for v in verdicts if v.pid == ex.pid and v.ts == ex.ts]
        assert v.comm == comm
        out.append((v, ex))
    return out
