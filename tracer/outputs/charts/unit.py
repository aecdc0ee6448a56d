"""The panels of a unit's chart: its memory against its limits, the anon/file breakdown, the
pressure and stalls, its GPU memory, its probes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tracer.analysis.quantities import fmt_bytes
from tracer.outputs.charts.base import (
    EFFECTIVE_COLOUR,
    LIMIT_COLOURS,
    USAGE_COLOURS,
    ChartBase,
    nan,
    scale,
    short_path,
)
from tracer.outputs.timeline import UnitTimeline

WARN_COLOUR = "#d62728"  # the tail's warnings: a time-to-limit projection
THRASH_COLOUR = "#9467bd"  # where page-cache thrash began

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import FigureBase

    from tracer.events import GpuAllocFailure, GpuOomRecovered


class UnitPanels(ChartBase):
    """One method per panel of a unit's chart (``_p_<name>``); `unit_panels` says which a unit
    gets."""

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
        div, unit = scale(top)
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
            ys = [nan(v, div) for _, v in ln.points]
            style = "--" if ln.kind == "max" else "-."
            ax.step(xs, ys, where="post", color=colour, linestyle=style, linewidth=1.6, label=label)
        for a in u.ancestors:
            if a.sampled:
                colour = colour_of.get(a.path, "#999999")
                label = f"usage {short_path(a.path)} (ancestor)"
                self._line(ax, a.ts, a.usage, div, label, colour, style=":")
        for eff in u.effective:
            xs = [self.x(ts) for ts, _, _ in eff.points]
            ys = [nan(v, div) for _, v, _ in eff.points]
            label = eff.label()
            for _, _, by in eff.points:
                if by:
                    label = label.replace(by, short_path(by))
            ax.step(
                xs, ys, where="post", color=EFFECTIVE_COLOUR, linewidth=5, alpha=0.3, label=label
            )
        self._warned(ax, u, div)
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

    def _warned(self, ax: Axes, u: UnitTimeline, div: float) -> None:
        """What tail warned: each time-to-limit estimate drawn as its projection, from the
        unreclaimable memory it saw to the limit (up to the chart's end), and a line where
        page-cache thrash began."""
        eta_label, thrash_label = "time-to-limit warning (projection)", "page-cache thrash began"
        end = self.t.end_ns
        for c in u.cgroups:
            for ln in c.warnings:
                if ln.eta is not None:
                    e = ln.eta
                    reach = ln.ts + int(e.seconds * 1e9)
                    stop = min(reach, end)
                    y1 = e.unreclaimable + e.rate * (stop - ln.ts) / 1e9
                    ax.plot(
                        [self.x(ln.ts), self.x(stop)],
                        [e.unreclaimable / div, y1 / div],
                        color=WARN_COLOUR,
                        linestyle=(0, (4, 2)),
                        linewidth=1.4,
                        label=eta_label,
                    )
                    eta_label = "_"
                elif ln.thrash is not None:
                    ax.axvline(
                        self.x(ln.ts), color=THRASH_COLOUR, linewidth=1.2, label=thrash_label
                    )
                    thrash_label = "_"

    def _p_breakdown(self, ax: Axes, u: UnitTimeline) -> None:
        leaves = [c for c in u.leaves if any(v is not None for v in c.anon)]
        top = max((max((v or 0) for v in c.usage) for c in leaves if c.usage), default=0)
        div, unit = scale(float(top))
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

    def _p_gpu(self, ax: Axes, u: UnitTimeline) -> None:
        values = [g.used_bytes for g in u.gpu_procs if g.used_bytes is not None]
        values += [f.held_bytes + f.requested_bytes for f in u.gpu_failures]
        div, unit = scale(float(max(values, default=0)))
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
