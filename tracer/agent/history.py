"""`whyrestart history`'s text: the journal's entries as a table, then each verdict's summary
and advice. Pure; every workload-chosen value through safetext."""

from __future__ import annotations

from typing import Any

from tracer import safetext


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def history_table(entries: list[dict[str, Any]], restarts: bool = False) -> str:
    if restarts:
        rows: list[tuple[str, ...]] = [("time", "unit", "old pid", "new pid", "down", "cause")]
        for e in entries:
            r = e.get("restart") or {}
            rows.append(
                (
                    str(e.get("time", "?"))[:23],
                    safetext.cell(str(e.get("unit") or "-")),
                    str(r.get("old_pid", "?")),
                    str(r.get("new_pid", "?")),
                    f"{int(r.get('downtime_ns', 0)) / 1e9:.1f}s",
                    str(e.get("cause", "?")),
                )
            )
        return "\n".join(_table(rows)) + "\n"
    rows = [("time", "unit", "pid", "comm", "cause", "confidence", "incident")]
    for e in entries:
        rows.append(
            (
                str(e.get("time", "?"))[:23],
                safetext.cell(str(e.get("unit") or "-")),
                str(e.get("pid", "?")),
                safetext.cell(str(e.get("comm", "?"))),
                str(e.get("cause", "?")),
                str(e.get("confidence", "?")),
                str(e.get("incident") or "-"),
            )
        )
    out = _table(rows)
    for e in entries:
        v = e.get("verdict") or {}
        out.append("")
        out.append(
            f"pid {e.get('pid')} ({safetext.field(str(e.get('comm', '?')))}) at "
            f"{str(e.get('time', '?'))[:23]}: {e.get('cause')}, {e.get('confidence')} confidence"
        )
        out.append(f"  {safetext.field(str(v.get('summary', '')))}")
        if v.get("advice"):
            out.append(f"  advice: {safetext.field(str(v['advice']))}")
        if e.get("incident"):
            out.append(f"  evidence: whyrestart explain {e['incident']}")
    return "\n".join(out) + "\n"
