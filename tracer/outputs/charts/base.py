"""What every chart of the report shares: the time axis, the panels' axes, lines, the markers
of exits and verdicts, the legends, and the styles and scales they use. The panels themselves
are in `tracer.outputs.charts.unit` and `tracer.outputs.charts.host`."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tracer.analysis.quantities import STALL_KINDS, fmt_offset
from tracer.clock import wall_time
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
    from matplotlib.figure import FigureBase

MAX_POINTS = 4000  # per series in a chart: enough for a smooth curve, small SVG
MAX_LABELLED_MARKERS = 14  # per chart; more markers are drawn, unlabelled
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


def scale(max_bytes: float) -> tuple[float, str]:
    if max_bytes >= 8 * 1024**3:
        return 1024.0**3, "GiB"
    if max_bytes >= 8 * 1024**2 or max_bytes == 0:
        return 1024.0**2, "MiB"
    return 1024.0, "KiB"


def nan(v: float | None, div: float = 1.0) -> float:
    return float("nan") if v is None else v / div


def wall(t: Timeline, ts: int) -> str:
    off = t.header.clock_offset_ns
    if off is None:
        return fmt_offset(t.rel_s(ts))
    return wall_time(ts, off).strftime("%Y-%m-%d %H:%M:%S UTC")


class ChartBase:
    """Draws timelines onto a matplotlib figure (or subfigure) with a shared time axis: the
    axes, the markers and legends every panel shares. A panel is a ``_p_<name>`` method of a
    subclass (`UnitPanels`, `HostPanels`), found by its name."""

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
        out[-1].set_xlabel(f"seconds since the recording started ({wall(self.t, self.t.start_ns)})")
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

    @staticmethod
    def _note(ax: Axes, text: str) -> None:
        ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", color="#777777")

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
