"""The workloads a variant is measured under: fork/exit storm, signal storm, reclaim storm.

Each `run` returns a `Work` with "pid" (the workload's own process), "per_s" (its throughput,
what the slowdown compares) and whatever the section's report needs. Memory cgroups made for a
run are the project's `ChildCgroup` (under the bench's own memory cgroup, removed after).
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.helpers import RECLAIM, SIGSTORM, STORM
from bench.options import MiB, Options
from bench.procs import run_helper, say
from bench.records import Work
from tracer.errors import WhyrestartError
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup


def memory_cgroup(name: str, limit_bytes: int | None = None) -> ChildCgroup:
    """A child of the bench's own memory cgroup (enter it with ``with`` or `__enter__`)."""
    return ChildCgroup(own_memory_cgroup(), name, limit_bytes)


def memory_version() -> int | None:
    return CgroupLayout.from_system().memory_version


def read_cgroup_int(cg: ChildCgroup, name: str) -> int | None:
    try:
        return int(Path(cg.abs_path, name).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Workload:
    name = ""
    unit = ""  # of per_s

    def run(self, opts: Options, tmp: Path) -> Work:
        raise NotImplementedError

    def cleanup(self) -> None:
        """After the run, once the tool has stopped and its output is counted."""


class StormWork(Workload):
    name, unit = "storm", "exits/s"

    def __init__(
        self,
        seconds: float | None = None,
        batch: int | None = None,
        rate: float = 0,
        env: dict[str, str] | None = None,
        codes: str = "mixed",
        vfork: bool = False,
    ) -> None:
        self.seconds, self.batch, self.rate, self.env = seconds, batch, rate, env
        self.codes = codes  # "mixed": children exit i & 0xff; "zero": all exit 0
        self.vfork = vfork  # children made with vfork(2): the agent's storm, past 10k exits/s

    def command(self, opts: Options) -> list[str]:
        seconds = self.seconds or opts.seconds
        batch = self.batch or opts.batch
        args = [str(STORM), str(seconds), str(batch), str(self.rate), self.codes]
        return opts.pinned([*args, "vfork"] if self.vfork else args)

    def run(self, opts: Options, tmp: Path) -> Work:
        seconds = self.seconds or opts.seconds
        kv = run_helper(self.command(opts), tmp, "storm", seconds + 120, self.env)
        return parse_storm(kv)


def parse_storm(kv: dict[str, str]) -> Work:
    return {
        "pid": int(kv["pid"]),
        "exits": int(kv["exits"]),
        "wall_s": float(kv["wall_s"]),
        "exits_per_s": float(kv["exits_per_s"]),
        "per_s": float(kv["exits_per_s"]),
        "start_ns": int(kv["start_ns"]),
        "end_ns": int(kv["end_ns"]),
        "bad_status": int(kv["bad_status"]),
        "fork_retries": int(kv["fork_retries"]),
        "codes": kv.get("codes", "mixed"),
        "fork": kv.get("fork", "fork"),
    }


class SigWork(Workload):
    name, unit = "signal storm", "signals/s"

    def __init__(self, rate: float = 0) -> None:
        self.rate = rate

    def run(self, opts: Options, tmp: Path) -> Work:
        cmd = opts.pinned([str(SIGSTORM), str(opts.seconds), str(self.rate)])
        kv = run_helper(cmd, tmp, "sigstorm", opts.seconds + 120)
        return {
            "pid": int(kv["pid"]),
            "child": int(kv["child"]),
            "sent": int(kv["sent"]),
            "acked": int(kv["acked"]),
            "wall_s": float(kv["wall_s"]),
            "per_s": float(kv["signals_per_s"]),
            "cpu_s": float(kv["cpu_s"]),
            "rate": self.rate,
            "start_ns": int(kv["start_ns"]),
            "end_ns": int(kv["end_ns"]),
        }


class ReclaimWork(Workload):
    """wr-reclaim in a fresh child memory cgroup with a limit (removed in cleanup)."""

    name, unit = "reclaim storm", "MiB/s"

    def __init__(self, data: Path) -> None:
        self.data = data
        self.cg: ChildCgroup | None = None

    def run(self, opts: Options, tmp: Path) -> Work:
        name = f"wr-bench-reclaim-{os.getpid()}-{tmp.name}"
        self.cg = cg = memory_cgroup(name, opts.reclaim_limit_mib * MiB)
        cg.__enter__()
        cmd = opts.pinned([str(RECLAIM), str(self.data), str(opts.seconds)])
        procs = os.path.join(cg.abs_path, "cgroup.procs")
        kv = run_helper(cmd, tmp, "reclaim", opts.seconds + 120, {"WR_JOIN_CGROUP": procs})
        v1 = memory_version() == 1
        return {
            "pid": int(kv["pid"]),
            "bytes": int(kv["bytes"]),
            "passes": int(kv["passes"]),
            "wall_s": float(kv["wall_s"]),
            "per_s": float(kv["mib_per_s"]),
            "cpu_s": float(kv["cpu_s"]),
            "cgroup": cg.path,
            "cgroup_id": cg.cgroup_id,
            "failcnt": read_cgroup_int(cg, "memory.failcnt") if v1 else None,
            "max_usage": read_cgroup_int(cg, "memory.max_usage_in_bytes" if v1 else "memory.peak"),
            "start_ns": int(kv["start_ns"]),
            "end_ns": int(kv["end_ns"]),
        }

    def cleanup(self) -> None:
        if self.cg is not None:
            cg, self.cg = self.cg, None
            remove_cgroup(cg)


def remove_cgroup(cg: ChildCgroup) -> None:
    """Leave a cgroup made for a run; one that cannot be removed is said, not raised: the
    numbers of the run are good, and the message names the leftover and how to remove it."""
    try:
        cg.__exit__(None, None, None)
    except WhyrestartError as exc:
        say(f"could not remove cgroup {cg.path}: {exc}")
