"""The panels of the host's chart: what "memory is free" meant (meminfo), the host's
pressure, its GPUs, the probes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracer.analysis.quantities import STALL_KINDS
from tracer.outputs.charts.base import USAGE_COLOURS, ChartBase, scale
from tracer.outputs.timeline import HostTimeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import FigureBase


class HostPanels(ChartBase):
    """One method per panel of the host's chart (``_p_<name>``); `host_panels` says which the
    host gets."""

    def host_panels(self, h: HostTimeline) -> list[str]:
        panels = ["host_memory", "host_pressure"]
        if h.gpus:
            panels.append("host_gpu")
        if h.probes:
            panels.append("host_probes")
        return panels

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
        div, unit = scale(float(max(x.mem_total for x in s)))
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
        div, unit = scale(float(top))
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
