"""``whyrestart report``: a self-contained HTML page (and optionally a PNG) that shows a trace.

The page has one timeline per watched unit and one for the host (see `tracer.outputs.timeline`
for how units are grouped), then every verdict with its evidence. Each timeline stacks panels
on one time axis (seconds since the recording started):

* memory: usage of the unit's cgroups against every nested limit (its own and each limited
  ancestor's, dashed) and the effective limit (thick red);
* breakdown: anon, page cache and shmem of the cgroups where the memory is charged;
* pressure: PSI (some avg10), reclaim and throttling stall time per second from the kernel's
  summaries, and each long stall;
* GPU memory and allocation failures, and probe latency, when the trace has them;
* markers on every panel: OOM kills, signals, exits, restarts, GPU failures.

Charts are drawn by matplotlib (a figure object per chart, never pyplot's global state, so no
display or GUI backend is involved) and inlined as SVG with text kept as text: the page opens
offline, can be searched, and has no script. The PNG (``--png``) stacks the same charts into
one image for pasting into a ticket. matplotlib is an optional dependency (the ``report``
extra): a recording host does not need a plotting stack, and `render_html` says how to install
it when it is missing.
"""

from __future__ import annotations

import html
import io
import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tracer import __version__, safetext
from tracer.analysis.analyzer import Verdict
from tracer.analysis.quantities import fmt_bytes, fmt_duration, fmt_offset
from tracer.analysis.wording import lost_records, memory_at_kill
from tracer.errors import OutputError, WhyrestartError
from tracer.outputs.charts import Chart, short_path, wall
from tracer.outputs.timeline import Timeline, UnitTimeline

if TYPE_CHECKING:
    from matplotlib.figure import Figure, FigureBase


MAX_UNIT_CHARTS = 24  # per report; more units are listed by name
WIDTH_IN = 12.0


class ReportUnavailable(WhyrestartError):
    """The plotting library is not installed."""

    exit_code = 1


def _matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportUnavailable(
            "the report needs matplotlib, which is not installed",
            "pip install 'whyrestart[report]' (or: pip install matplotlib); "
            "`whyrestart export --format perfetto` needs nothing extra",
        ) from None


# ---------------------------------------------------------------------------------------------
# Small helpers


def _rel(t: Timeline, ts: int) -> str:
    return fmt_offset(t.rel_s(ts))


# ---------------------------------------------------------------------------------------------
# Figures


def charted_units(t: Timeline) -> list[UnitTimeline]:
    """The units that get a chart, in timeline order: all of them up to `MAX_UNIT_CHARTS`, else
    the most telling (killed ones, then those with memory samples, then the busiest). A
    recording of the whole host can hold thousands of short-lived units; the others are
    listed by name, their verdicts are all in the tables."""
    if len(t.units) <= MAX_UNIT_CHARTS:
        return list(t.units)

    def weight(u: UnitTimeline) -> tuple[bool, bool, int]:
        killed = any(v.cause != "app_exit" for v in u.verdicts)
        return (killed, any(c.sampled for c in u.cgroups), len(u.markers))

    keep = {id(u) for u in sorted(t.units, key=weight, reverse=True)[:MAX_UNIT_CHARTS]}
    return [u for u in t.units if id(u) in keep]


def _figures(t: Timeline) -> list[tuple[str, float, Callable[[FigureBase], None]]]:
    """(title, height in inches, draw function) per chart: each charted unit, then the host."""
    chart = Chart(t)
    out: list[tuple[str, float, Callable[[FigureBase], None]]] = []
    for u in charted_units(t):
        out.append((u.label, chart.height(chart.unit_panels(u)), _bind(chart.draw_unit, u)))
    out.append(("host", chart.height(chart.host_panels(t.host)), _bind(chart.draw_host, t.host)))
    return out


def _bind(fn: Callable[[FigureBase, Any], None], arg: Any) -> Callable[[FigureBase], None]:
    def draw(fig: FigureBase) -> None:
        fn(fig, arg)

    return draw


def _untrusted_text(fig: FigureBase) -> None:
    """Every label of a chart as the terminal shows it: names and paths come from the workload,
    so control characters are escaped (the SVG is inlined in the page) and ``$`` is text, not
    the start of mathtext (a process named ``$\\foo$`` would stop the report)."""
    from matplotlib.text import Text

    for t in fig.findobj(Text):
        t.set_text(safetext.field(t.get_text()))
        t.set_parse_math(False)


