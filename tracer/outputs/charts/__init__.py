"""The report's charts: `Chart` draws a unit's or the host's timeline as panels on one time
axis. ``base`` holds what the panels share (axes, lines, markers, legends, styles), ``unit``
a unit's panels, ``host`` the host's; a new panel is a ``_p_<name>`` method in one of them."""

from __future__ import annotations

from tracer.outputs.charts.base import MAX_POINTS, ChartBase, short_path, wall
from tracer.outputs.charts.host import HostPanels
from tracer.outputs.charts.unit import UnitPanels


class Chart(UnitPanels, HostPanels):
    """Both kinds of chart, sharing one time axis and the marks of the exits and verdicts."""


__all__ = ["MAX_POINTS", "Chart", "ChartBase", "HostPanels", "UnitPanels", "short_path", "wall"]
