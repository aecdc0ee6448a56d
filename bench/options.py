"""The bench's command line (`Options`, `parse_args`) and the names every module shares."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20

SECTIONS = (
    "storm",
    "signals",
    "reclaim",
    "overflow",
    "decode",
    "replay",
    "soak",
    "gpuhold",
    "agent",
    "eta",
    "llm",
)
SECTION_VARIANTS = {
    "storm": ("bare", "whyrestart", "bpftrace", "exitsnoop"),
    "signals": ("bare", "whyrestart", "bpftrace", "sigsnoop"),
    "reclaim": ("bare", "whyrestart", "bpftrace"),
}
TOOLS = ("bare", "whyrestart", "bpftrace", "exitsnoop", "sigsnoop")
WHYRESTART_ONLY = (
    "overflow",
    "soak",
    "gpuhold",
    "agent",
    "eta",
    "llm",
)  # sections that measure whyrestart alone (llm: against bare only)


@dataclass
class Options:
    """What `parse_args` returns: every option, typed (argparse's own namespace is not)."""

    sections: list[str] = field(default_factory=lambda: list(SECTIONS))
    rounds: int = 3
    seconds: float = 5.0
    only: list[str] | None = None
    quick: bool = False
    json_path: str | None = None
    batch: int = 64
    tool_cpu: int = 0
    storm_cpu: int = 1
    settle: float = 0.5
    drain: float = 1.0
    marker_ms: int = 10
    startup_cap: float = 15.0
    stop_timeout: float = 120.0
    whyrestart: str | None = None
    bpf_stats: bool = False
    sig_rate: float = 50000.0
    reclaim_limit_mib: int = 64
    reclaim_file_mib: int = 256
    reclaim_dir: str = "/var/tmp"
    overflow_seconds: float = 12.0
    overflow_at: float = 1.0
    overflow_stop: float = 8.0
    decode_records: int = 500_000
    decode_repeat: int = 5
    replay_events: int = 1_000_000
    soak_seconds: float = 600.0
    soak_exits: str = "mixed"
    soak_rate: float = 1000.0
    gpuhold_runs: int = 20
    gpuhold_storm: int = 200
    agent_idle: float = 60.0
    agent_paced: float = 10.0
    agent_rate: float = 1000.0
    agent_storm: float = 10.0
    agent_storm_rate: float = 12_000.0  # the issue asks for >= 10k exits/s; 0: unpaced
    agent_fatal: int = 20
    agent_ooms: int = 5
    agent_cgroups: int = 100  # kubelet's default --max-pods is 110
    agent_kills: int = 50
    agent_oom_limit_mib: int = 16
    agent_soak: float = 180.0
    agent_soak_rate: float = 200.0
    agent_noisy: float = 20.0
    agent_goroutines: int = 64
    agent_noisy_failures: int = 10
    agent_containers: int = 200
    llm_requests: int = 16
    llm_tokens: int = 32
    llm_threads: int = 1
    llm_ctx: int = 1024
    keep_tmp: bool = False

    def pinned(self, cmd: list[str]) -> list[str]:
        """cmd pinned to the workload CPU."""
        return ["taskset", "-c", str(self.storm_cpu), *cmd]

    def whyrestart_exe(self) -> str:
        return self.whyrestart or str(ROOT / ".venv" / "bin" / "whyrestart")


# Each section's own options: (field of Options, help). The flag is the field's name with
# dashes, its type and default are the field's.
SECTION_OPTIONS: tuple[tuple[str, str], ...] = (
    ("sig_rate", "signals: paced rate for the sustained run, /s (50000; 0: skip it)"),
    ("reclaim_limit_mib", "reclaim: cgroup limit, MiB (64)"),
    ("reclaim_file_mib", "reclaim: file size, MiB (256)"),
    ("reclaim_dir", "reclaim: where the file goes, on disk (/var/tmp)"),
    ("overflow_seconds", "overflow: storm length, s (12)"),
    ("overflow_at", "overflow: SIGSTOP this far in, s (1)"),
    ("overflow_stop", "overflow: SIGSTOP for this long, s (8)"),
    ("decode_records", "decode: records (500000)"),
    ("decode_repeat", "decode: repetitions (5)"),
    ("replay_events", "replay: trace events (1000000)"),
    ("soak_seconds", "soak: length, s (600: the full soak)"),
    (
        "soak_exits",
        "soak: which storms, comma-separated: mixed (exit codes i & 0xff, failures whose "
        "verdicts are kept: the heavier) and/or zero (clean exits) (mixed)",
    ),
    ("soak_rate", "soak: exits/s (1000)"),
    ("gpuhold_runs", "gpuhold: recordings of one program failing at once (20)"),
    ("gpuhold_storm", "gpuhold: programs in the fork storm (200)"),
    ("agent_idle", "agent: idle window, s (60)"),
    ("agent_paced", "agent: paced run length, s (10)"),
    ("agent_rate", "agent: paced clean exits/s in a child cgroup (1000)"),
    ("agent_storm", "agent: length of the storm mixed with failures, s (10)"),
    (
        "agent_storm_rate",
        "agent: exits/s of that storm, children by vfork (12000; 0: as fast as it goes)",
    ),
    ("agent_fatal", "agent: processes killed by a fatal signal during the storm (20)"),
    ("agent_ooms", "agent: cgroup OOM kills during the storm (5)"),
    ("agent_cgroups", "agent: idle containers' cgroups, each sampled, for the crowded idle (100)"),
    ("agent_kills", "agent: OOM kills timed to /metrics and history (50)"),
    ("agent_oom_limit_mib", "agent: memory limit of the OOM kills' cgroup, MiB (16)"),
    ("agent_soak", "agent: RSS soak length, s (180; the issue's full soak: 1800)"),
    (
        "agent_soak_rate",
        "agent: paced exits/s during the soak, mixed codes in a child cgroup (200)",
    ),
    ("agent_noisy", "agent: length of the phase beside a busy Go program and a profiler, s (20)"),
    ("agent_goroutines", "agent: spinning goroutines of that Go program (64)"),
    (
        "agent_containers",
        "agent: podman starts of an image carrying a libcuda, for the agent's fds (200; 0: none)",
    ),
    (
        "agent_noisy_failures",
        "agent: OOM kills and fatal-signal deaths paced over that phase, half each (10)",
    ),
    ("llm_requests", "llm: measured /completion requests per run, over the fixed prompt set (16)"),
    ("llm_tokens", "llm: tokens each request generates (32)"),
    ("llm_threads", "llm: llama-server's -t, on the workload CPU (1)"),
    ("llm_ctx", "llm: llama-server's -c, its context (1024)"),
)


def _parser() -> argparse.ArgumentParser:
    d = Options()
    ap = argparse.ArgumentParser(
        prog="scripts/bench",
        description="whyrestart's cost against its peers, its throughput and its losses; "
        "markdown on stdout, progress on stderr.",
        epilog="Sections: " + ", ".join(SECTIONS) + " (default: all, in that order).",
    )
    ap.add_argument("sections", nargs="*", metavar="SECTION", help="sections to run (default: all)")
    ap.add_argument(
        "--rounds", type=int, default=d.rounds, help="round-robin rounds per tool section (3)"
    )
    ap.add_argument(
        "--seconds", type=float, default=d.seconds, help="workload length per run (default 5)"
    )
    ap.add_argument(
        "--only",
        default=None,
        help=f"comma-separated tools to run, from {','.join(TOOLS)} "
        "(keep bare for the slowdown column)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 1 round of 1 s, small decode/replay sizes, short overflow and soak "
        "(what tests/test_bench_root.py runs)",
    )
    ap.add_argument("--json", dest="json_path", default=None, help="write raw per-run numbers here")
    ap.add_argument(
        "--batch", type=int, default=d.batch, help="children forked per reap batch (64)"
    )
    ap.add_argument("--tool-cpu", type=int, default=d.tool_cpu, help="CPU for the tracer (0)")
    ap.add_argument("--storm-cpu", type=int, default=d.storm_cpu, help="CPU for the workloads (1)")
    ap.add_argument(
        "--settle", type=float, default=d.settle, help="pause before the workload, s (0.5)"
    )
    ap.add_argument(
        "--drain",
        type=float,
        default=d.drain,
        help="pause after the workload before reading CPU/RSS and stopping, s (1.0)",
    )
    ap.add_argument("--marker-ms", type=int, default=d.marker_ms, help="marker interval, ms (10)")
    ap.add_argument(
        "--startup-cap",
        type=float,
        default=d.startup_cap,
        help="longest wait for a marker to show in the output, s (15)",
    )
    ap.add_argument(
        "--stop-timeout",
        type=float,
        default=d.stop_timeout,
        help="SIGKILL a tool that has not exited this long after SIGINT (120)",
    )
    ap.add_argument(
        "--whyrestart", default=None, help="whyrestart executable (default .venv/bin/whyrestart)"
    )
    ap.add_argument(
        "--bpf-stats",
        action="store_true",
        help="enable kernel.bpf_stats_enabled during the runs and report in-kernel "
        "BPF time per exit in the storm section (perturbs a little)",
    )
    g = ap.add_argument_group("section options")
    for name, text in SECTION_OPTIONS:
        default = getattr(d, name)
        g.add_argument(
            "--" + name.replace("_", "-"), type=type(default), default=default, help=text
        )
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temp dir (its path is shown)")
    return ap


def parse_args(argv: list[str] | None = None) -> Options:
    ap = _parser()
    given = vars(ap.parse_args(argv))
    only: str | None = given.pop("only")
    opts = Options(**given)
    if opts.quick:
        # A smoke run: every section, every variant, one short run each. The numbers mean
        # little; that every section runs and prints its table is what --quick shows.
        opts.rounds, opts.seconds = 1, 1.0
        opts.decode_records, opts.decode_repeat = 50_000, 3
        opts.replay_events = 100_000
        opts.soak_seconds = 5.0
        opts.overflow_seconds, opts.overflow_stop = 7.0, 4.0
        opts.gpuhold_runs, opts.gpuhold_storm = 2, 20
        opts.agent_idle, opts.agent_paced, opts.agent_storm, opts.agent_soak = 2.0, 1.0, 1.0, 5.0
        opts.agent_fatal, opts.agent_ooms, opts.agent_kills = 2, 1, 3
        opts.agent_cgroups = 5
        opts.agent_noisy, opts.agent_noisy_failures = 3.0, 2
        opts.llm_requests, opts.llm_tokens = 3, 8
    if opts.rounds < 1 or opts.seconds <= 0:
        ap.error("--rounds and --seconds must be positive")
    bad = [s for s in opts.sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; known: {', '.join(SECTIONS)}")
    opts.sections = [s for s in SECTIONS if s in opts.sections] or list(SECTIONS)
    if only:
        opts.only = [x.strip() for x in only.split(",") if x.strip()]
        bad = [x for x in opts.only if x not in TOOLS]
        if bad:
            ap.error(f"unknown tool(s) {bad}; known: {', '.join(TOOLS)}")
    if opts.overflow_at + opts.overflow_stop >= opts.overflow_seconds:
        ap.error("--overflow-at + --overflow-stop must end before --overflow-seconds")
    return opts