def _svg(fig: Figure, salt: str) -> str:
    from matplotlib import rc_context

    _untrusted_text(fig)
    buf = io.StringIO()
    # Text stays <text> (searchable, selectable, small); a fixed salt per chart keeps the
    # ids matplotlib generates deterministic and distinct between the charts of one page.
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    start = text.find("<svg")
    return text[start:] if start >= 0 else text


def render_png(t: Timeline, path: str, dpi: int = 100) -> None:
    """All charts stacked in one PNG."""
    _matplotlib()
    from matplotlib.figure import Figure

    figs = _figures(t)
    heights = [h for _, h, _ in figs]
    fig = Figure(figsize=(WIDTH_IN, sum(heights)))
    subs = fig.subfigures(len(figs), 1, height_ratios=heights, squeeze=False)
    for (_, _, draw), sub in zip(figs, subs[:, 0], strict=True):
        draw(sub)
    _untrusted_text(fig)
    try:
        fig.savefig(path, format="png", dpi=dpi, metadata={"Software": f"whyrestart {__version__}"})
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


# ---------------------------------------------------------------------------------------------
# HTML

_CSS = """
body { font-family: 'DejaVu Sans', Helvetica, Arial, sans-serif; margin: 1.5em 2em;
       color: #222; max-width: 1250px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.0em; margin: 1.2em 0 0.3em; }
.meta { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.cause { font-weight: bold; }
.cause-cgroup_oom, .cause-global_oom, .cause-gpu_oom, .cause-probe_kill,
.cause-userspace_oom, .cause-device_reset { color: #b00; }
.cause-signal_kill { color: #c60; }
.cause-unknown { color: #777; }
figure { margin: 0.5em 0; }
figure svg { max-width: 100%; height: auto; }
.advice { background: #fff8e0; padding: 4px 8px; border-left: 3px solid #e0b000; }
.disagree { color: #b00; }
.warn { color: #a60; }
ol.evidence { font-size: 0.85em; margin: 0.3em 0; }
code, .path { font-family: 'DejaVu Sans Mono', monospace; font-size: 0.9em; word-break: break-all; }
"""


def _e(text: object) -> str:
    # control characters shown as in the terminal (an HTML page can be `cat`ed or copied)
    return html.escape(safetext.field(str(text)), quote=True)


def _limit_peak(v: Verdict) -> str:
    if v.limit_bytes is None and v.peak_bytes is None:
        return "-"
    return f"{fmt_bytes(v.peak_bytes)} / {fmt_bytes(v.limit_bytes)}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unit"


