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
import textwrap
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tracer import __version__, safetext
from tracer.analysis.analyzer import Verdict
from tracer.analysis.quantities import STALL_KINDS, fmt_bytes, fmt_duration, fmt_offset
from tracer.analysis.wording import lost_records, memory_at_kill
from tracer.clock import wall_time
from tracer.errors import OutputError, WhyrestartError
from tracer.outputs.timeline import (
    GPU_DOWN,
    GPU_FAIL,
    LOST,
    OOM,
    RESTART,
    SIGNAL,
    HostTimeline,
    Marker,
    Timeline,
    UnitTimeline,
    thin,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure, FigureBase

    from tracer.events import GpuAllocFailure, GpuOomRecovered

MAX_POINTS = 4000  # per series in a chart: enough for a smooth curve, small SVG
MAX_LABELLED_MARKERS = 14  # per chart; more markers are drawn, unlabelled
MAX_UNIT_CHARTS = 24  # per report; more units are listed by name
WIDTH_IN = 12.0

MARKER_STYLE: dict[str, tuple[str, str]] = {  # kind -> (colour, line style)
    OOM: ("#d62728", "-"),
    SIGNAL: ("#ff7f0e", "--"),
    "exit": ("#555555", ":"),
    RESTART: ("#1f77b4", "-"),
    GPU_FAIL: ("#9467bd", "--"),
    GPU_DOWN: ("#8c564b", "-"),
    LOST: ("#000000", ":"),
}
MARKER_NAMES = {
    OOM: "OOM kill",
    SIGNAL: "signal",
    "exit": "exit",
    RESTART: "restart",
    GPU_FAIL: "GPU allocation failure",
    GPU_DOWN: "GPU Xid / lost",
    LOST: "lost events",
}
LIMIT_COLOURS = ("#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
USAGE_COLOURS = ("#1f77b4", "#ff7f0e", "#7f7f7f", "#17becf")
EFFECTIVE_COLOUR = "#d62728"


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


_HEX_RUN = re.compile(r"[0-9a-f]{12,}")


def short_path(path: str) -> str:
    """Cgroup paths get long (container ids, hashes): shorten ids for charts.

    ``/process_api/8cc8fa5152fae0761ec959a6a71a95d3/app`` → ``/process_api/8cc8fa51…/app``.
    Tables show the full path.
    """
    parts = []
    for part in path.split("/"):
        part = _HEX_RUN.sub(lambda m: m.group(0)[:8] + "…", part)
        parts.append(part if len(part) <= 32 else part[:30] + "…")
    return "/".join(parts) or "/"


def _scale(max_bytes: float) -> tuple[float, str]:
    if max_bytes >= 8 * 1024**3:
        return 1024.0**3, "GiB"
    if max_bytes >= 8 * 1024**2 or max_bytes == 0:
        return 1024.0**2, "MiB"
    return 1024.0, "KiB"


def _nan(v: float | None, div: float = 1.0) -> float:
    return float("nan") if v is None else v / div


def _wall(t: Timeline, ts: int) -> str:
    off = t.header.clock_offset_ns
    if off is None:
        return fmt_offset(t.rel_s(ts))
    return wall_time(ts, off).strftime("%Y-%m-%d %H:%M:%S UTC")


def _rel(t: Timeline, ts: int) -> str:
    return fmt_offset(t.rel_s(ts))


# ---------------------------------------------------------------------------------------------
# Charts


class _Chart:
    """Draws timelines onto a matplotlib figure (or subfigure) with a shared time axis.

    Large on purpose: one method per panel of the report, all sharing the time axis and the
    marks of the exits and verdicts kept here; a new panel is a new method."""

    def __init__(self, t: Timeline) -> None:
        self.t = t
        span = t.rel_s(t.end_ns)
        self.x_max = max(span, 0.001)
        self._twins: dict[int, Axes] = {}

    def _twin(self, ax: Axes) -> Axes:
        """A second y axis on the same panel, remembered so its lines join the legend."""
        twin = ax.twinx()
        self._twins[id(ax)] = twin
        return twin

    def x(self, ts: int) -> float:
        return self.t.rel_s(ts)

    # -- layout ------------------------------------------------------------------------------

    def unit_panels(self, u: UnitTimeline) -> list[str]:
        panels = ["memory"]
        if any(any(v is not None for v in c.anon) for c in u.leaves):
            panels.append("breakdown")
        panels.append("pressure")
        if u.gpu_procs or u.gpu_failures or u.gpu_recovered:
            panels.append("gpu")
        if u.probes:
            panels.append("probes")
        return panels

    def host_panels(self, h: HostTimeline) -> list[str]:
        panels = ["host_memory", "host_pressure"]
        if h.gpus:
            panels.append("host_gpu")
        if h.probes:
            panels.append("host_probes")
        return panels

    @staticmethod
    def height(panels: Sequence[str]) -> float:
        tall = {"memory": 3.2, "host_memory": 2.6}
        return 1.0 + sum(tall.get(p, 1.9) for p in panels)

    def _axes(self, fig: FigureBase, panels: Sequence[str]) -> list[Axes]:
        ratios = [1.6 if p in ("memory", "host_memory") else 1.0 for p in panels]
        axes = fig.subplots(
            len(panels), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": ratios}
        )
        out: list[Axes] = [row[0] for row in axes]
        for ax in out:
            ax.grid(True, alpha=0.3)
            ax.set_xlim(0, self.x_max)
        out[-1].set_xlabel(
            f"seconds since the recording started ({_wall(self.t, self.t.start_ns)})"
        )
        fig.subplots_adjust(left=0.07, right=0.68, top=0.9, bottom=0.08, hspace=0.25)
        return out

    def _draw_panels(
        self,
        axes: list[Axes],
        panels: Sequence[str],
        of: UnitTimeline | HostTimeline,
        markers: Sequence[Marker],
        labelled: str,
    ) -> None:
        """Each panel by its ``_p_<name>`` method, then the markers (their labels on the
        ``labelled`` panel only) and the legends."""
        for name, ax in zip(panels, axes, strict=True):
            draw: Callable[[Axes, UnitTimeline | HostTimeline], None] = getattr(self, f"_p_{name}")
            draw(ax, of)
            self._markers(ax, markers, labels=name == labelled)
            self._legend(ax)
        self._marker_legend(axes[0], markers)

    # -- units -------------------------------------------------------------------------------

    def draw_unit(self, fig: FigureBase, u: UnitTimeline) -> None:
        panels = self.unit_panels(u)
        axes = self._axes(fig, panels)
        title = f"{u.label}"
        kills = [v for v in u.verdicts if v.cause != "app_exit"] or u.verdicts[-1:]
        if kills:
            v = kills[0]
            title += f" — pid {v.pid} ({v.comm}): {v.cause}"
        fig.suptitle(title, fontsize=12, x=0.07, ha="left")
        self._draw_panels(axes, panels, u, u.markers, "memory")

    def _p_memory(self, ax: Axes, u: UnitTimeline) -> None:
        # The y axis is sized for the limits and the cgroups under them: a unit's process that
        # sits in a big unlimited cgroup (a session, a slice) would otherwise flatten the curve
        # that meets the limit. What goes off the chart is said on the chart.
        limited = {eff.path for eff in u.effective} | {a.path for a in u.ancestors}
        focus: list[float] = [float(v) for ln in u.limits for v in ln.values()]
        for c in (*u.cgroups, *u.ancestors):
            if c.path in limited or not u.limits:
                focus += [float(v) for v in c.usage if v is not None]
        top = max(focus, default=0.0)
        div, unit = _scale(top)
        ax.set_ylabel(f"memory ({unit})")
        for i, c in enumerate(u.cgroups):
            if c.sampled:
                self._line(
                    ax, c.ts, c.usage, div, f"usage {short_path(c.path)}", USAGE_COLOURS[i % 4]
                )
        colour_of: dict[str, str] = {}
        for ln in u.limits:
            colour = colour_of.setdefault(ln.path, LIMIT_COLOURS[len(colour_of) % 6])
            label = ln.label().replace(ln.path, short_path(ln.path))
            xs = [self.x(ts) for ts, _ in ln.points]
            ys = [_nan(v, div) for _, v in ln.points]
            style = "--" if ln.kind == "max" else "-."
            ax.step(xs, ys, where="post", color=colour, linestyle=style, linewidth=1.6, label=label)
        for a in u.ancestors:
            if a.sampled:
                colour = colour_of.get(a.path, "#999999")
                label = f"usage {short_path(a.path)} (ancestor)"
                self._line(ax, a.ts, a.usage, div, label, colour, style=":")
        for eff in u.effective:
            xs = [self.x(ts) for ts, _, _ in eff.points]
            ys = [_nan(v, div) for _, v, _ in eff.points]
            label = eff.label()
            for _, _, by in eff.points:
                if by:
                    label = label.replace(by, short_path(by))
            ax.step(
                xs, ys, where="post", color=EFFECTIVE_COLOUR, linewidth=5, alpha=0.3, label=label
            )
        if not any(c.sampled for c in u.cgroups):
            self._note(ax, "no memory samples of this unit's cgroups in this trace")
        if top > 0:
            ax.set_ylim(0, top * 1.25 / div)
            off = [
                f"usage of {short_path(c.path)} (no limit) peaks at {fmt_bytes(c.peak_usage())}"
                for c in u.cgroups
                if c.path not in limited and (c.peak_usage() or 0) > top * 1.25
            ]
            if off:
                ax.text(
                    0.01,
                    0.97,
                    "off the chart: " + "; ".join(off),
                    transform=ax.transAxes,
                    va="top",
                    fontsize=7,
                    color="#555555",
                )
        else:
            ax.set_ylim(bottom=0)

    @staticmethod
    def _note(ax: Axes, text: str) -> None:
        ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", color="#777777")

    def _p_breakdown(self, ax: Axes, u: UnitTimeline) -> None:
        leaves = [c for c in u.leaves if any(v is not None for v in c.anon)]
        top = max((max((v or 0) for v in c.usage) for c in leaves if c.usage), default=0)
        div, unit = _scale(float(top))
        ax.set_ylabel(f"breakdown ({unit})")
        for i, c in enumerate(leaves):
            xs = [self.x(ts) for ts in c.ts]
            anon = [(v or 0) / div for v in c.anon]
            shmem = [(v or 0) / div for v in c.shmem]
            cache = [max(0.0, (f or 0) / div - s) for f, s in zip(c.file, shmem, strict=True)]
            labels = (
                [
                    "anon",
                    "page cache (file - shmem)",
                    "shmem (tmpfs, memfd, shared anon)",
                ]
                if i == 0
                else ["_anon", "_cache", "_shmem"]
            )
            ax.stackplot(
                xs,
                anon,
                cache,
                shmem,
                labels=labels,
                colors=("#aec7e8", "#ffbb78", "#98df8a"),
                alpha=0.85,
            )
        if len(leaves) > 1:
            ax.text(
                0.01,
                0.9,
                f"{len(leaves)} cgroups: " + ", ".join(short_path(c.path) for c in leaves),
                transform=ax.transAxes,
                fontsize=7,
            )
        ax.set_ylim(bottom=0)

    def _p_pressure(self, ax: Axes, u: UnitTimeline) -> None:
        psi = [c for c in u.cgroups if any(v is not None for v in c.psi_some)]
        for i, c in enumerate(psi):
            label = f"PSI some avg10 {short_path(c.path)}"
            self._line(ax, c.ts, c.psi_some, 1.0, label, USAGE_COLOURS[i % 4])
        if psi:
            ax.set_ylabel("PSI some avg10 (%)")
            ax.set_ylim(bottom=0)
        # v1 cgroups have no PSI of their own: the stalls then take the primary axis.
        stalls = self._stalls(self._twin(ax) if psi else ax, u.summaries, u.stalls)
        if not psi and not stalls:
            ax.set_ylabel("pressure")
            self._note(ax, "no PSI, reclaim stalls or memory.high throttling recorded")

    def _stalls(self, ax: Axes, summaries: Sequence[Any], stalls: Sequence[Any]) -> bool:
        """Stall time per second (kernel summaries, bars) and each long stall (segments), in
        milliseconds."""
        sums = [s for s in summaries if s.kind in STALL_KINDS and s.interval_ns > 0]
        if not sums and not stalls:
            return False
        ax.set_ylabel("stall (ms)")
        first = True
        for s in sums:
            lo, hi = self.t.stall_span(s)
            if hi <= lo:
                continue
            ax.bar(
                self.x(lo),
                s.total_ns / (hi - lo) * 1000,
                width=(hi - lo) / 1e9,
                align="edge",
                color="#ff9896",
                alpha=0.5,
                label="stall time in reclaim/throttling (ms per s)" if first else "_",
            )
            first = False
        kinds = sorted({st.kind for st in stalls})
        first = True
        for st in stalls:
            ax.plot(
                [self.x(st.ts - st.duration_ns), self.x(st.ts)],
                [st.duration_ns / 1e6] * 2,
                color="#d62728",
                linewidth=2.5,
                marker="|",
                label=f"each long stall (ms): {', '.join(kinds)}" if first else "_",
            )
            first = False
        ax.set_ylim(bottom=0)
        return True

    def _p_gpu(self, ax: Axes, u: UnitTimeline) -> None:
        values = [g.used_bytes for g in u.gpu_procs if g.used_bytes is not None]
        values += [f.held_bytes + f.requested_bytes for f in u.gpu_failures]
        div, unit = _scale(float(max(values, default=0)))
        ax.set_ylabel(f"GPU memory ({unit})")
        by_key: dict[tuple[int, int], list[Any]] = {}
        for g in u.gpu_procs:
            by_key.setdefault((g.pid, g.index), []).append(g)
        for (pid, index), samples in sorted(by_key.items()):
            self._line(
                ax,
                [g.ts for g in samples],
                [g.used_bytes for g in samples],
                div,
                f"pid {pid} on GPU {index} (NVML)",
                None,
            )
        allocations: list[tuple[Sequence[GpuAllocFailure | GpuOomRecovered], dict[str, str], str]]
        allocations = [
            (
                u.gpu_failures,
                {"marker": "x", "color": "#d62728"},
                "allocation failed (held + requested)",
            ),
            (
                u.gpu_recovered,
                {"marker": "o", "facecolors": "none", "edgecolors": "#2ca02c"},
                "allocation succeeded again (recovered)",
            ),
        ]
        for group, style, label in allocations:
            if group:
                ax.scatter(
                    [self.x(a.ts) for a in group],
                    [(a.held_bytes + a.requested_bytes) / div for a in group],
                    label=label,
                    zorder=5,
                    s=40,
                    **style,  # type: ignore[arg-type]
                )
        totals = {
            idx: samples[-1].total_bytes
            for idx, samples in self.t.host.gpus.items()
            if samples and idx in {g.index for g in u.gpu_procs}
        }
        for idx, total in sorted(totals.items()):
            ax.axhline(
                total / div, color="#7f7f7f", linestyle="--", label=f"GPU {idx} total memory"
            )
        ax.set_ylim(bottom=0)

    def _p_probes(self, ax: Axes, u: UnitTimeline) -> None:
        self._probes(ax, u.probes)

    def _probes(self, ax: Axes, probes: Sequence[Any]) -> None:
        ax.set_ylabel("probe latency (ms)")
        ok = [p for p in probes if p.ok and not p.timed_out]
        bad = [p for p in probes if not p.ok and not p.timed_out]
        slow = [p for p in probes if p.timed_out]
        ax.plot(
            [self.x(p.ts) for p in probes],
            [p.latency_ns / 1e6 for p in probes],
            color="#7f7f7f",
            linewidth=0.8,
        )
        for group, style, label in (
            (ok, dict(marker="o", color="#2ca02c"), "probe ok"),
            (bad, dict(marker="x", color="#d62728"), "probe failed"),
            (slow, dict(marker="v", color="#d62728"), "probe timed out"),
        ):
            if group:
                ax.scatter(
                    [self.x(p.ts) for p in group],
                    [p.latency_ns / 1e6 for p in group],
                    label=label,
                    zorder=5,
                    s=25,
                    **style,  # type: ignore[arg-type]
                )
        ax.set_ylim(bottom=0)

    # -- host --------------------------------------------------------------------------------

    def draw_host(self, fig: FigureBase, h: HostTimeline) -> None:
        panels = self.host_panels(h)
        axes = self._axes(fig, panels)
        fig.suptitle(
            f'host {self.t.header.host} — what "memory is free" meant',
            fontsize=12,
            x=0.07,
            ha="left",
        )
        self._draw_panels(axes, panels, h, h.markers, "host_memory")

    def _p_host_memory(self, ax: Axes, h: HostTimeline) -> None:
        s = h.samples
        if not s:
            ax.text(
                0.5,
                0.5,
                "no host samples in this trace",
                transform=ax.transAxes,
                ha="center",
                color="#777777",
            )
            ax.set_ylabel("memory")
            return
        div, unit = _scale(float(max(x.mem_total for x in s)))
        ax.set_ylabel(f"memory ({unit})")
        ts = [x.ts for x in s]
        self._line(ax, ts, [x.mem_total for x in s], div, "MemTotal", "#000000", style="--")
        used = [x.mem_total - x.mem_available if x.mem_available is not None else None for x in s]
        self._line(ax, ts, used, div, "used (MemTotal - MemAvailable)", "#1f77b4")
        self._line(ax, ts, [x.mem_available for x in s], div, "MemAvailable", "#2ca02c")
        self._line(ax, ts, [x.cached for x in s], div, "Cached", "#ff7f0e", style=":")
        ax.set_ylim(bottom=0)

    def _p_host_pressure(self, ax: Axes, h: HostTimeline) -> None:
        ax.set_ylabel("PSI avg10 (%)")
        drew = False
        s = h.samples
        ts = [x.ts for x in s]
        for values, label, colour in (
            ([x.psi_some_avg10 for x in s], "PSI some (host)", "#ff7f0e"),
            ([x.psi_full_avg10 for x in s], "PSI full (host)", "#d62728"),
        ):
            if any(v is not None for v in values):
                self._line(ax, ts, values, 1.0, label, colour)
                drew = True
        host_reclaim = [r for r in h.reclaim if r.kind in STALL_KINDS]
        if host_reclaim:
            drew = self._stalls(self._twin(ax) if drew else ax, host_reclaim, []) or drew
        if h.kswapd:
            ax.scatter(
                [self.x(k.ts) for k in h.kswapd],
                [0.0 for _ in h.kswapd],
                marker="^",
                color="#8c564b",
                label=f"kswapd woken ({sum(k.count for k in h.kswapd)} times)",
                zorder=5,
            )
            drew = True
        ax.set_ylim(bottom=0)
        if not drew:
            ax.text(
                0.5,
                0.5,
                "no host PSI or host reclaim recorded",
                transform=ax.transAxes,
                ha="center",
                color="#777777",
            )

    def _p_host_gpu(self, ax: Axes, h: HostTimeline) -> None:
        top = max((g.total_bytes for samples in h.gpus.values() for g in samples), default=0)
        div, unit = _scale(float(top))
        ax.set_ylabel(f"GPU memory ({unit})")
        for i, (idx, samples) in enumerate(sorted(h.gpus.items())):
            colour = USAGE_COLOURS[i % 4]
            name = h.gpu_names.get(idx, "")
            ts = [g.ts for g in samples]
            self._line(ax, ts, [g.used_bytes for g in samples], div, f"GPU {idx} used", colour)
            self._line(
                ax,
                ts,
                [g.total_bytes for g in samples],
                div,
                f"GPU {idx} total {name}",
                colour,
                style="--",
            )
        ax.set_ylim(bottom=0)

    def _p_host_probes(self, ax: Axes, h: HostTimeline) -> None:
        self._probes(ax, h.probes)

    # -- shared ------------------------------------------------------------------------------

    def _line(
        self,
        ax: Axes,
        ts: Sequence[int],
        values: Sequence[int | float | None],
        div: float,
        label: str,
        colour: str | None,
        style: str = "-",
    ) -> None:
        pts = [(t, float(v)) for t, v in zip(ts, values, strict=True) if v is not None]
        pts = thin(pts, MAX_POINTS)
        if not pts:
            return
        ax.plot(
            [self.x(t) for t, _ in pts],
            [v / div for _, v in pts],
            label=label,
            color=colour,
            linestyle=style,
            linewidth=1.4,
            marker="." if len(pts) < 3 else None,
        )

    def _markers(self, ax: Axes, markers: Sequence[Marker], labels: bool) -> None:
        for m in markers:
            colour, style = MARKER_STYLE.get(m.kind, ("#000000", ":"))
            ax.axvline(self.x(m.ts), color=colour, linestyle=style, linewidth=1.1, alpha=0.8)
        if not labels:
            return
        # Markers closer than ~1.5% of the chart share one label (an OOM kill, its SIGKILL
        # and the exit land within a millisecond): otherwise the labels would overprint.
        groups: list[list[Marker]] = []
        gap = self.x_max * 0.015
        for m in markers:
            if groups and self.x(m.ts) - self.x(groups[-1][0].ts) <= gap:
                groups[-1].append(m)
            else:
                groups.append([m])
        # Label the most telling groups first: kills and restarts over plain exits.
        rank = {OOM: 0, RESTART: 1, GPU_DOWN: 1, GPU_FAIL: 2, SIGNAL: 3, LOST: 3, "exit": 4}
        chosen = sorted(groups, key=lambda g: min(rank.get(m.kind, 5) for m in g))
        chosen = chosen[:MAX_LABELLED_MARKERS]
        transform = ax.get_xaxis_transform()
        for g in chosen:
            g_sorted = sorted(g, key=lambda m: rank.get(m.kind, 5))
            text = g_sorted[0].label + (f" (+{len(g) - 1})" if len(g) > 1 else "")
            colour = MARKER_STYLE.get(g_sorted[0].kind, ("#000000", ":"))[0]
            ax.text(
                self.x(g[0].ts),
                0.98,
                " " + text,
                transform=transform,
                rotation=90,
                va="top",
                ha="right",
                fontsize=7,
                color=colour,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 1},
            )

    def _legend(self, ax: Axes) -> None:
        handles, labels = ax.get_legend_handles_labels()
        twin = self._twins.get(id(ax))
        if twin is not None:
            more_handles, more_labels = twin.get_legend_handles_labels()
            handles += more_handles
            labels += more_labels
        if handles:
            # Long cgroup paths wrap instead of running off the page.
            wrapped = [textwrap.fill(label, 52, subsequent_indent="   ") for label in labels]
            ax.legend(
                handles,
                wrapped,
                loc="upper left",
                bbox_to_anchor=(1.07 if twin is not None else 1.01, 1.0),
                fontsize=7,
                frameon=False,
            )

    @staticmethod
    def _marker_legend(ax: Axes, markers: Sequence[Marker]) -> None:
        kinds = [k for k in MARKER_STYLE if any(m.kind == k for m in markers)]
        if not kinds:
            return
        text = "markers: " + ", ".join(
            f"{MARKER_NAMES[k]} ({sum(1 for m in markers if m.kind == k)})" for k in kinds
        )
        ax.set_title(text, fontsize=8, loc="left", color="#444444")


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
    chart = _Chart(t)
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
        f"v{_e(memory_version or '?')}) · started {_e(_wall(t, t.start_ns))} · "
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
