"""Section agent: `whyrestart agent` side by side with libbpf-tools' exitsnoop in one run.

Phases, in this order (each tool alone on --tool-cpu, the workloads on --storm-cpu):

  1. bare: the paced clean-exit storm with no tracer (the workload's own CPU);
  2. exitsnoop (printing every exit to a file): CPU at idle, then under the paced storm;
  3. the agent (fresh state dir, metrics on a free port): CPU and state-dir growth at idle, CPU
     under the paced storm, a storm at 12k exits/s mixed with failures (non-zero exits, fatal
     signals, cgroup OOM kills) counted back from its segments, kill -> /metrics and -> history
     latency over --agent-kills OOM kills, beside a busy Go program (its runtime preempts
     goroutines with SIGURG) and a 100 Hz SIGPROF profiler with a paced mix of OOM kills and
     fatal-signal deaths among them, then an RSS soak; its RSS is sampled every second
     throughout.

The paced storm runs in a child cgroup made for it, so that the agent's kernel filter applies:
a clean exit of a process whose cgroup is its parent's is counted in the kernel, not sent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.helpers import FAIL, GOBUSY, SIGPROF, STORM_COMM, build_gobusy
from bench.options import MiB, Options
from bench.procs import (
    HelperFailed,
    Popen,
    key_values,
    kill_all,
    loadavg,
    proc_cpu_s,
    proc_status_kb,
    reap,
    say,
    spawn,
    tail,
)
from bench.records import Section
from bench.report import method_lines, rss_growth
from bench.runner import Context, start_tool, stop_tool
from bench.sections import agent_containers
from bench.tools import Exitsnoop, Whyrestart
from bench.workloads import (
    StormWork,
    memory_cgroup,
    memory_version,
    parse_storm,
    remove_cgroup,
)
from tracer.agent.journal import read_journal
from tracer.agent.state import StateDir
from tracer.events import Exit, Lost, OomKill, Signal
from tracer.sources.cgroupfs import ChildCgroup
from tracer.trace.reader import TraceReader

Result = dict[str, Any]  # one phase's raw numbers, as --json keeps them
POLL_S = 0.02  # how often the latency phase looks at /metrics and the journal
CROWD_SETTLE_S = 5.0  # from the crowd's start to its CPU window
KILL_WAIT_S = 30.0  # a kill not in both by then is reported missing
INCIDENT_WAIT_S = 90.0  # the agent's 30 s after an incident's last verdict, and its cut
OOM_METRIC = "whyrestart_oom_kills"
LOST_METRIC = "whyrestart_events_lost_total"
UNRECORDED_METRIC = "whyrestart_signals_unrecorded_total"
GO_MAXPROCS = 8  # the busy Go program's Ps, as on an 8-core node
NOISY_TARGET_CPU_PCT = 0.5  # issue 31: the agent beside Go and a profiler, % of a core


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _cpu_pct(pid: int, c0: float | None, t0: float) -> float | None:
    c1 = proc_cpu_s(pid)
    if c0 is None or c1 is None:
        return None
    return (c1 - c0) / (time.monotonic() - t0) * 100


def _idle_cpu(pid: int, seconds: float) -> float | None:
    """The process's CPU over ``seconds`` of doing nothing, in % of a core."""
    t0, c0 = time.monotonic(), proc_cpu_s(pid)
    time.sleep(seconds)
    return _cpu_pct(pid, c0, t0)


def _dir_bytes(path: Path) -> int:
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
    return total


def _oom_kills(cg: ChildCgroup) -> int | None:
    """The cgroup's own count of OOM kills (v1 memory.oom_control, v2 memory.events)."""
    name = "memory.oom_control" if memory_version() == 1 else "memory.events"
    try:
        for line in Path(cg.abs_path, name).read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
    except (OSError, ValueError):
        return None
    return None


def _procs(cg: ChildCgroup) -> dict[str, str]:
    return {"WR_JOIN_CGROUP": os.path.join(cg.abs_path, "cgroup.procs")}