def _verdict_rows(t: Timeline, verdicts: Sequence[Verdict]) -> str:
    rows = []
    for v in verdicts:
        rows.append(
            "<tr>"
            f"<td>{_e(_rel(t, v.ts))}</td><td>{_e(v.unit or '-')}"
            f"{'' if v.main else ' (child)'}</td><td class=num>{v.pid}</td><td>{_e(v.comm)}</td>"
            f"<td class='cause cause-{_e(v.cause)}'>{_e(v.cause)}</td><td>{_e(v.confidence)}</td>"
            f"<td class=num>{_e(_limit_peak(v))}</td><td>{_e(v.summary)}</td>"
            "</tr>"
        )
    return (
        "<table class=verdicts><tr><th>time</th><th>unit</th><th>pid</th><th>comm</th>"
        "<th>cause</th><th>confidence</th><th>peak / limit</th><th>summary</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _verdict_detail(t: Timeline, v: Verdict) -> str:
    out = [
        f"<h3 id='pid-{v.pid}-{v.ts}'>pid {v.pid} ({_e(v.comm)}): "
        f"<span class='cause cause-{_e(v.cause)}'>{_e(v.cause)}</span>, "
        f"{_e(v.confidence)} confidence</h3>",
        f"<p>{_e(v.summary)}</p>",
    ]
    facts = []
    if v.limit_cgroup:
        facts.append(
            f"limit {fmt_bytes(v.limit_bytes)} set on <span class=path>{_e(v.limit_cgroup)}</span>"
            + (f" ({_e(v.limit_scope)})" if v.limit_scope else "")
        )
    if v.peak_bytes is not None:
        when = f" at {_rel(t, v.peak_ts)}" if v.peak_ts is not None else ""
        facts.append(f"peak usage {fmt_bytes(v.peak_bytes)}{when}")
    if v.breakdown:
        facts.append(_e(memory_at_kill(v.breakdown, fmt_bytes)))
    if v.stall_ns:
        facts.append(f"{fmt_duration(v.stall_ns)} of reclaim stalls in the minute before")
    if v.host_available is not None:
        facts.append(f"the host had {fmt_bytes(v.host_available)} available")
    if v.sender_pid is not None:
        facts.append(
            f"sent by pid {v.sender_pid} ({_e(v.sender_comm)}"
            + (f", {_e(v.sender_role)}" if v.sender_role else "")
            + ")"
        )
    if facts:
        out.append("<p class=meta>" + "; ".join(facts) + "</p>")
    out.append("<ol class=evidence>")
    for ts, what in v.evidence:
        out.append(f"<li><code>{_e(_rel(t, ts))}</code> {_e(what)}</li>")
    out.append("</ol>")
    for d in v.disagreements:
        out.append(f"<p class=disagree>disagrees: {_e(d)}</p>")
    if v.advice:
        out.append(f"<p class=advice>advice: {_e(v.advice)}</p>")
    return "\n".join(out)


def _limits_table(u: UnitTimeline) -> str:
    if not u.limits and not u.effective:
        return (
            "<p class=meta>No memory limit was seen on this unit's cgroups or their ancestors.</p>"
        )
    rows = []
    for ln in u.limits:
        where = "own cgroup" if ln.own else "ancestor"
        rows.append(
            f"<tr><td>{ln.what}</td>"
            f"<td class=path>{_e(ln.path)}</td><td>{where}</td>"
            f"<td>{_e(ln.label())}</td></tr>"
        )
    for eff in u.effective:
        rows.append(
            f"<tr><td><b>effective</b></td><td class=path>{_e(eff.path)}</td><td>strictest</td>"
            f"<td><b>{_e(eff.label())}</b></td></tr>"
        )
    return (
        "<table class=limits><tr><th>kind</th><th>cgroup</th><th>where</th><th>value</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _warned(t: Timeline, u: UnitTimeline) -> str:
    """What tail warned about the unit's cgroups while it was recorded (``replay --tail``
    shows the same lines): time-to-limit estimates, page-cache thrash, and their ends."""
    lines = sorted((ln for c in u.cgroups for ln in c.warnings), key=lambda ln: ln.ts)
    if not lines:
        return ""
    items = "".join(
        f"<li><code>{_e(_rel(t, ln.ts))}</code> {_e(ln.text)}</li>" for ln in lines[:50]
    )
    more = f"<p class=meta>... {len(lines) - 50} more</p>" if len(lines) > 50 else ""
    return f"<p class=meta>What <code>tail</code> warned:</p><ul class=warned>{items}</ul>{more}"


def _peaks(u: UnitTimeline) -> str:
    parts = []
    for c in u.cgroups:
        peak = c.peak_usage()
        if peak is not None:
            parts.append(f"<span class=path>{_e(c.path)}</span> peaked at {fmt_bytes(peak)}")
    return f"<p class=meta>{'; '.join(parts)}</p>" if parts else ""


def render_html(t: Timeline, source: str) -> str:
    """The whole page as a string, in reading order (long: one short block per section)."""
    _matplotlib()
    from matplotlib.figure import Figure

    h = t.header
    duration = t.rel_s(t.end_ns)
    hooks = ", ".join(f"{k}: {v or 'not attached'}" for k, v in sorted(h.hooks.items()))
    cgroup_mode = h.cgroup.get("mode", "?")
    memory_version = h.cgroup.get("memory_version")
    parts = [
        "<!doctype html>",
        "<html lang=en><head><meta charset=utf-8>",
        "<meta name=viewport content='width=device-width, initial-scale=1'>",
        f"<title>whyrestart report: {_e(os.path.basename(source))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>whyrestart report</h1>",
        f"<p class=meta>trace <code>{_e(source)}</code> · host {_e(h.host)} · kernel "
        f"{_e(h.kernel)} · cgroup {_e(cgroup_mode)} (memory controller on "
        f"v{_e(memory_version or '?')}) · started {_e(wall(t, t.start_ns))} · "
        f"{duration:.1f} s · {sum(t.counts.values())} events · {len(t.verdicts)} verdicts</p>",
        f"<p class=meta>hooks: {_e(hooks)}</p>",
    ]
    warnings = list(t.warnings)
    if t.footer is not None:
        warnings += list(t.footer.warnings)
        if t.footer.lost:
            warnings.append(lost_records(t.footer.lost))
    else:
        warnings.append("the recording did not finish (no footer): the end of the trace is cut")
    for w in warnings:
        parts.append(f"<p class=warn>warning: {_e(w)}</p>")

    parts.append("<h2 id=verdicts-summary>Verdicts</h2>")
    parts.append(
        _verdict_rows(t, t.verdicts)
        if t.verdicts
        else "<p>No process of the watched set exited: no verdicts.</p>"
    )

    figs = _figures(t)
    units: list[UnitTimeline | None] = [*charted_units(t), None]
    charted = {id(u) for u in units}
    skipped = [u.label for u in t.units if id(u) not in charted]
    if skipped:
        parts.append(
            f"<p class=meta>{len(skipped)} more units are not charted (their verdicts are in "
            f"the tables): {_e(', '.join(skipped))}</p>"
        )
    for i, ((title, height, draw), u) in enumerate(zip(figs, units, strict=True)):
        fig = Figure(figsize=(WIDTH_IN, height))
        draw(fig)
        svg = _svg(fig, f"whyrestart-{i}")
        if u is None:
            parts.append(f"<h2 id=host>Host {_e(t.header.host)}</h2>")
            parts.append(
                "<p class=meta>What the host dashboard sees: the whole machine's memory and "
                "pressure. A unit is killed by the strictest limit above it, not by this.</p>"
            )
        else:
            parts.append(f"<h2 id='unit-{_e(_slug(title))}'>Unit {_e(title)}</h2>")
            parts.append(_limits_table(u))
            parts.append(_peaks(u))
            parts.append(_warned(t, u))
        parts.append(f"<figure>{svg}</figure>")
        if u is not None and u.verdicts and len(t.units) > 1:
            parts.append(_verdict_rows(t, u.verdicts))

    parts.append("<h2 id=evidence>Verdicts and their evidence</h2>")
    if not t.verdicts:
        parts.append("<p>No verdicts.</p>")
    for v in t.verdicts:
        parts.append(_verdict_detail(t, v))
    if t.restarts:
        parts.append("<h2 id=restarts>Restarts</h2><table><tr><th>time</th><th>unit</th>")
        parts.append("<th>old pid</th><th>new pid</th><th>down</th><th>cause</th></tr>")
        for r in t.restarts:
            parts.append(
                f"<tr><td>{_e(_rel(t, r.ts))}</td><td>{_e(r.unit)}</td>"
                f"<td class=num>{r.old_pid}</td><td class=num>{r.new_pid}</td>"
                f"<td class=num>{r.downtime_ns / 1e9:.1f} s</td><td>{_e(r.cause)}</td></tr>"
            )
        parts.append("</table>")
    for unit, ours, theirs, src in t.restart_counts:
        if theirs is not None:
            agree = "agrees" if theirs == ours else "DISAGREES"
            parts.append(
                f"<p class=meta>{_e(unit)}: {_e(src)} counted {theirs} restarts, whyrestart "
                f"linked {ours} ({agree})</p>"
            )
    parts.append(
        f"<p class=meta>generated by whyrestart {_e(__version__)} from {_e(source)}; "
        "times are seconds since the recording started.</p></body></html>"
    )
    return "\n".join(parts) + "\n"


def write_report(
    t: Timeline, source: str, html_path: str | None, png_path: str | None = None
) -> None:
    """Write the HTML page and/or the PNG; `OutputError` when a file cannot be written."""
    _matplotlib()
    for p in (html_path, png_path):
        if p is not None:
            d = os.path.dirname(os.path.abspath(p))
            if not os.path.isdir(d):
                raise OutputError(
                    f"cannot write {p}: directory {d} does not exist", "create it first"
                )
    if html_path is not None:
        page = render_html(t, source)
        try:
            with open(html_path, "w", encoding="utf-8") as f:
                f.write(page)
        except OSError as exc:
            raise OutputError(f"cannot write {html_path}: {exc.strerror or exc}") from None
    if png_path is not None:
        render_png(t, png_path)


__all__ = ["ReportUnavailable", "render_html", "render_png", "short_path", "write_report"]
