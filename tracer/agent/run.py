"""`whyrestart agent`: the recorder's pipeline over the whole host, run until stopped, with the
agent's sinks after the analyzer:

  ring buffer, kernel log, samplers, followed units -> ... -> analyzer -> verdicts
                                                     \\-> segments -> incidents
  verdicts -> journal, metrics, incidents, one log line each (text or OpenTelemetry JSON)

Signals: SIGTERM/SIGINT flush everything and exit 0; SIGHUP reopens the journal (log rotation),
applies the disk budget again and sweeps gone cgroups; a SIGKILL loses at most the last second
of segment data (segments are flushed every second; journal lines at once).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tracer import selfguard
from tracer.agent import sdnotify, serve
from tracer.agent.incidents import DEFAULT_AFTER_S, DEFAULT_BEFORE_S, IncidentStore, notable
from tracer.agent.journal import Journal, restart_entry, verdict_entry
from tracer.agent.metrics import DEFAULT_SERIES_TTL_S, Metrics
from tracer.agent.otel import log_line
from tracer.agent.segments import DEFAULT_RETAIN_S, DEFAULT_SEGMENT_S, SegmentSink
from tracer.agent.state import Evicted, StateDir
from tracer.analysis.analyzer import Analyzer
from tracer.analysis.findings import Verdict
from tracer.analysis.units import label_parts
from tracer.clock import wall_time
from tracer.errors import UsageError
from tracer.events import CgroupInfo, CgroupSample, Event, Lost, ReclaimStall, ReclaimSummary
from tracer.pipeline.assembly import Profile
from tracer.pipeline.follow import RuntimeIdentity
from tracer.pipeline.record import Recorder, Targets
from tracer.safetext import field
from tracer.sources.cgroupfs import CgroupLayout, CgroupResolver
from tracer.trace.format import TraceFooter

HOUSEKEEPING_S = 5.0
SWEEP_S = 300.0  # how often the cgroups the run keeps something about are checked for gone
MAX_UNIT_PATHS = 65536
# The always-on recorder: it needs no 10 ms reaction (an OOM kill wakes it at once) nor 10
# samples a second of every cgroup: a tenth of the wake-ups and samples, and half a second's wait
# once quiet for 0.3 s. A cgroup whose usage has not moved is sampled in full every 10 s, not
# every second (100 idle containers cost 1.2% of a core at idle, sampled in full each second). A
# process not mapping libcuda is looked at again after 1, 2, 4 ... s, at most every minute
# (tracer/gpu/side.py): not each second for every long-running server on the node.
PROFILE = Profile(
    agent=True,
    poll_ms=100,
    idle_poll_ms=500,
    sample_interval_ns=1_000_000_000,
    quiet_interval_ns=10_000_000_000,
    gpu_rescan_max_gap_ns=60_000_000_000,
)
DEFAULT_MAX_DISK = 1 << 30
DEFAULT_METRICS_ADDR = "127.0.0.1:9464"


@dataclass
class AgentConfig:
    state_dir: str
    max_disk: int = DEFAULT_MAX_DISK
    metrics_addr: str | None = DEFAULT_METRICS_ADDR
    log_format: str = "text"  # "text", "json" or "none"
    segment_s: float = DEFAULT_SEGMENT_S
    retain_s: float = DEFAULT_RETAIN_S
    before_s: float = DEFAULT_BEFORE_S
    after_s: float = DEFAULT_AFTER_S
    series_ttl_s: float = DEFAULT_SERIES_TTL_S


def parse_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6); a bad one is a usage error naming the option."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"--metrics-addr {text!r} is not HOST:PORT", "e.g. --metrics-addr 127.0.0.1:9464"
        )
    return host.strip("[]") or "0.0.0.0", int(port)


def gone_twice(
    known: dict[int, str], exists: Callable[[int, str], bool], gone_before: set[int]
) -> tuple[set[int], set[int]]:
    """One sweep: (the cgroups to forget, those gone to look at again next sweep). A cgroup is
    forgotten once two sweeps in a row found it gone."""
    gone = {cid for cid, path in known.items() if not exists(cid, path)}
    return gone & gone_before, gone - gone_before


def boot_id(proc_root: str = "/proc") -> str:
    try:
        with open(os.path.join(proc_root, "sys/kernel/random/boot_id")) as f:
            return f.read().strip().replace("-", "")
    except OSError:
        return "unknownboot"


class Agent:
    def __init__(self, config: AgentConfig, out: Callable[[bytes], object] | None = None) -> None:
        self.config = config
        self.out: Callable[[bytes], object] = out or _stdout
        self.boot = boot_id()
        self.metrics = Metrics(config.series_ttl_s)
        self.layout = CgroupLayout.from_system()
        self.recorder: Recorder | None = None
        self._unit_paths: dict[str, str] = {}  # unit label -> a cgroup path of it
        self._lost = 0
        self._eta_units: set[int] = set()  # watched cgroups with a time-to-limit gauge now
        self._next_housekeeping = 0.0
        # set once a record the kernel makes would be judged: /metrics and /readyz answer 503
        # before (tracer/agent/serve.py)
        self.ready = threading.Event()
        self._clean_seen: dict[int, int] = {}  # cgroup id -> clean exits already counted
        self._next_sweep = time.monotonic() + SWEEP_S
        self._gone_before: set[int] = set()  # cgroups found gone by the last sweep

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.config
        addr = parse_addr(cfg.metrics_addr) if cfg.metrics_addr else None
        self.state = StateDir.open(cfg.state_dir)
        try:
            if addr is not None:
                self._serve(addr)
            self.journal = Journal(
                self.state.journal, self.state.journal_old, max(1 << 20, cfg.max_disk // 16)
            )
            self.segments = SegmentSink(
                self.state,
                lambda: self.recorder.header if self.recorder else None,
                self.boot,
                segment_s=cfg.segment_s,
                retain_s=cfg.retain_s,
                max_bytes=cfg.max_disk,
                on_evict=self._evicted,
            )
            self.incidents = IncidentStore(
                self.segments,
                self._clock_offset,
                before_s=cfg.before_s,
                after_s=cfg.after_s,
                on_cut=self._cut,
            )
            self.recorder = Recorder(
                None,
                Targets(all=True),
                on_event=self._on_event,
                sinks=[self.segments, self.incidents, _Housekeeping(self)],
                reload=self._reload,
                on_ready=self._on_ready,
                profile=PROFILE,
            )
            self.recorder.run()
        finally:
            if hasattr(self, "journal"):
                self.journal.close()
            self.state.close()
        return 0

    def _on_ready(self) -> None:
        """The hooks are attached and every source reads: an exit or OOM kill from now on is
        judged. Every readiness signal turns true here, none before: /readyz (and /metrics),
        systemd's READY=1, the ready line."""
        self.ready.set()
        problem = sdnotify.notify("READY=1\nSTATUS=watching every cgroup")
        if problem is not None:
            self._note(problem)
        where = f", metrics on http://{self.config.metrics_addr}/metrics"
        self._note(
            f"ready: watching every cgroup; state in {self.state.path}"
            + (where if self.config.metrics_addr else "")
        )

    def _serve(self, addr: tuple[str, int]) -> None:
        try:
            serve.start(addr[0], addr[1], self.metrics.registry, self.ready)
        except OSError as exc:
            raise UsageError(
                f"cannot serve metrics on {addr[0]}:{addr[1]}: {exc.strerror or exc}",
                "choose a free port with --metrics-addr, or stop what holds it "
                "(--metrics-addr '' turns metrics off)",
            ) from exc

    def _clock_offset(self) -> int:
        header = self.recorder.header if self.recorder else None
        return header.clock_offset_ns if header else 0

    # -- what the pipeline hands over -------------------------------------------------------

    def _on_event(self, ev: Event | None, verdicts: list[Verdict]) -> None:
        for v in verdicts:
            self._verdict(v)
        if ev is None:
            return
        t = type(ev)
        if t is ReclaimStall or t is ReclaimSummary:
            self._stall(ev)  # type: ignore[arg-type]
        elif t is Lost:
            self._lost += ev.count  # type: ignore[attr-defined]
        elif t is CgroupSample:
            self._eta(ev)  # type: ignore[arg-type]
        elif isinstance(ev, CgroupInfo):
            unit = self._analyzer().unit_of_cgroup(ev.cgroup_id, ev.path)
            if unit is not None:
                self._unit_paths[unit.label] = ev.path
                if len(self._unit_paths) > MAX_UNIT_PATHS:  # (the oldest named first)
                    del self._unit_paths[next(iter(self._unit_paths))]

    def _eta(self, ev: CgroupSample) -> None:
        """The unit's time-to-limit gauge, from the Analyzer's estimate at its sample."""
        est = self._analyzer().forecast(ev.cgroup_id)
        if est is None and ev.cgroup_id not in self._eta_units:
            return
        unit = self._analyzer().unit_of_cgroup(ev.cgroup_id, ev.path)
        labels = label_parts(unit.label if unit else ev.path)
        if est is None:
            self._eta_units.discard(ev.cgroup_id)
        else:
            self._eta_units.add(ev.cgroup_id)
        self.metrics.eta(labels, est.seconds if est is not None else None)

    def _analyzer(self) -> Analyzer:
        assert self.recorder is not None
        return self.recorder.analyzer

    def _identity(self, unit: str | None) -> RuntimeIdentity | None:
        """The unit's CRI identity, when a node's CRI runtime named it (the follower keeps it)."""
        follower = self.recorder.follower if self.recorder is not None else None
        return follower.identity(unit) if follower is not None else None

    def _verdict(self, v: Verdict) -> None:
        labels = label_parts(v.unit)
        identity = self._identity(v.unit)
        self.metrics.verdict(v, labels)
        self.metrics.identity(labels, identity)
        if not notable(v, labels["unit"] != ""):
            return
        incident = self.incidents.add(v)
        self.journal.add(
            verdict_entry(v, self.boot, self._clock_offset(), incident, labels, identity)
        )
        if self.config.log_format == "json":
            self.out(log_line(v, self._clock_offset(), incident, identity))
        elif self.config.log_format == "text":
            when = wall_time(v.ts, self._clock_offset()).isoformat(timespec="milliseconds")
            self.out(
                field(
                    f"{when} {v.unit or '-'} pid {v.pid} ({v.comm}): {v.cause} ({v.confidence})"
                    f" - {v.summary} [incident {incident}]"
                ).encode()
                + b"\n"
            )

    def _stall(self, ev: ReclaimStall | ReclaimSummary) -> None:
        if isinstance(ev, ReclaimSummary):
            if ev.kind == "kswapd":
                return
            seconds, kind = ev.total_ns / 1e9, ev.kind
        else:
            # long stalls are counted in the summaries too: only the summaries add up
            return
        unit = self._analyzer().unit_of_cgroup(ev.cgroup_id)
        self.metrics.stall(label_parts(unit.label if unit else None), seconds, kind == "high")

    def _housekeeping(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_housekeeping:
            return
        self._next_housekeeping = now + HOUSEKEEPING_S
        # (a restart goes out once its old exit's verdict names its cause; none is kept)
        for r in self._analyzer().take_restarts(final=force):
            labels, identity = label_parts(r.unit), self._identity(r.unit)
            self.metrics.restart(r, labels)
            self.metrics.identity(labels, identity)
            self.journal.add(restart_entry(r, self.boot, self._clock_offset(), identity))
        self._clean_exits()
        if self.recorder is not None and self.recorder.kernel is not None:
            self.metrics.signals_unsent(self.recorder.kernel.signals_unsent())
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_S
            self._sweep()
        self.journal.flush()
        # (incidents are written between rotations: the budget is applied here too)
        self._evicted(self.state.enforce(self.config.max_disk, keep=self.segments.current))
        self.metrics.expire(self._alive)
        self.metrics.state(
            lost=self._lost,
            unwritten=self.segments.unwritten + self.journal.unwritten + self.journal.held,
            disk=self.state.used(),
            incidents=len(self.state.incident_files()),
            cgroups=len(self._analyzer().ev.cgroups),
        )

    def _clean_exits(self) -> None:
        """The clean exits the kernel counted instead of sending, by the unit of their cgroup."""
        kernel = self.recorder.kernel if self.recorder else None
        if kernel is None:
            return
        counts = kernel.clean_exit_counts()
        for cid, total in counts.items():
            before = self._clean_seen.get(cid, 0)
            delta = total - before if total >= before else total  # (the LRU dropped it)
            self._clean_seen[cid] = total
            if delta:
                unit = self._analyzer().unit_of_cgroup(cid, self._resolver().path_of(cid))
                self.metrics.clean_exits(label_parts(unit.label if unit else None), delta)
        if len(self._clean_seen) > len(counts):
            # the kernel's map dropped them (LRU): so do we, and stay as small as it is
            self._clean_seen = {c: n for c, n in self._clean_seen.items() if c in counts}

    def _sweep(self) -> None:
        """Forget the cgroups found gone by two sweeps in a row (the evidence of the last
        minutes stays for the verdicts that may still need it): a host that makes and removes
        cgroups by the thousand (a Kubernetes node's jobs) must not grow the agent for ever."""
        assert self.recorder is not None
        forget, self._gone_before = gone_twice(
            self._analyzer().known_cgroups(), self._cgroup_exists, self._gone_before
        )
        if forget:
            self.recorder.forget_cgroups(forget)

    def _resolver(self) -> CgroupResolver:
        """The recording's own resolver, which learns each new cgroup as the kernel makes it:
        one per agent, so a miss never walks the hierarchy again (code review 3 §3)."""
        assert self.recorder is not None and self.recorder.resolver is not None
        return self.recorder.resolver

    def _cgroup_exists(self, cgroup_id: int, path: str) -> bool:
        return self._resolver().id_now(path) == cgroup_id  # (a path made again is a new id)

    def _alive(self, unit: str) -> bool:
        """A unit's cgroup still exists (asked once its series have been quiet for the ttl:
        a unit that is gone is forgotten here too)."""
        path = self._unit_paths.get(unit)
        if path is not None and self._resolver().exists(path):
            return True
        self._unit_paths.pop(unit, None)
        return False

    def _reload(self) -> None:
        self.journal.reopen()
        self._evicted(self.state.enforce(self.config.max_disk, keep=self.segments.current))
        self._sweep()
        self._note("reloaded: journal reopened, disk budget applied, gone cgroups swept")

    def _evicted(self, evicted: Sequence[Evicted]) -> None:
        for e in evicted:
            self.metrics.evicted.labels(e.kind).inc()
            if e.kind == "incident":
                self._note(
                    f"evicted incident {os.path.basename(e.path)} ({e.size} bytes): over --max-disk"
                )

    def _cut(self, incident: str, path: str | None, error: str | None) -> None:
        if error is not None:
            self._note(f"incident {incident} could not be kept: {error}")
            return
        # (an incident after a storm can be a good part of the budget: applied now, not at
        # the next tick, so that the directory stands above it only while one is written)
        self._evicted(self.state.enforce(self.config.max_disk, keep=self.segments.current))
        # (what the cut read is freed now: handed back at once, not at the next minute's trim)
        selfguard.trim_heap()

    def _note(self, text: str) -> None:
        print(f"whyrestart agent: {field(text)}", file=sys.stderr, flush=True)


class _Housekeeping:
    """The agent's timer, as the last sink: restarts, metrics, the journal's retries."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def write(self, events: Sequence[Event]) -> None:
        self.agent._housekeeping()

    def close(self, footer: TraceFooter, complete: bool) -> None:
        self.agent._housekeeping(force=True)


def _stdout(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()  # a log pipeline reads each line as it comes
