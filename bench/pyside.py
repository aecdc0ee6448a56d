"""What measures whyrestart's own Python code: run by the bench in a process of its own,
pinned to one core, so that its time and peak RSS are its alone (not the bench's):

    python -m bench.pyside decode N REPEAT   batched decode of N synthetic ring-buffer exit records
    python -m bench.pyside gen PATH N SEED   write a synthetic N-event trace with TraceWriter
    python -m bench.pyside read PATH         iterate TraceReader over a trace, events only

Each prints one JSON object on stdout (the TypedDicts below say what it holds).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import random
import resource
import sys
import time

from bench.records import DecodeResult, GenResult, ReadResult
from tracer import __version__
from tracer.bpf import layout
from tracer.bpf.decode import Decoder
from tracer.events import (
    CgroupInfo,
    CgroupSample,
    Event,
    Exec,
    Exit,
    Fork,
    HostSample,
    ProcessSample,
    ReclaimSummary,
    Signal,
)
from tracer.trace.format import SCHEMA_VERSION, TraceHeader
from tracer.trace.reader import TraceReader
from tracer.trace.writer import TraceWriter

MiB = 1 << 20
GiB = 1 << 30


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- decode -------------------------------------------------------------------------------------


def exit_records(n: int) -> list[bytes]:
    """n distinct raw ``struct wr_exit`` records, as the ring-buffer callback hands them over
    (one bytes object each), built with the ctypes mirror of bpf/events.h."""
    out = []
    rec = layout.WrExit()
    rec.h.type = layout.EV_EXIT
    rec.h.size = ctypes.sizeof(layout.WrExit)
    rec.h.rung = 3
    comms = [f"worker-{i}".encode() for i in range(64)] + [b"wr-storm", b"python3", b"sh"]
    for i in range(n):
        rec.h.ts_ns = 10**12 + i * 50_000
        rec.h.pid = rec.h.tgid = 1000 + i % 4_000_000
        rec.h.cgroup_id = 5000 + i % 37
        rec.h.comm = comms[i % len(comms)]
        rec.exit_code = (i % 3) << 8 if i % 50 else 9  # some killed by SIGKILL
        rec.ppid = 900 + i % 7
        rec.start_ns = rec.h.ts_ns - 3_000_000
        out.append(bytes(rec))
    return out


def cmd_decode(n: int, repeat: int) -> DecodeResult:
    t0 = time.perf_counter()
    raws = exit_records(n)
    build_s = time.perf_counter() - t0
    times = []
    decoded = 0
    for _ in range(repeat):
        dec = Decoder()
        t0 = time.perf_counter()
        events = dec.decode_batch(raws)
        times.append(time.perf_counter() - t0)
        decoded = len(events)
        if dec.unknown or dec.malformed or decoded != n:
            raise SystemExit(f"decode: {dec.unknown} unknown, {dec.malformed} malformed of {n}")
        del events
    times.sort()
    return {
        "records": n,
        "record_bytes": len(raws[0]),
        "repeat": repeat,
        "decoded": decoded,
        "best_s": times[0],
        "median_s": times[len(times) // 2],
        "events_per_s_best": n / times[0],
        "events_per_s_median": n / times[len(times) // 2],
        "build_s": build_s,
        "maxrss_mib": maxrss_mib(),
        "python": platform.python_version(),
    }


# -- a synthetic trace ------------------------------------------------------------------------


def synthetic_events(n: int, seed: int) -> tuple[list[Event], dict[str, int]]:
    """About n events as a busy host recorded with --all would give them: 24 services (systemd
    units), each a long-lived main process (exec'd at the start) that keeps starting short-lived
    children: fork, exec for most, exit; now and then a fatal signal from the parent first and
    an exit by it, and some non-zero exits. Host, cgroup and process samples every 100 ms of
    trace time, a reclaim summary a second; 20,000 events per second of trace time.
    Deterministic for a seed."""
    rnd = random.Random(seed)
    ts = 2_000_000_000_000
    step = 50_000  # ns between events: 20k events/s
    cgroups = [(7000 + i, f"/system.slice/svc{i}.service") for i in range(24)]
    parents = [(100 + i, f"svc{i}d", cid, path) for i, (cid, path) in enumerate(cgroups)]
    programs = ["/usr/bin/sh", "/usr/bin/python3", "/usr/bin/curl", "/usr/local/bin/worker"]
    out: list[Event] = []
    kinds: dict[str, int] = {}
    next_pid = 20_000
    next_sample = ts
    next_reclaim = ts + 1_000_000_000
    sampled_pids = [p[0] for p in parents[:4]]

    def add(ev: Event) -> None:
        out.append(ev)
        kinds[ev.KIND] = kinds.get(ev.KIND, 0) + 1

    for ppid, pcomm, cid, path in parents:
        add(CgroupInfo(ts=ts, cgroup_id=cid, path=path, hierarchy="memory", limit_bytes=GiB))
        add(Exec(ts=ts, pid=ppid, comm=pcomm, filename=f"/usr/sbin/{pcomm}", cgroup_id=cid))
        ts += step
    while len(out) < n:
        if ts >= next_sample:
            add(
                HostSample(
                    ts=ts,
                    mem_total=24 * GiB,
                    mem_available=rnd.randrange(10 * GiB, 20 * GiB),
                    mem_free=rnd.randrange(1 * GiB, 4 * GiB),
                    cached=rnd.randrange(2 * GiB, 8 * GiB),
                    swap_free=0,
                    psi_some_avg10=round(rnd.random(), 2),
                    psi_full_avg10=0.0,
                    psi_some_total_us=ts // 1000,
                    psi_full_total_us=0,
                )
            )
            for cid, path in cgroups[:6]:
                add(
                    CgroupSample(
                        ts=ts,
                        cgroup_id=cid,
                        path=path,
                        usage_bytes=rnd.randrange(100 * MiB, 900 * MiB),
                        limit_bytes=1 * GiB,
                        high_bytes=None,
                        peak_bytes=950 * MiB,
                        failcnt=rnd.randrange(0, 50),
                        events={"oom_kill": 0, "under_oom": 0},
                        stat={"anon": 300 * MiB, "file": 200 * MiB, "shmem": 0},
                        psi_some_avg10=None,
                        psi_full_avg10=None,
                        psi_some_total_us=None,
                        psi_full_total_us=None,
                    )
                )
            for pid in sampled_pids:
                add(
                    ProcessSample(
                        ts=ts, pid=pid, rss_anon=50 * MiB, rss_file=8 * MiB, rss_shmem=0, vm_swap=0
                    )
                )
            next_sample += 100_000_000
        if ts >= next_reclaim:
            cid, _ = cgroups[rnd.randrange(len(cgroups))]
            add(
                ReclaimSummary(
                    ts=ts,
                    cgroup_id=cid,
                    kind="memcg",
                    count=rnd.randrange(1, 500),
                    total_ns=rnd.randrange(10**5, 10**8),
                    max_ns=10**6,
                    reclaimed_bytes=rnd.randrange(0, 64 * MiB),
                    interval_ns=1_000_000_000,
                )
            )
            next_reclaim += 1_000_000_000
        # one process: fork, usually exec, sometimes a fatal signal, then its exit
        ppid, pcomm, cid, path = parents[rnd.randrange(len(parents))]
        pid = next_pid
        next_pid = next_pid + 1 if next_pid < 4_000_000 else 20_000
        start = ts
        add(Fork(ts=ts, parent_pid=ppid, child_pid=pid, comm=pcomm, cgroup_id=cid))
        ts += step
        comm = pcomm
        if rnd.random() < 0.6:
            prog = programs[rnd.randrange(len(programs))]
            comm = os.path.basename(prog)[:15]
            add(Exec(ts=ts, pid=pid, comm=comm, filename=prog, cgroup_id=cid))
            ts += step
        status = 0 if rnd.random() < 0.93 else 1 << 8
        r = rnd.random()
        if r < 0.08:
            sig = 15 if r < 0.06 else 9
            add(
                Signal(
                    ts=ts,
                    sender_pid=ppid,
                    sender_tid=ppid,
                    sender_comm=pcomm,
                    sender_cgroup_id=cid,
                    target_pid=pid,
                    target_comm=comm,
                    sig=sig,
                    si_code=0,
                    result=0,
                    group=True,
                )
            )
            ts += step
            status = sig
        add(
            Exit(
                ts=ts,
                pid=pid,
                ppid=ppid,
                comm=comm,
                cgroup_id=cid,
                status=status,
                start_ns=start,
                rung="tp_btf",
            )
        )
        ts += step
    return out, kinds


def cmd_gen(path: str, n: int, seed: int) -> GenResult:
    t0 = time.perf_counter()
    events, kinds = synthetic_events(n, seed)
    build_s = time.perf_counter() - t0
    started = events[0].ts - 1000
    header = TraceHeader(
        schema=SCHEMA_VERSION,
        tool_version=__version__,
        host="bench-synthetic",
        kernel=platform.release(),
        cgroup={"mode": "hybrid", "memory_root": "/sys/fs/cgroup/memory", "memory_version": 1},
        clock_offset_ns=time.time_ns() - started,
        hooks={"exit": "tp_btf", "signal": "tp_btf", "fork": "tp_btf", "exec": "tp_btf"},
        targets={"pids": [], "cgroups": [], "all": True, "command": []},
        started_ns=started,
        extra={"synthetic": "python -m bench.pyside gen", "page_size": 4096},
    )
    t0 = time.perf_counter()
    with TraceWriter.open(path, header, overwrite=True) as w:
        for i in range(0, len(events), 4096):
            w.write_many(events[i : i + 4096])
        w.close(w.make_footer("synthetic", ended_ns=events[-1].ts + 1))
    write_s = time.perf_counter() - t0
    return {
        "path": path,
        "events": len(events),
        "kinds": kinds,
        "bytes": os.path.getsize(path),
        "build_s": build_s,
        "write_s": write_s,
        "write_events_per_s": len(events) / write_s,
    }


def cmd_read(path: str) -> ReadResult:
    t0 = time.perf_counter()
    n = 0
    with TraceReader(path) as reader:
        for _ in reader:
            n += 1
        footer_ok = reader.footer is not None
        warnings = list(reader.warnings)
    s = time.perf_counter() - t0
    return {
        "events": n,
        "seconds": s,
        "events_per_s": n / s,
        "footer": footer_ok,
        "warnings": warnings,
        "maxrss_mib": maxrss_mib(),
    }


def main(argv: list[str]) -> int:
    res: DecodeResult | GenResult | ReadResult
    if len(argv) >= 3 and argv[0] == "decode":
        res = cmd_decode(int(argv[1]), int(argv[2]))
    elif len(argv) >= 4 and argv[0] == "gen":
        res = cmd_gen(argv[1], int(argv[2]), int(argv[3]))
    elif len(argv) >= 2 and argv[0] == "read":
        res = cmd_read(argv[1])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
