"""``whyrestart export --format perfetto``: a trace as Chrome trace-event JSON, which
ui.perfetto.dev (and chrome://tracing) open. The shape is documented in `tracer.outputs`.

Mapping (Perfetto's JSON importer turns each into a track):

* one *process* per unit, plus ``pid`` 1 for the host, named by ``process_name`` metadata;
  pids are synthetic because a unit outlives its processes (a restart is a new pid);
* counters (``"ph": "C"``) become process counter tracks named ``"<name> <arg>"``: one arg per
  counter, so each track reads like ``usage /system.slice/x.service MiB``. Unlimited stretches
  of a limit are gaps (no sample), not zeros;
* complete slices (``"ph": "X"``) for each long reclaim stall and each reclaim-summary
  interval. Perfetto needs the slices of one thread to nest; two threads of one process can
  stall at once, so overlapping slices are spread over as many ``thread_name``-named lanes as
  needed (tids are unique across the whole file: Perfetto names threads by tid alone);
* instants (``"ph": "i"``) with process scope for OOM kills, signals, exits, restarts, GPU
  failures and verdicts, and global scope for a host-wide OOM, so they cut across every track.

Timestamps are microseconds since the start of the recording (floats keep nanoseconds).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from tracer import __version__, safetext
from tracer.analysis.quantities import STALL_KINDS, fmt_offset
from tracer.clock import wall_time
from tracer.errors import OutputError
from tracer.outputs.timeline import (
    OOM,
    HostTimeline,
    Marker,
    Timeline,
    UnitTimeline,
    thin,
)

SCHEMA = 1
HOST_PID = 1
MAX_POINTS = 20000  # per counter track: Perfetto copes with more, the JSON file grows
MiB = 1024.0 * 1024.0

TraceEvent = dict[str, Any]


class _Writer:
    def __init__(self, t: Timeline) -> None:
        self.t = t
        self.meta: list[TraceEvent] = []
        self.events: list[TraceEvent] = []
        self._next_tid = 100  # below: left to the synthetic process ids

    def us(self, ts: int) -> float:
        return round((ts - self.t.start_ns) / 1000.0, 3)

    # -- tracks --------------------------------------------------------------------------------

    def process(self, pid: int, name: str, order: int) -> None:
        self.meta.append(
            {"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": name}}
        )
        self.meta.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": pid,
                "tid": pid,
                "args": {"sort_index": order},
            }
        )

    def thread(self, pid: int, name: str) -> int:
        tid = self._next_tid
        self._next_tid += 1
        self.meta.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
        )
        return tid

    # -- events --------------------------------------------------------------------------------

    def counter(
        self,
        pid: int,
        name: str,
        unit: str,
        points: Iterable[tuple[int, float | int | None]],
        scale: float = 1.0,
    ) -> None:
        pts = [(ts, float(v)) for ts, v in points if v is not None]
        for ts, v in thin(pts, MAX_POINTS):
            self.events.append(
                {
                    "ph": "C",
                    "name": name,
                    "pid": pid,
                    "tid": pid,
                    "ts": self.us(ts),
                    "args": {unit: round(v / scale, 4)},
                }
            )

    def slices(
        self, pid: int, lane_name: str, spans: Sequence[tuple[int, int, str, dict[str, Any]]]
    ) -> None:
        """Complete slices (start ns, duration ns, name, args), spread over lanes so that no
        two slices of one lane overlap."""
        lanes: list[tuple[int, int]] = []  # (tid, end ns of its last slice)
        for start, dur, name, args in sorted(spans, key=lambda s: (s[0], -s[1])):
            for i, (tid, end) in enumerate(lanes):
                if start >= end:
                    lanes[i] = (tid, start + dur)
                    break
            else:
                suffix = f" (lane {len(lanes) + 1})" if lanes else ""
                tid = self.thread(pid, lane_name + suffix)
                lanes.append((tid, start + dur))
            self.events.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": "memory",
                    "pid": pid,
                    "tid": tid,
                    "ts": self.us(start),
                    "dur": round(dur / 1000.0, 3),
                    "args": args,
                }
            )

    def instant(self, pid: int, ts: int, name: str, args: dict[str, Any], scope: str = "p") -> None:
        self.events.append(
            {
                "ph": "i",
                "s": scope,
                "name": name,
                "cat": "lifecycle",
                "pid": pid,
                "tid": pid,
                "ts": self.us(ts),
                "args": args,
            }
        )

    def markers(self, pid: int, markers: Sequence[Marker]) -> None:
        for m in markers:
            args: dict[str, Any] = {"kind": m.kind, "detail": m.detail}
            if m.pid is not None:
                args["pid"] = m.pid
            self.instant(pid, m.ts, m.label, args)

    # -- units ---------------------------------------------------------------------------------

    def unit(self, pid: int, u: UnitTimeline) -> None:
        # Long on purpose: one short block per kind of track a unit has (counters, limits,
        # processes, stalls, probes), all written to the same process of the export.
        for c in u.cgroups:
            if c.sampled:
                self.counter(pid, f"usage {c.path}", "MiB", zip(c.ts, c.usage, strict=True), MiB)
        for a in u.ancestors:
            if a.sampled:
                self.counter(
                    pid, f"usage {a.path} (ancestor)", "MiB", zip(a.ts, a.usage, strict=True), MiB
                )
        for ln in u.limits:
            self.counter(pid, f"{ln.what} {ln.path}", "MiB", ln.points, MiB)
        for eff in u.effective:
            self.counter(
                pid,
                f"effective limit {eff.path}",
                "MiB",
                [(ts, v) for ts, v, _ in eff.points],
                MiB,
            )
        for c in u.leaves:
            for key, values in (("anon", c.anon), ("file", c.file), ("shmem", c.shmem)):
                if any(v is not None for v in values):
                    self.counter(pid, f"{key} {c.path}", "MiB", zip(c.ts, values, strict=True), MiB)
            if any(v is not None for v in c.psi_some):
                self.counter(
                    pid, f"PSI some avg10 {c.path}", "%", zip(c.ts, c.psi_some, strict=True)
                )
        for pid_, index in sorted({(g.pid, g.index) for g in u.gpu_procs}):
            self.counter(
                pid,
                f"GPU {index} memory of pid {pid_}",
                "MiB",
                [(g.ts, g.used_bytes) for g in u.gpu_procs if (g.pid, g.index) == (pid_, index)],
                MiB,
            )
        for target in sorted({p.target for p in u.probes}):
            self.counter(
                pid,
                f"probe latency {target}",
                "ms",
                [(p.ts, p.latency_ns / 1e6) for p in u.probes if p.target == target],
            )
            for p in u.probes:
                if p.target == target and (not p.ok or p.timed_out):
                    what = "timed out" if p.timed_out else "failed"
                    self.instant(
                        pid,
                        p.ts,
                        f"probe {what}",
                        {"target": p.target, "error": p.error, "latency_ms": p.latency_ns / 1e6},
                    )
        self.slices(
            pid,
            "reclaim stalls",
            [
                (
                    st.ts - st.duration_ns,
                    st.duration_ns,
                    f"{st.kind} stall pid {st.pid}",
                    {
                        "pid": st.pid,
                        "comm": st.comm,
                        "kind": st.kind,
                        "cgroup": self.t.cgroup_paths.get(st.cgroup_id, str(st.cgroup_id)),
                        "reclaimed_bytes": st.reclaimed_bytes,
                        "rung": st.rung,
                    },
                )
                for st in u.stalls
            ],
        )
        self._summaries(pid, [s for s in u.summaries if s.kind in STALL_KINDS])
        self.markers(pid, u.markers)
        for v in u.verdicts:
            self.instant(
                pid,
                v.ts,
                f"verdict {v.cause} pid {v.pid}",
                {
                    "cause": v.cause,
                    "confidence": v.confidence,
                    "summary": v.summary,
                    "advice": v.advice,
                    "evidence": [
                        f"{fmt_offset(self.t.rel_s(ts))} {what}" for ts, what in v.evidence
                    ],
                },
            )

    def _summaries(self, pid: int, summaries: Sequence[Any]) -> None:
        by_track: dict[tuple[int, str], list[Any]] = {}
        for s in summaries:
            by_track.setdefault((s.cgroup_id, s.kind), []).append(s)
        for (cid, kind), items in sorted(by_track.items()):
            path = self.t.cgroup_paths.get(cid, f"cgroup id {cid}") if cid else "host"
            self.slices(
                pid,
                f"{kind} reclaim {path}",
                [
                    (
                        self.t.stall_span(s)[0],
                        s.ts - self.t.stall_span(s)[0],
                        f"{s.count} {kind} stalls, {s.total_ns / 1e6:.1f} ms",
                        {
                            "count": s.count,
                            "total_ms": s.total_ns / 1e6,
                            "max_ms": s.max_ns / 1e6,
                            "reclaimed_bytes": s.reclaimed_bytes,
                        },
                    )
                    for s in items
                    if s.interval_ns > 0
                ],
            )

    def host(self, h: HostTimeline) -> None:
        s = h.samples
        pid = HOST_PID
        self.counter(pid, "MemTotal", "MiB", [(x.ts, x.mem_total) for x in s], MiB)
        self.counter(pid, "MemAvailable", "MiB", [(x.ts, x.mem_available) for x in s], MiB)
        self.counter(
            pid,
            "used (MemTotal - MemAvailable)",
            "MiB",
            [
                (x.ts, x.mem_total - x.mem_available if x.mem_available is not None else None)
                for x in s
            ],
            MiB,
        )
        self.counter(pid, "PSI some avg10", "%", [(x.ts, x.psi_some_avg10) for x in s])
        self.counter(pid, "PSI full avg10", "%", [(x.ts, x.psi_full_avg10) for x in s])
        for idx, samples in sorted(h.gpus.items()):
            self.counter(
                pid, f"GPU {idx} used", "MiB", [(g.ts, g.used_bytes) for g in samples], MiB
            )
            self.counter(
                pid, f"GPU {idx} total", "MiB", [(g.ts, g.total_bytes) for g in samples], MiB
            )
        self.slices(
            pid,
            "kswapd",
            [
                (
                    k.ts - k.interval_ns,
                    k.interval_ns,
                    f"kswapd woken {k.count}x",
                    {"count": k.count},
                )
                for k in h.kswapd
                if k.interval_ns > 0
            ],
        )
        self._summaries(pid, [r for r in h.reclaim if r.kind in STALL_KINDS])
        for m in h.markers:
            # a host-wide OOM concerns every unit: a global instant cuts across all tracks
            args: dict[str, Any] = {"kind": m.kind, "detail": m.detail}
            self.instant(pid, m.ts, m.label, args, scope="g" if m.kind == OOM else "p")
        for p in h.probes:
            self.counter(pid, f"probe latency {p.target}", "ms", [(p.ts, p.latency_ns / 1e6)])


def export(t: Timeline, source: str) -> dict[str, Any]:
    """The trace-event document (a dict ready for JSON)."""
    w = _Writer(t)
    w.process(HOST_PID, f"host {t.header.host}", len(t.units) + 1)
    for i, u in enumerate(t.units):
        pid = HOST_PID + 1 + i
        w.process(pid, f"unit {u.label}", i)
        w.unit(pid, u)
    w.host(t.host)
    offset = t.header.clock_offset_ns
    started = wall_time(t.start_ns, offset).isoformat() if offset is not None else None
    events = sorted(w.events, key=lambda e: (e["ts"], e["pid"], e["ph"]))
    return {
        "traceEvents": w.meta + events,
        "displayTimeUnit": "ms",
        "metadata": {
            "schema": SCHEMA,
            "tool": "whyrestart",
            "tool_version": __version__,
            "source": source,
            "host": t.header.host,
            "kernel": t.header.kernel,
            "started": started,
            "started_ns": t.start_ns,
            "clock": t.header.clock,
            "units": {str(HOST_PID + 1 + i): u.label for i, u in enumerate(t.units)},
            "verdicts": len(t.verdicts),
        },
    }


def write_perfetto(t: Timeline, source: str, path: str) -> int:
    """Write the export to ``path``; returns the number of trace events written."""
    doc = export(t, source)
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise OutputError(f"cannot write {path}: directory {d} does not exist", "create it first")
    try:
        with open(path, "wb") as f:
            # exact values; C1 and bidi controls as \\u escapes, so `cat` shows them inert
            f.write(safetext.json_text(orjson.dumps(doc).decode()).encode())
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    return len(doc["traceEvents"])


__all__ = ["HOST_PID", "SCHEMA", "export", "write_perfetto"]
