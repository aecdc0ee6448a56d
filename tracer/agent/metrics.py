"""The agent's Prometheus metrics, through prometheus_client (names and labels after cAdvisor and
kube-state-metrics: ``namespace``, ``pod``, ``container`` for a Kubernetes pod's container,
empty otherwise; ``unit`` is whyrestart's name for what restarted).

A Kubernetes container a node's CRI runtime named has one ``whyrestart_container_info`` series
(kube-state-metrics' ``kube_pod_container_info``: its ``pod_uid``, ``container_id`` and
``container_runtime`` as labels, value 1; a restart's new container replaces it) and
``whyrestart_container_restarts``, the runtime's restart count as the value, never a label: a
unit's series stay one per unit.

Label cardinality is bounded: a unit's series are removed once the unit has been quiet for
``series_ttl_s`` and its cgroup is gone (``alive`` says whether a unit still exists), as
kube-state-metrics drops a deleted pod's series. The agent's own cost is there too: CPU seconds
and resident memory (prometheus_client's process collector), disk used, incidents, records lost
or unwritten.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.process_collector import ProcessCollector

from tracer.analysis.findings import (
    APP_EXIT,
    CGROUP_OOM,
    GLOBAL_OOM,
    NUMA_OOM,
    Restart,
    Verdict,
)

if TYPE_CHECKING:
    from tracer.pipeline.follow import RuntimeIdentity

UNIT_LABELS = ("unit", "namespace", "pod", "container")
IDENTITY_LABELS = ("pod_uid", "container_id", "container_runtime")
DEFAULT_SERIES_TTL_S = 600.0


class Metrics:
    def __init__(
        self,
        series_ttl_s: float = DEFAULT_SERIES_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        ProcessCollector(registry=reg, namespace="whyrestart_agent")
        self.series_ttl_s = series_ttl_s
        self.clock = clock
        self._per_unit(reg)
        self._of_the_agent(reg)
        self._seen: dict[tuple[str, ...], float] = {}  # unit labels -> last update
        # unit labels -> {(metric, label values): its child}: the children are kept, not asked
        # for again (``labels()`` validates and locks: a third of the cost of a verdict's count)
        self._children: dict[
            tuple[str, ...], dict[tuple[Counter | Gauge, tuple[str, ...]], Any]
        ] = {}
        self._lost_seen = 0
        self._unrecorded_seen: dict[str, int] = {}
        self._eta_shown: set[tuple[str, ...]] = set()
        self._shown: dict[tuple[str, ...], RuntimeIdentity] = {}  # unit labels -> its series'

    def _per_unit(self, reg: CollectorRegistry) -> None:
        """The series labelled by unit: what happened to each unit's processes."""
        self.exits = Counter(
            "whyrestart_exits",
            "Process exits judged, by cause and confidence",
            [*UNIT_LABELS, "cause", "confidence"],
            registry=reg,
        )
        self.restarts = Counter(
            "whyrestart_restarts",
            "Restarts of a unit, by the cause of the exit before",
            [*UNIT_LABELS, "cause"],
            registry=reg,
        )
        self.oom_kills = Counter(
            "whyrestart_oom_kills",
            "OOM kills, by the scope of the limit that fired",
            [*UNIT_LABELS, "limit_scope"],
            registry=reg,
        )
        self.reclaim = Counter(
            "whyrestart_reclaim_stall_seconds",
            "Time processes of a unit stalled in memory reclaim",
            list(UNIT_LABELS),
            registry=reg,
        )
        self.throttle = Counter(
            "whyrestart_memory_high_throttled_seconds",
            "Time processes of a unit were throttled over memory.high",
            list(UNIT_LABELS),
            registry=reg,
        )
        self.clean = Counter(
            "whyrestart_clean_exits",
            "Processes that exited with code 0",
            list(UNIT_LABELS),
            registry=reg,
        )
        # time-to-limit warnings (tracer/analysis/eta.py): a series only while one stands
        self.limit_eta = Gauge(
            "whyrestart_memory_limit_eta_seconds",
            "Seconds until the unit's memory reaches its effective limit at its sustained growth "
            "(present only while the estimator warns)",
            list(UNIT_LABELS),
            registry=reg,
        )
        self.container_info = Gauge(
            "whyrestart_container_info",
            "A Kubernetes container as the node's CRI runtime names it (one series per unit: "
            "a restart's new container replaces it)",
            [*UNIT_LABELS, *IDENTITY_LABELS],
            registry=reg,
        )
        self.runtime_restarts = Gauge(
            "whyrestart_container_restarts",
            "The unit's container's restart count as its CRI runtime gives it (the kubelet's)",
            list(UNIT_LABELS),
            registry=reg,
        )

    def _of_the_agent(self, reg: CollectorRegistry) -> None:
        """The agent's own series: what it lost, wrote, kept and removed."""
        self.lost = Counter(
            "whyrestart_events_lost", "Events the kernel could not hand over", registry=reg
        )
        self.unwritten = Gauge(
            "whyrestart_records_unwritten",
            "Trace records and journal lines the agent could not write (disk full)",
            registry=reg,
        )
        self.disk = Gauge("whyrestart_disk_used_bytes", "State directory bytes used", registry=reg)
        self.incidents = Gauge("whyrestart_incidents", "Incidents kept on disk", registry=reg)
        self.cgroups = Gauge(
            "whyrestart_agent_cgroups_known",
            "Cgroups the agent keeps state about (those gone are forgotten by its sweeps)",
            registry=reg,
        )
        self.evicted = Counter(
            "whyrestart_evicted_files",
            "Segments and incidents removed to stay within --max-disk or --retain",
            ["kind"],
            registry=reg,
        )
        self.signals_unrecorded = Counter(
            "whyrestart_signals_unrecorded",
            "Signals to watched processes counted in the kernel, not recorded: handled or "
            "ignored, they could neither end a process nor explain its end",
            ["signal"],
            registry=reg,
        )

    # -- updates ------------------------------------------------------------------------------

    def _inc(
        self, metric: Counter, labels: dict[str, str], extra: tuple[str, ...] = (), by: float = 1
    ) -> None:
        key = tuple(labels.get(k, "") for k in UNIT_LABELS)
        self._seen[key] = self.clock()
        values = (*key, *extra)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = {}
        child = children.get((metric, values))
        if child is None:
            child = children[(metric, values)] = metric.labels(*values)
        child.inc(by)

    def verdict(self, v: Verdict, labels: dict[str, str]) -> None:
        self._inc(self.exits, labels, (v.cause, v.confidence))
        if v.cause in (CGROUP_OOM, GLOBAL_OOM, NUMA_OOM):
            host = {GLOBAL_OOM: "host", NUMA_OOM: "numa"}
            scope = v.limit_scope or host.get(v.cause, "unknown")
            self._inc(self.oom_kills, labels, (scope,))
        if v.cause == APP_EXIT and v.exit_code == 0:
            self._inc(self.clean, labels)

    def identity(self, labels: dict[str, str], identity: RuntimeIdentity | None) -> None:
        """The unit's CRI identity (none: nothing). The series of a container before it (the
        last attempt's id) is removed, so a crash loop keeps one info series, not one per run;
        expiry takes both with the unit's other series."""
        if identity is None:
            return
        key = tuple(labels.get(k, "") for k in UNIT_LABELS)
        self._seen[key] = self.clock()
        if self._shown.get(key) == identity:
            return  # (every verdict of the unit comes here: the series are made once)
        self._shown[key] = identity
        children = self._children.setdefault(key, {})
        values = (*key, identity.pod_uid or "", identity.container_id, identity.runtime)
        info = self.container_info
        for metric, old in [k for k in children if k[0] is info and k[1] != values]:
            del children[(metric, old)]
            metric.remove(*old)
        if (info, values) not in children:
            children[(info, values)] = info.labels(*values)
            children[(info, values)].set(1)
        if identity.restart_count is not None:
            child = children.get((self.runtime_restarts, key))
            if child is None:
                child = children[(self.runtime_restarts, key)] = self.runtime_restarts.labels(*key)
            child.set(identity.restart_count)

    def clean_exits(self, labels: dict[str, str], n: int) -> None:
        """Clean exits counted in the kernel, not streamed."""
        if n > 0:
            self._inc(self.clean, labels, by=n)

    def restart(self, r: Restart, labels: dict[str, str]) -> None:
        self._inc(self.restarts, labels, (r.cause,))

    def stall(self, labels: dict[str, str], seconds: float, throttled: bool) -> None:
        self._inc(self.throttle if throttled else self.reclaim, labels, by=seconds)

    def eta(self, labels: dict[str, str], seconds: float | None) -> None:
        """Set a unit's time-to-limit gauge, or remove it (``None``: no warning now)."""
        key = tuple(labels.get(k, "") for k in UNIT_LABELS)
        if seconds is not None:
            self.limit_eta.labels(*key).set(round(seconds, 1))
            self._eta_shown.add(key)
        elif key in self._eta_shown:
            self._eta_shown.discard(key)
            self.limit_eta.remove(*key)

    def state(self, *, lost: int, unwritten: int, disk: int, incidents: int, cgroups: int) -> None:
        if lost > self._lost_seen:
            self.lost.inc(lost - self._lost_seen)
            self._lost_seen = lost
        self.unwritten.set(unwritten)
        self.disk.set(disk)
        self.incidents.set(incidents)
        self.cgroups.set(cgroups)

    def signals_unsent(self, totals: dict[str, int]) -> None:
        """The kernel's running totals by signal name (at most 64 series: no expiry)."""
        for name, total in totals.items():
            seen = self._unrecorded_seen.get(name, 0)
            if total > seen:
                self.signals_unrecorded.labels(name).inc(total - seen)
                self._unrecorded_seen[name] = total

    # -- cardinality ------------------------------------------------------------------------

    def expire(self, alive: Callable[[str], bool]) -> int:
        """Remove the series of units quiet for the ttl whose cgroup is gone; how many units."""
        now = self.clock()
        gone = [
            k for k, t in self._seen.items() if now - t >= self.series_ttl_s and not alive(k[0])
        ]
        for key in gone:
            del self._seen[key]
            self._shown.pop(key, None)
            for metric, values in self._children.pop(key, {}):
                metric.remove(*values)
        return len(gone)

    @property
    def units(self) -> int:
        return len(self._seen)