class Agent:
    """`whyrestart agent` pinned to the tool CPU, with its state dir and metrics port."""

    def __init__(self, opts: Options, tmp: Path) -> None:
        self.opts = opts
        self.state = tmp / "state"
        self.port = _free_port()
        self.stderr = tmp / "agent.stderr"
        cmd = [
            "taskset",
            "-c",
            str(opts.tool_cpu),
            opts.whyrestart_exe(),
            "agent",
            "--state-dir",
            str(self.state),
            "--metrics-addr",
            f"127.0.0.1:{self.port}",
            "--log-format",
            "none",
        ]
        with open(self.stderr, "wb") as fe:
            self.proc: Popen = spawn(cmd, stdout=subprocess.DEVNULL, stderr=fe)
        self.samples: list[tuple[float, int | None]] = []  # (s since start, VmRSS kB)
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def wait_ready(self, cap: float) -> float:
        """Seconds until the agent said it is watching (HelperFailed if it died or never did)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < cap:
            if self.proc.poll() is not None:
                raise HelperFailed(f"the agent exited {self.proc.returncode}: {tail(self.stderr)}")
            if b"ready:" in self.stderr.read_bytes():
                self._sampler.start()
                return time.monotonic() - t0
            time.sleep(0.05)
        raise HelperFailed(f"the agent was not ready after {cap:g} s: {tail(self.stderr)}")

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            self.samples.append(
                (time.monotonic() - self._t0, proc_status_kb(self.proc.pid, "VmRSS"))
            )

    def oom_total(self) -> float:
        """whyrestart_oom_kills_total summed over its series, read from /metrics."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        total = 0.0
        for fam in text_string_to_metric_families(text):
            if fam.name == OOM_METRIC:
                total += sum(s.value for s in fam.samples if s.name.endswith("_total"))
        return total

    def metric(self, name: str) -> dict[str, float]:
        """One metric's samples from /metrics: label values joined by "," -> value."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name:
                    out[",".join(s.labels.values())] = s.value
        return out

    def journal_ooms(self) -> set[int]:
        """The pids of the OOM verdicts in the journal, read as `whyrestart history` reads it."""
        sd = StateDir(str(self.state))
        entries = read_journal(sd.journal_old, sd.journal)
        return {int(e["pid"]) for e in entries if "oom" in str(e.get("cause")) and "pid" in e}

    def wait_incidents_cut(self, cap: float) -> bool:
        """Wait until every incident the journal names has been cut (an incident is cut once
        the stream passes its window's end, 30 s after its last verdict): True if all were.
        A phase timed for its own cost starts after this, not while the agent copies the
        window of an earlier storm out of its segments."""
        sd = StateDir(str(self.state))
        deadline = time.monotonic() + cap
        while True:
            entries = read_journal(sd.journal_old, sd.journal)
            ids = {str(e["incident"]) for e in entries if e.get("incident")}
            if all(sd.incident_path(i) is not None for i in ids):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    def stop(self) -> Result:
        self._stop.set()
        res = stop_tool(self.opts, self.proc)
        res["stderr_tail"] = tail(self.stderr, 400)
        return dict(res)


def _paced(opts: Options, tmp: Path, tool: int | None, name: str) -> Result:
    """The paced clean-exit storm in a fresh child cgroup; the tool's CPU over it."""
    cg = memory_cgroup(f"wr-bench-agent-{os.getpid()}-{name}")
    cg.__enter__()
    try:
        work = StormWork(seconds=opts.agent_paced, batch=10, rate=opts.agent_rate, codes="zero")
        out, err = tmp / f"{name}.out", tmp / f"{name}.err"
        t0, c0 = time.monotonic(), proc_cpu_s(tool) if tool else None
        with open(out, "wb") as fo, open(err, "wb") as fe:
            p = spawn(work.command(opts), stdout=fo, stderr=fe, env={**os.environ, **_procs(cg)})
            rc, ru, killed = reap(p, opts.agent_paced + 120)
        if rc != 0 or killed:
            raise HelperFailed(f"the paced storm failed (rc {rc}): {tail(err)}")
        time.sleep(opts.drain)
        res: Result = {"work": parse_storm(key_values(out.read_text()))}
        res["tool_cpu_pct"] = _cpu_pct(tool, c0, t0) if tool else None
        if ru is not None:
            res["work_cpu_pct"] = (ru.ru_utime + ru.ru_stime) / res["work"]["wall_s"] * 100
        return res
    finally:
        remove_cgroup(cg)


def _one_failure(args: list[str], env: dict[str, str]) -> tuple[int, int | None]:
    """Run wr-fail to its death: (pid, the signal that ended it, None if it exited)."""
    p = spawn(args, env={**os.environ, **env})
    rc, _, _ = reap(p, 120)
    return p.pid, -rc if rc is not None and rc < 0 else None


def _storm(opts: Options, tmp: Path, agent: Agent) -> Result:
    """A mixed-code storm (--agent-storm-rate, vfork children) with fatal signals and OOM
    kills among it; what the workload made. Counted against the agent's segments once it has
    stopped (`_count_storm`)."""
    pid = os.getpid()
    cg = memory_cgroup(f"wr-bench-agent-{pid}-storm")
    oom_cg = memory_cgroup(f"wr-bench-agent-{pid}-oom", opts.agent_oom_limit_mib * MiB)
    cg.__enter__()
    try:
        oom_cg.__enter__()
        try:
            # (vfork: fork(2) alone peaks near 10k exits/s on a 2-vCPU machine)
            work = StormWork(
                seconds=opts.agent_storm, rate=opts.agent_storm_rate, codes="mixed", vfork=True
            )
            out, err = tmp / "storm.out", tmp / "storm.err"
            fatal: list[tuple[int, int | None]] = []
            ooms: list[tuple[int, int | None]] = []
            oom_before = _oom_kills(oom_cg) or 0
            t0, c0 = time.monotonic(), proc_cpu_s(agent.proc.pid)
            with open(out, "wb") as fo, open(err, "wb") as fe:
                p = spawn(
                    work.command(opts), stdout=fo, stderr=fe, env={**os.environ, **_procs(cg)}
                )
                n = opts.agent_fatal + opts.agent_ooms
                for k in range(n):
                    # spread over the storm (the failures run on the storm's CPU, among it)
                    time.sleep(max(0.0, t0 + opts.agent_storm * (k + 0.5) / n - time.monotonic()))
                    if k % (n // max(1, opts.agent_ooms)) == 0 and len(ooms) < opts.agent_ooms:
                        ooms.append(_one_failure(opts.pinned([str(FAIL), "oom"]), _procs(oom_cg)))
                    else:
                        sig = signal.SIGKILL if k % 2 else signal.SIGTERM
                        fatal.append(
                            _one_failure(opts.pinned([str(FAIL), "sig", str(int(sig))]), {})
                        )
                rc, _, killed = reap(p, opts.agent_storm + 120)
            if rc != 0 or killed:
                raise HelperFailed(f"the storm failed (rc {rc}): {tail(err)}")
            time.sleep(opts.drain)
            res: Result = {"work": parse_storm(key_values(out.read_text()))}
            res["agent_cpu_pct"] = _cpu_pct(agent.proc.pid, c0, t0)
            res["oom_kills_cgroup"] = (_oom_kills(oom_cg) or 0) - oom_before
        finally:
            remove_cgroup(oom_cg)
    finally:
        remove_cgroup(cg)
    exits = res["work"]["exits"]
    res["nonzero_made"] = exits - (exits + 255) // 256  # child i exits i & 0xff
    res["fatal_pids"] = [p for p, s in fatal if s in (signal.SIGKILL, signal.SIGTERM)]
    res["oom_pids"] = [p for p, s in ooms if s == signal.SIGKILL]
    res["fatal_made"] = len(res["fatal_pids"])
    res["oom_made"] = len(res["oom_pids"])
    return res


def _count_storm(state: Path, storm: Result) -> None:
    """What the agent's segments hold of the storm's failures (read after it stopped)."""
    spid = storm["work"]["pid"]
    fatal, ooms = set(storm["fatal_pids"]), set(storm["oom_pids"])
    nonzero = fatal_seen = lost = 0
    oom_seen: set[int] = set()
    files = sorted((state / "segments").iterdir())
    for path in files:
        with TraceReader(str(path)) as reader:
            for ev in reader:
                if isinstance(ev, Exit):
                    if ev.comm == STORM_COMM and ev.ppid == spid and ev.status != 0:
                        nonzero += 1
                    elif ev.pid in fatal and ev.status & 0x7F:
                        fatal_seen += 1
                elif isinstance(ev, OomKill) and ev.victim_pid in ooms:
                    oom_seen.add(ev.victim_pid)
                elif isinstance(ev, Lost):
                    lost += ev.count
    storm.update(
        segments=len(files),
        nonzero_seen=nonzero,
        fatal_seen=fatal_seen,
        oom_seen=len(oom_seen),
        lost=lost,
    )


def _latency(opts: Options, agent: Agent) -> Result:
    """OOM kills one at a time: from the reaping of the victim to its count on /metrics and to
    its verdict in the journal."""
    metric_s: list[float] = []
    history_s: list[float] = []
    missing = foreign = 0
    for k in range(opts.agent_kills):
        cg = memory_cgroup(f"wr-bench-agent-{os.getpid()}-kill{k}", opts.agent_oom_limit_mib * MiB)
        cg.__enter__()
        try:
            before, seen_before = agent.oom_total(), agent.journal_ooms()
            pid, sig = _one_failure(opts.pinned([str(FAIL), "oom"]), _procs(cg))
            t0 = time.monotonic()
            if sig != signal.SIGKILL:
                raise HelperFailed(f"wr-fail oom was not OOM-killed (signal {sig})")
            m = h = None
            while (m is None or h is None) and time.monotonic() - t0 < KILL_WAIT_S:
                if m is None and agent.oom_total() > before:
                    m = time.monotonic() - t0
                if h is None and pid in agent.journal_ooms():
                    h = time.monotonic() - t0
                time.sleep(POLL_S)
            theirs = bool(agent.journal_ooms() - seen_before - {pid})
            if theirs:
                # someone else's OOM kill on this shared host: the counter (a sum over the
                # host) may have risen for it, so this kill's metric reading is left out
                foreign += 1
                m = None
        finally:
            remove_cgroup(cg)
        if h is None or (m is None and not theirs):
            missing += 1
        if m is not None:
            metric_s.append(m)
        if h is not None:
            history_s.append(h)
    return {
        "kills": opts.agent_kills,
        "missing": missing,
        "foreign": foreign,
        "metric_s": metric_s,
        "history_s": history_s,
        "metric": _pcts(metric_s),
        "history": _pcts(history_s),
    }


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: int(v - before.get(k, 0)) for k, v in after.items() if v > before.get(k, 0)}


def _noisy(opts: Options, tmp: Path, agent: Agent) -> Result:
    """The agent beside a busy Go program (--agent-goroutines spinning goroutines: its runtime
    preempts them with SIGURG) and a 100 Hz SIGPROF profiler, both on the storm CPU for
    --agent-noisy seconds, with --agent-noisy-failures OOM kills and fatal-signal deaths paced
    over it: the agent's CPU, its lost records, the signals it counted instead of recording,
    and the failures judged (OOM kills in the journal here; the deaths from the segments once
    the agent stopped, `_count_noisy`)."""
    why = build_gobusy()
    if why is not None:
        return {"skipped": why}
    cg = memory_cgroup(f"wr-bench-agent-{os.getpid()}-noisy", opts.agent_oom_limit_mib * MiB)
    cg.__enter__()
    try:
        secs = opts.agent_noisy
        lost0, counted0 = agent.metric(LOST_METRIC), agent.metric(UNRECORDED_METRIC)
        go_out, prof_out = tmp / "gobusy.out", tmp / "sigprof.out"
        t0, c0 = time.monotonic(), proc_cpu_s(agent.proc.pid)
        with open(go_out, "wb") as fg, open(prof_out, "wb") as fp:
            go = spawn(
                opts.pinned([str(GOBUSY), f"{secs:g}", str(opts.agent_goroutines)]),
                stdout=fg,
                # (pinned to one CPU, Go would run one P: a service on an 8-core node runs 8)
                env={**os.environ, "GOMAXPROCS": str(GO_MAXPROCS)},
            )
            prof = spawn(opts.pinned([str(SIGPROF), f"{secs:g}", "100"]), stdout=fp)
            ooms: list[tuple[int, int | None]] = []
            fatal: list[tuple[int, int | None]] = []
            n = opts.agent_noisy_failures
            for k in range(n):
                time.sleep(max(0.0, t0 + secs * (k + 0.5) / n - time.monotonic()))
                if k % 2 == 0:
                    ooms.append(_one_failure(opts.pinned([str(FAIL), "oom"]), _procs(cg)))
                else:
                    sig = str(int(signal.SIGTERM))
                    fatal.append(_one_failure(opts.pinned([str(FAIL), "sig", sig]), {}))
            for p, what in ((go, "wr-gobusy"), (prof, "wr-sigprof")):
                rc, _, killed = reap(p, secs + 120)
                if rc != 0 or killed:
                    raise HelperFailed(f"{what} failed (rc {rc})")
        cpu = _cpu_pct(agent.proc.pid, c0, t0)
        oom_pids = [p for p, s in ooms if s == signal.SIGKILL]
        deadline = time.monotonic() + KILL_WAIT_S
        while not set(oom_pids) <= agent.journal_ooms() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        # (the agent reads the kernel's signal counts every 5 s of housekeeping)
        time.sleep(max(opts.drain, 5.5))
        res: Result = {
            "seconds": secs,
            "agent_cpu_pct": cpu,
            "go": key_values(go_out.read_text()),
            "prof": key_values(prof_out.read_text()),
            "lost": sum(_delta(agent.metric(LOST_METRIC), lost0).values()),
            "counted": _delta(agent.metric(UNRECORDED_METRIC), counted0),
            "oom_pids": oom_pids,
            "oom_judged": len(set(oom_pids) & agent.journal_ooms()),
            "fatal_pids": [p for p, s in fatal if s == signal.SIGTERM],
        }
    finally:
        remove_cgroup(cg)
    return res


def _count_noisy(state: Path, noisy: Result) -> None:
    """What the agent's segments hold of the noisy phase: the fatal deaths' exit records, and
    any signal record of the Go program or the profiler (the kernel counts those)."""
    fatal = set(noisy["fatal_pids"])
    noise = {int(noisy["go"].get("pid", -1)), int(noisy["prof"].get("pid", -1))}
    seen = records = 0
    for path in sorted((state / "segments").iterdir()):
        with TraceReader(str(path)) as reader:
            for ev in reader:
                if isinstance(ev, Exit) and ev.pid in fatal and ev.status & 0x7F:
                    seen += 1
                elif isinstance(ev, Signal) and ev.target_pid in noise:
                    records += 1
    noisy.update(fatal_seen=seen, noise_records=records)


def _pcts(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p99": None, "max": None}
    ys = sorted(xs)
    return {
        "p50": statistics.median(ys),
        "p99": ys[min(len(ys) - 1, int(0.99 * len(ys)))],
        "max": ys[-1],
    }


def _soak(opts: Options, tmp: Path, agent: Agent) -> Result:
    """A paced mixed-code storm for --agent-soak seconds; the agent's RSS over it."""
    cg = memory_cgroup(f"wr-bench-agent-{os.getpid()}-soak")
    cg.__enter__()
    try:
        t_start = time.monotonic() - agent._t0
        work = StormWork(seconds=opts.agent_soak, batch=10, rate=opts.agent_soak_rate)
        out, err = tmp / "soak.out", tmp / "soak.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            p = spawn(work.command(opts), stdout=fo, stderr=fe, env={**os.environ, **_procs(cg)})
            rc, _, killed = reap(p, opts.agent_soak + 120)
        if rc != 0 or killed:
            raise HelperFailed(f"the soak storm failed (rc {rc}): {tail(err)}")
        time.sleep(max(opts.drain, 1.1))  # one more RSS sample after the storm
    finally:
        remove_cgroup(cg)
    rss = [(t, kb / 1024) for t, kb in agent.samples if kb and t >= t_start]
    if not rss:
        raise HelperFailed("no RSS sample during the soak")
    return {"work": parse_storm(key_values(out.read_text())), **rss_growth(rss)}


def _crowd(opts: Options, agent: Agent) -> Result:
    """The agent's CPU at idle on a node full of containers: --agent-cgroups child memory
    cgroups (1 GiB limit each), each with a process that joins it and execs ``sleep``, as runc
    starts a container's entrypoint. The agent names and samples every one of them (each
    with its ancestors, once a second): the cost that grows with the node."""
    pid = os.getpid()
    cgs = [
        memory_cgroup(f"wr-bench-agent-{pid}-crowd{k}", 1 << 30) for k in range(opts.agent_cgroups)
    ]
    procs: list[Popen] = []
    try:
        for cg in cgs:
            cg.__enter__()
            join = os.path.join(cg.abs_path, "cgroup.procs")
            procs.append(spawn(["sh", "-c", 'echo $$ > "$1" && exec sleep 3600', "sh", join]))
        time.sleep(CROWD_SETTLE_S)  # named, sampled, and past the first samples
        res: Result = {
            "cgroups": len(cgs),
            "running": sum(p.poll() is None for p in procs),
            "idle_cpu_pct": _idle_cpu(agent.proc.pid, opts.agent_idle),
        }
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                p.kill()
            with contextlib.suppress(subprocess.SubprocessError):
                p.wait(10)
        for cg in cgs:
            remove_cgroup(cg)
    return res


def _exitsnoop_phase(opts: Options, tmp: Path) -> Result:
    v = Exitsnoop(opts, "storm")
    d = tmp / "exitsnoop"
    d.mkdir()
    res: Result = {}
    st = start_tool(opts, v, d)
    if st.tool.poll() is not None or st.visible is None:
        raise HelperFailed(f"exitsnoop did not start: {tail(d / 'tool.stderr')}")
    res["idle_cpu_pct"] = _idle_cpu(st.tool.pid, opts.agent_idle)
    res["paced"] = _paced(opts, d, st.tool.pid, "paced")
    res["vmhwm_kb"] = proc_status_kb(st.tool.pid, "VmHWM")
    res.update(stop_tool(opts, st.tool))
    return res


def _agent_phase(opts: Options, tmp: Path) -> Result:
    d = tmp / "agent"
    d.mkdir()
    agent = Agent(opts, d)
    res: Result = {}
    try:
        res["ready_s"] = agent.wait_ready(max(opts.startup_cap, 60.0))
        time.sleep(opts.settle)
        disk0, t0 = _dir_bytes(agent.state), time.monotonic()
        res["idle_cpu_pct"] = _idle_cpu(agent.proc.pid, opts.agent_idle)
        grew = _dir_bytes(agent.state) - disk0
        res["idle_disk_bytes"] = grew
        res["idle_disk_mib_per_day"] = grew / (time.monotonic() - t0) * 86400 / MiB
        res["paced"] = _paced(opts, d, agent.proc.pid, "paced")
        if opts.agent_cgroups:
            say(f"agent: idle with {opts.agent_cgroups} containers' cgroups")
            res["crowd"] = _crowd(opts, agent)
        say("agent: storm with failures")
        res["storm"] = _storm(opts, d, agent)
        say(f"agent: {opts.agent_kills} OOM kills, timed to /metrics and history")
        res["latency"] = _latency(opts, agent)
        say(f"agent: beside a busy Go program and a 100 Hz profiler, {opts.agent_noisy:g} s")
        # (the storm's and the kills' incident is cut 30 s after the last kill: not in here)
        cut = agent.wait_incidents_cut(INCIDENT_WAIT_S)
        res["noisy"] = {**_noisy(opts, d, agent), "earlier_incidents_cut": cut}
        if opts.agent_containers:
            say(f"agent: {opts.agent_containers} container starts of an image with a libcuda")
            try:  # (not _guard: its kill_all would end the agent too)
                res["containers"] = agent_containers.run(opts.agent_containers, d, agent.proc.pid)
            except Exception as exc:
                say(f"agent section, containers: FAILED {exc!r}"[:300])
                res["containers"] = {"starts": opts.agent_containers, "error": repr(exc)}
        say(f"agent: RSS soak, {opts.agent_soak:g} s")
        res["soak"] = _soak(opts, d, agent)
        res["vmhwm_kb"] = proc_status_kb(agent.proc.pid, "VmHWM")
    finally:
        res.update(agent.stop())
        res["rss_samples"] = agent.samples
    if "storm" in res:
        _count_storm(agent.state, res["storm"])
    if "fatal_pids" in res.get("noisy", {}):
        _count_noisy(agent.state, res["noisy"])
    if "fds_last" in res.get("containers", {}):
        agent_containers.count(agent.state, res["containers"])
    return res


def _guard(what: str, fn: Any, *args: Any) -> Result:
    try:
        r: Result = fn(*args)
        return r
    except Exception as exc:
        say(f"agent section, {what}: FAILED {exc!r}"[:300])
        return {"error": repr(exc)}
    finally:
        kill_all()


def run(opts: Options, tmp: Path, ctx: Context) -> Section:
    v, es = Whyrestart(opts, "agent"), Exitsnoop(opts, "storm")
    for name, missing in (("whyrestart", v.missing()), ("exitsnoop", es.missing())):
        if missing:
            return Section(f"## Agent\n\n{name} {missing}\n", {"skipped": {name: missing}})
    ctx.versions.setdefault("whyrestart", v.version())
    ctx.versions.setdefault("exitsnoop", es.version())
    base = tmp / "agent-section"
    base.mkdir()
    load = {"before": loadavg()}
    say("agent: bare paced storm")
    bare = _guard("bare", lambda: _paced(opts, base, None, "bare"))
    say("agent: exitsnoop, idle then paced")
    snoop = _guard("exitsnoop", _exitsnoop_phase, opts, base)
    say("agent: whyrestart agent")
    agent = _guard("agent", _agent_phase, opts, base)
    load["after"] = loadavg()
    if not opts.keep_tmp:
        shutil.rmtree(base, ignore_errors=True)
    data = {"bare": bare, "exitsnoop": snoop, "agent": agent, "loadavg": load}
    return Section(_report(opts, bare, snoop, agent, load), data)


# -- the report -------------------------------------------------------------------------------


def _f(x: Any, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def _ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def _pace(rate: float) -> str:
    return f"paced at {rate:,.0f} exits/s" if rate else "unpaced"


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def _noisy_table(opts: Options, nz: Result, idle: float | None) -> list[str]:
    out = [
        "",
        f"## Agent beside a busy Go program ({opts.agent_goroutines} goroutines) and a 100 Hz "
        f"SIGPROF profiler ({opts.agent_noisy:g} s, {opts.agent_noisy_failures} failures paced)",
        "",
        "| SIGURG counted | SIGPROF counted | their signal records | lost | OOM kills judged "
        "| fatal deaths seen | agent CPU % of a core | at idle, same run "
        "| <= 0.5%, none lost, all judged? |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    if "fatal_seen" not in nz:
        why = nz.get("skipped") or nz.get("error") or "not run"
        return [*out, f"| {why} |" + " |" * 8]
    counted = nz["counted"]
    cpu = nz.get("agent_cpu_pct")
    if not nz.get("earlier_incidents_cut", True):
        out.insert(2, f"(the earlier phases' incidents were not all cut in {INCIDENT_WAIT_S:g} s)")
    ok = (
        cpu is not None
        and cpu <= NOISY_TARGET_CPU_PCT
        and nz["lost"] == 0
        and nz["oom_judged"] == len(nz["oom_pids"])
        and nz["fatal_seen"] == len(nz["fatal_pids"])
    )
    out.append(
        f"| {counted.get('SIGURG', 0):,} | {counted.get('SIGPROF', 0):,} "
        f"| {nz['noise_records']:,} | {nz['lost']:,} | {nz['oom_judged']}/{len(nz['oom_pids'])} "
        f"| {nz['fatal_seen']}/{len(nz['fatal_pids'])} | {_f(cpu)} | {_f(idle)} | {_yes(ok)} |"
    )
    return out


def _report(opts: Options, bare: Result, snoop: Result, agent: Result, load: Result) -> str:
    out: list[str] = []
    failed = {
        k: r["error"][:300] for k, r in (("bare", bare), ("exitsnoop", snoop)) if "error" in r
    }
    if "error" in agent:
        failed["agent"] = agent["error"][:300]
    ap, sp, bp = agent.get("paced", {}), snoop.get("paced", {}), bare
    out += [
        f"## Agent: CPU at idle and at {opts.agent_rate:,.0f} clean exits/s "
        f"({opts.agent_idle:g} s idle, {opts.agent_paced:g} s paced)",
        "",
        "| variant | idle CPU % of a core | paced: exits/s | paced: tool CPU % "
        "| paced: workload CPU % | tool CPU vs exitsnoop |",
        "|---|---:|---:|---:|---:|---:|",
        f"| bare | n/a | {_f(bp.get('work', {}).get('per_s'), ',.0f')} | n/a "
        f"| {_f(bp.get('work_cpu_pct'))} | n/a |",
        f"| exitsnoop | {_f(snoop.get('idle_cpu_pct'))} "
        f"| {_f(sp.get('work', {}).get('per_s'), ',.0f')} | {_f(sp.get('tool_cpu_pct'))} "
        f"| {_f(sp.get('work_cpu_pct'))} | 1.00x |",
        f"| whyrestart agent | {_f(agent.get('idle_cpu_pct'))} "
        f"| {_f(ap.get('work', {}).get('per_s'), ',.0f')} | {_f(ap.get('tool_cpu_pct'))} "
        f"| {_f(ap.get('work_cpu_pct'))} "
        f"| {_ratio(ap.get('tool_cpu_pct'), sp.get('tool_cpu_pct'))} |",
    ]
    crowd = agent.get("crowd")
    if crowd:
        out.append(
            f"| whyrestart agent, {crowd['running']} of {crowd['cgroups']} containers' cgroups "
            f"idle | {_f(crowd.get('idle_cpu_pct'))} | n/a | n/a | n/a | n/a |"
        )
    out.append("")
    for k, e in failed.items():
        out.append(f"{k}: failed: {e}")
    idle, paced = agent.get("idle_cpu_pct"), ap.get("tool_cpu_pct")
    out += [
        f"Targets: agent idle <= 0.3% of a core: {_yes(idle is not None and idle <= 0.3)}; "
        f"at {opts.agent_rate:,.0f} clean exits/s <= 1%: "
        f"{_yes(paced is not None and paced <= 1.0)}. Load average before/after the section: "
        f"{load['before']} / {load['after']} (2 cores shared: read the ratios).",
        "",
    ]
    st = agent.get("storm", {})
    sw = st.get("work", {})
    out += [
        f"## Agent: storm with failures ({opts.agent_storm:g} s, {_pace(opts.agent_storm_rate)}, "
        "children by vfork)",
        "",
        "| exits/s | non-zero exits made | seen | fatal signals made | seen | OOM kills made "
        "| seen | lost records (host, agent's whole run) | agent CPU % | none lost? |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    if "nonzero_seen" in st:
        none_lost = (
            st["nonzero_seen"] == st["nonzero_made"]
            and st["fatal_seen"] == st["fatal_made"]
            and st["oom_seen"] == st["oom_made"]
        )
        out.append(
            f"| {sw['per_s']:,.0f} | {st['nonzero_made']:,} | {st['nonzero_seen']:,} "
            f"| {st['fatal_made']} | {st['fatal_seen']} | {st['oom_made']} | {st['oom_seen']} "
            f"| {st['lost']:,} | {_f(st.get('agent_cpu_pct'), '.1f')} | {_yes(none_lost)} |"
        )
    else:
        out.append("| failed |" + " |" * 9)
    lat = agent.get("latency", {})
    out += [
        "",
        f"## Agent: OOM kill -> /metrics and -> history ({opts.agent_kills} kills)",
        "",
        "| where | found | p50 s | p99 s | max s | p99 <= 1 s? |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for key, label in (("metric", "whyrestart_oom_kills_total"), ("history", "history journal")):
        if key not in lat:
            out.append(f"| {label} | failed |" + " |" * 4)
            continue
        p = lat[key]
        out.append(
            f"| {label} | {len(lat[key + '_s'])}/{lat['kills']} | {_f(p['p50'], '.3f')} "
            f"| {_f(p['p99'], '.3f')} | {_f(p['max'], '.3f')} "
            f"| {_yes(p['p99'] is not None and p['p99'] <= 1.0 and not lat['missing'])} |"
        )
    out += _noisy_table(opts, agent.get("noisy", {}), agent.get("idle_cpu_pct"))
    if "containers" in agent:
        out += [
            "",
            "## Agent: container starts of an image carrying a libcuda",
            "",
            "| phase | measured | exitsnoop | target |",
            "|---|---|---|---|",
            agent_containers.row(agent["containers"]),
        ]
    so = agent.get("soak", {})
    out += [
        "",
        f"## Agent: RSS soak ({opts.agent_soak:g} s at {opts.agent_soak_rate:,.0f} exits/s, "
        "mixed codes) and idle disk",
        "",
        "| RSS first MB | RSS at 25% MB | RSS last MB | RSS max MB | slope 2nd half MB/min "
        "| flat? | <= 60 MB? | idle disk MB/day | <= 50 MB/day? | exitsnoop max RSS MB |",
        "|---:|---:|---:|---:|---:|---|---|---:|---|---:|",
    ]
    if "rss_max_mib" in so:
        disk = agent.get("idle_disk_mib_per_day")
        hwm = snoop.get("vmhwm_kb")
        hwm_mib = hwm / 1024 if hwm else None
        out.append(
            f"| {so['rss_first_mib']:.1f} | {so['rss_25pct_mib']:.1f} "
            f"| {so['rss_last_mib']:.1f} | {so['rss_max_mib']:.1f} "
            f"| {so['slope_second_half_mib_per_min']:+.2f} | {_yes(so['flat'])} "
            f"| {_yes(so['rss_max_mib'] <= 60)} | {_f(disk, '.1f')} "
            f"| {_yes(disk is not None and disk <= 50)} | {_f(hwm_mib, '.1f')} |"
        )
    else:
        out.append("| failed |" + " |" * 9)
    out += method_lines(
        [
            "Each tool pinned to CPU {tool_cpu}, the workloads to CPU {storm_cpu}; the tools run "
            "one at a time: bare, exitsnoop (libbpf-tools, printing every exit to a file; "
            "attached once a marker child shows in its output), then `whyrestart agent` (a "
            "fresh state dir, --log-format none, metrics on a free port; ready once it says "
            "so). **CPU % of a core**: the tool's utime+stime from /proc/PID/stat over the "
            "window. **idle**: {agent_idle:g} s with no workload of ours (the machine's other "
            "users still fork and exit: the ratio to exitsnoop is the number to read). "
            "**containers' cgroups idle**: after the paced run, {agent_cgroups} child memory "
            "cgroups (1 GiB limit each), each with a `sleep` that joined it and exec'd (as "
            "runc starts an entrypoint), which the agent names and samples once a second; its "
            "CPU over {agent_idle:g} s from {crowd_settle:g} s after they started. "
            "**paced**: build/bench/wr-storm, children exiting 0 in batches of 10 on an "
            "absolute schedule at {agent_rate:,.0f}/s for {agent_paced:g} s, inside a child "
            "memory cgroup "
            "made for it (so the agent's kernel filter counts the exits instead of sending "
            "them), tool CPU over the storm plus {drain:g} s of drain; **workload CPU**: the "
            "storm's own and its children's (wait4). **storm**: wr-storm {storm_pace} for "
            "{agent_storm:g} "
            "s in a child cgroup, its children made with vfork(2) (fork(2) alone peaks near "
            "10k exits/s on 2 vCPUs), child i exiting i & 0xff (non-zero made = exits less "
            "those with i % 256 == 0), with {agent_fatal} processes ending by SIGTERM/SIGKILL sent "
            "to themselves and {agent_ooms} OOM kills (build/bench/wr-fail in a child memory "
            "cgroup "
            "limited to {agent_oom_limit_mib} MiB, the kills confirmed by the cgroup's oom_kill "
            "counter) "
            "spread over it on the storm CPU; **seen**: read back from the agent's segments "
            "with TraceReader after it stopped (exit records of the storm's children with a "
            "non-zero status, of the fatal pids by a signal; OOM records of the victims; "
            "**lost records**: all the Lost records of the agent's run, the host's events "
            "included). "
            "**kill latency**: {agent_kills} OOM kills one at a time, each in a fresh cgroup "
            "limited to {agent_oom_limit_mib} MiB; from the bench's reaping of the victim to "
            "whyrestart_oom_kills_total rising on /metrics, and to the victim's verdict in the "
            "journal as `whyrestart history` reads it (tracer.agent.journal.read_journal), "
            "polled every {poll:g} ms (a kill during which another OOM verdict of the host "
            "reached the journal is left out of the /metrics column: the counter is a sum over "
            "the host). **beside Go and a profiler**: build/bench/wr-gobusy (bench/go, "
            "Debian's golang; {agent_goroutines} goroutines spinning without a call in the "
            "inner loop, GOMAXPROCS={go_maxprocs}, so the runtime preempts them with SIGURG) "
            "and build/bench/wr-sigprof "
            "(setitimer(ITIMER_PROF) at 100 Hz, a counting handler, spinning) on the storm CPU "
            "for {agent_noisy:g} s, with {agent_noisy_failures} failures paced evenly over it, "
            "alternately an OOM kill (wr-fail oom in a cgroup limited to "
            "{agent_oom_limit_mib} MiB) and a death by a self-sent SIGTERM; **counted**: the "
            "rise of whyrestart_signals_unrecorded_total{{signal}} over the phase (the host's "
            "other processes' signals included); **their signal records**: signal records "
            "aimed at the two programs in the agent's segments; **lost**: the rise of "
            "whyrestart_events_lost_total; **judged**: OOM victims in the journal, deaths as "
            "exit records in the segments; **agent CPU**: over the phase, which starts once the "
            "earlier phases' incidents have been cut (their cut, a copy of the storm's window "
            "out of the segments, is the agent's work for those phases; its own incident is "
            "cut 30 s after its last failure, after the phase). "
            "**soak**: VmRSS every second while wr-storm runs paced "
            "at {agent_soak_rate:,.0f} exits/s with mixed codes for {agent_soak:g} s "
            "(--agent-soak 1800 is "
            "the issue's 30 minutes); flat = |growth from 25%| <= 2 MB and |slope| <= 1 "
            "MB/min. **idle disk**: the state dir's allocated bytes over the idle window, "
            "times a day (the segment ring's --retain caps it in practice).",
        ],
        opts,
        poll=POLL_S * 1000,
        crowd_settle=CROWD_SETTLE_S,
        storm_pace=_pace(opts.agent_storm_rate),
        go_maxprocs=GO_MAXPROCS,
    )
    return "\n".join(out) + "\n"
