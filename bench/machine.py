"""The machine and the run: which code was measured, what else was loaded or running, and
the report's closing "Machine and run" note."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.options import ROOT, Options
from bench.procs import CLK_TCK


def bpf_progs() -> dict[int, dict[str, Any]]:
    """Loaded BPF programs by id (bpftool's JSON), {} when bpftool fails."""
    r = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    if r.returncode != 0:
        return {}
    try:
        return {p["id"]: p for p in json.loads(r.stdout)}
    except ValueError:
        return {}


def code_fingerprint() -> dict[str, Any]:
    """sha256 over the tracer's sources and BPF object, and the newest mtime among them: the
    report says which code it measured, and whether that code changed during the run."""
    h = hashlib.sha256()
    newest = 0.0
    files = sorted(ROOT.glob("tracer/**/*.py")) + sorted(ROOT.glob("bpf/*.bpf.[co]"))
    for f in files:
        with contextlib.suppress(OSError):
            data = f.read_bytes()
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + data)
            newest = max(newest, f.stat().st_mtime)
    return {
        "sha256": h.hexdigest()[:16],
        "files": len(files),
        "newest_mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(newest)),
    }


def machine_note(
    helpers: dict[str, str], foreign_progs: list[str], foreign_procs: list[str]
) -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    virt = ""
    if shutil.which("systemd-detect-virt"):
        virt = subprocess.run(
            ["systemd-detect-virt"], capture_output=True, text=True
        ).stdout.strip()

    def read(p: str) -> str:
        try:
            return Path(p).read_text().strip()
        except OSError:
            return "?"

    return {
        "kernel": platform.release(),
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "mem_gib": round(mem_gib, 1),
        "virt": virt,
        "loadavg_at_start": read("/proc/loadavg"),
        "pid_max": read("/proc/sys/kernel/pid_max"),
        "bpf_jit_enable": read("/proc/sys/net/core/bpf_jit_enable"),
        "helpers": helpers,
        "python": platform.python_version(),
        "foreign_bpf_progs_attached_to_tracepoints": foreign_progs,
        "foreign_tracer_processes": foreign_procs,
    }


def foreign_tracers() -> tuple[list[str], list[str]]:
    """BPF programs already loaded and tracer processes already running when the bench started:
    they run on every exit of every variant, bare included."""
    progs = [
        f"{p.get('name')}({p.get('type')})"
        for p in bpf_progs().values()
        if p.get("type") in ("tracing", "tracepoint", "raw_tracepoint", "kprobe", "perf_event")
    ]
    procs = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if (
            re.search(r"(whyrestart|tracer\.cli) record|\bbpftrace\b|exitsnoop|sigsnoop", cmd)
            and "scripts/bench" not in cmd
        ):
            procs.append(f"{d.name}: {cmd.strip()[:120]}")
    return progs, procs


def cpu_snapshot() -> dict[str, Any]:
    """Machine-wide busy and steal CPU seconds (/proc/stat), the bench's own CPU (itself and
    every descendant it has reaped), and each live user-space process's CPU."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    own = sum(
        ru.ru_utime + ru.ru_stime
        for ru in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )
    procs: dict[int, tuple[str, int, float]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")
        rest = stat.rsplit(b")", 1)[1].split()
        ppid = int(rest[1])
        if ppid == 2 or d == "2":  # kernel threads: mostly working for our own workloads
            continue
        procs[int(d)] = (comm, ppid, (int(rest[11]) + int(rest[12])) / CLK_TCK)
    return {
        "busy_s": (user + nice + system + irq + softirq) / CLK_TCK,
        "steal_s": steal / CLK_TCK,
        "own_s": own,
        "procs": procs,
    }


def foreign_cpu(before: dict[str, Any]) -> dict[str, Any]:
    """What else ran during a section: busy CPU not spent by the bench or anything it started
    (kernel overhead included), hypervisor steal, and the biggest other live processes."""
    now = cpu_snapshot()
    me = os.getpid()
    table = now["procs"]

    def ours(pid: int) -> bool:
        for _ in range(64):
            if pid == me:
                return True
            if pid not in table or pid <= 1:
                return False
            pid = table[pid][1]
        return False

    used: dict[str, float] = {}
    for pid, (comm, _, cpu) in table.items():
        if ours(pid):
            continue
        old = before["procs"].get(pid)
        delta = cpu - old[2] if old and old[0] == comm else cpu
        if delta > 0:
            used[comm] = used.get(comm, 0.0) + delta
    top = sorted(used.items(), key=lambda x: -x[1])
    return {
        "other_s": max(0.0, (now["busy_s"] - before["busy_s"]) - (now["own_s"] - before["own_s"])),
        "steal_s": now["steal_s"] - before["steal_s"],
        "top": [f"{c} {v:.1f} s" for c, v in top[:3] if v >= 0.1],
    }


def machine_text(
    opts: Options,
    m: dict[str, Any],
    elapsed: float,
    timings: dict[str, float],
    loads: dict[str, str],
    foreign: dict[str, dict[str, Any]],
) -> str:
    fp = m["foreign_bpf_progs_attached_to_tracepoints"]
    fpr = m["foreign_tracer_processes"]
    note = (
        f"Machine: Linux {m['kernel']}, nproc {m['nproc']} ({m['cpu_model']}), "
        f"{m['mem_gib']} GiB RAM, virtualization: {m['virt'] or 'unknown'}; python "
        f"{m['python']}; load average at start {' '.join(m['loadavg_at_start'].split()[:3])}, "
        f"at end {' '.join(m.get('loadavg_at_end', '?').split()[:3])}; "
        f"pid_max {m['pid_max']}. Tracers pinned to CPU {opts.tool_cpu}, workloads and "
        f"markers to CPU {opts.storm_cpu}; the bench itself waits on CPU {opts.storm_cpu}. "
        "Helpers: "
        + ", ".join(f"{k} {v}" for k, v in m["helpers"].items())
        + ". Versions: "
        + "; ".join(f"{k}: {val}" for k, val in m.get("versions", {}).items() if val)
        + f". The whole run took {elapsed:.0f} s ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
        + "); 1-minute load average before each section (it counts the bench's own storms "
        "too): "
        + ", ".join(f"{k} {v.split()[0]}" for k, v in loads.items())
        + ". CPU the bench and its processes did not use, during each section (busy time in "
        "/proc/stat minus the bench's own rusage: kernel overhead and other processes; then "
        "hypervisor steal; then other processes seen running): "
        + ", ".join(
            f"{k} {v['other_s']:.1f} s, steal {v['steal_s']:.1f} s"
            + (f" ({', '.join(v['top'])})" if v["top"] else "")
            for k, v in foreign.items()
        )
        + "."
    )
    c0, c1 = m.get("code_at_start", {}), m.get("code_at_end", {})
    if c0:
        note += (
            f" Code measured: tracer/ + bpf/ sha256 {c0['sha256']} ({c0['files']} files, newest "
            f"{c0['newest_mtime']})."
        )
        if c1 and c1["sha256"] != c0["sha256"]:
            note += (
                f" **The code changed during the run** (now {c1['sha256']}, newest "
                f"{c1['newest_mtime']}): runs started after the change measured the new code."
            )
    if fp or fpr:
        note += (
            f" **Caution**: when the bench started, {len(fp)} other BPF tracing program(s) were "
            f"loaded ({', '.join(sorted(set(fp)))[:300]}) and {len(fpr)} other tracer process(es) "
            "were running; those attached to exit/fork tracepoints cost every variant, bare "
            "included."
        )
    return "## Machine and run\n\n" + note + "\n"
