"""Tier 3 (root): llama.cpp's real `llama-server` with its weights mapped (its default) under a
memory limit below the model's size: it loads, answers /health healthy and keeps serving, but
every forward pass re-reads the model from disk (issue 29 item 4, issue 30 §2).

A supervisor that checks real work (a one-token completion with a 0.5 s timeout, as some
deployments probe a model server) while a client keeps the server busy sees those time out and
kills a server that is neither hung nor out of memory. The tool must name the thrash while it
happens (``replay --tail`` shows what ``tail`` showed) and judge the kill a probe kill with the
thrash as its reason.

``repro --memory-max 160M,512M`` on the same server with a load must not call that limit
"survived": 160M is degraded (thrash, probes doing real work failing, no kill) and 512M, which
serves, is the smallest that survived (issue 29 item 5).

The oracles are not the tool's: the supervisor's own log of what it saw and did, the server's
/health answering 200 before the kill, and the cgroup's own memory.stat read by this test
(workingset_refault_file rising by more than the cgroup's whole page cache, no OOM kill); for
repro, the loaded server's own log of its client's answers and its cgroup's counters."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from llm.server import BuildFailed, free_port, private_copy
from llm.server import built as built_server
from tests.workloads import in_cgroup
from tracer.cli import main
from tracer.pipeline.follow import ProbeSetup
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup
from tracer.sources.probes import parse_probe

pytestmark = pytest.mark.root

MiB = 1024 * 1024
LIMIT = 200 * MiB  # the 272 MiB model does not fit beside the server's ~110 MiB of anon

# A work-probe supervisor: it starts the server (argv[2:]), waits until /health says 200,
# then every second asks for one token with a 0.5 s timeout and SIGKILLs the server after 3
# failures in a row. It prints what it saw, then what it did.
SUPERVISOR = """
import json, os, signal, subprocess, sys, time, urllib.request
base, server = sys.argv[1], sys.argv[2:]
child = subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def ok(path, body=None, timeout=0.5):
    try:
        data = json.dumps(body).encode() if body else None
        req = urllib.request.Request(base + path, data, {"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=timeout).status == 200
    except Exception:
        return False
while child.poll() is None and not ok("/health", timeout=1):
    time.sleep(0.2)
print("healthy", flush=True)
failed = 0
while child.poll() is None:
    time.sleep(1)
    good = ok("/completion", {"prompt": "Hi", "n_predict": 1, "seed": 1})
    print("ok" if good else "timeout", flush=True)
    failed = 0 if good else failed + 1
    if failed == 3:
        os.kill(child.pid, signal.SIGKILL)
        print("killed", child.pid, flush=True)
        break
child.wait()
"""
# the recorder's own probe does the same work (an exec probe: the tool times it), twice a
# second with a 0.3 s budget: a one-token completion takes ~50 ms when the model fits, and at
# least one forward pass over weights re-read from disk (0.4 s or more here) when it does not
WORK_PROBE = (
    'exec:{python} -c "import json,urllib.request as u; u.urlopen(u.Request('
    "'http://127.0.0.1:{port}/completion', json.dumps({{'prompt': 'Hi', 'n_predict': 1}})"
    ".encode(), {{'Content-Type': 'application/json'}}), timeout=0.3)\""
)


@pytest.fixture(scope="module")
def built() -> tuple[Path, Path]:
    """(llama-server, the generated model): scripts/build-llama's cache, built once."""
    try:
        b = built_server()
    except BuildFailed as exc:
        pytest.skip(f"llama-server could not be built (scripts/build-llama): {exc}")
    return b.binary, b.model


@pytest.fixture
def cgroup(parent_cgroup: str, layout: CgroupLayout) -> Iterator[ChildCgroup]:
    with ChildCgroup(parent_cgroup, f"llm-thrash-{os.getpid()}", LIMIT, layout=layout) as cg:
        yield cg


def stat_of(cg: ChildCgroup) -> dict[str, int]:
    """The cgroup's memory.stat, as the kernel prints it: v1's subtree totals (total_*) or
    v2's (hierarchical) keys, under v2's names for the two this test reads."""
    raw = {}
    for line in Path(cg.abs_path, "memory.stat").read_text().splitlines():
        key, value = line.split()
        raw[key] = int(value)
    refaults = raw.get("total_workingset_refault_file", raw.get("workingset_refault_file", 0))
    return {"refaults": refaults, "file": raw.get("total_cache", raw.get("file", 0))}


def client(base: str, stop: threading.Event) -> None:
    """A user asking for 24 tokens at a time, one request after the other."""
    body = json.dumps({"prompt": "Once upon a time", "n_predict": 24, "seed": 1}).encode()
    while not stop.is_set():
        try:
            req = urllib.request.Request(base + "/completion", body, {"Content-Type": "x"})
            urllib.request.urlopen(req, timeout=60).read()
        except Exception:
            time.sleep(0.2)


def test_mapped_weights_over_the_limit_thrash_until_a_work_probe_kills_the_server(
    tmp_path: Path, built: tuple[Path, Path], cgroup: ChildCgroup
) -> None:
    binary, shared = built
    model = private_copy(shared, tmp_path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    (tmp_path / "supervisor.py").write_text(SUPERVISOR)
    log = tmp_path / "supervisor.log"
    server = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
              "-t", "2", "--no-warmup"]  # fmt: skip
    argv = ["sh", "-c", f'exec "$@" > {log}', "sh", sys.executable, str(tmp_path / "supervisor.py")]
    probe = parse_probe(WORK_PROBE.format(python=sys.executable, port=port))
    trace = tmp_path / "thrash.trace"
    rec = Recorder(
        str(trace),
        Targets(
            command=in_cgroup(cgroup, *argv, base, *server), probes=ProbeSetup([probe], 0.5, 0.3)
        ),
        duration=180,
    )
    out: dict[str, RecordResult] = {}
    t = threading.Thread(target=lambda: out.setdefault("res", rec.run()))
    t.start()
    stop = threading.Event()
    load = threading.Thread(target=client, args=(base, stop), daemon=True)
    before: dict[str, int] | None = None
    after: dict[str, int] = {}
    while t.is_alive():
        if load.ident is None and log.exists() and "healthy" in log.read_text():
            before = stat_of(cgroup)
            load.start()
        time.sleep(0.2)
        if before is not None and "killed" not in log.read_text():
            after = stat_of(cgroup)
    stop.set()
    t.join()
    res = out["res"]
    seen = log.read_text().split()
    # the supervisor's own word: healthy first, then work that timed out, then its kill
    assert seen[0] == "healthy" and seen[-2] == "killed" and seen[-5:-2] == ["timeout"] * 3, seen
    pid = int(seen[-1])
    # the cgroup's own counters: no OOM kill; the page cache re-read many times over
    assert before is not None
    assert after["refaults"] - before["refaults"] > after["file"] // 4096
    events = Path(cgroup.abs_path, "memory.oom_control").read_text()
    assert "oom_kill 0" in events, events
    [v] = [v for v in res.verdicts if v.pid == pid]
    assert (v.cause, v.signal, v.sender_role, v.comm) == (
        "probe_kill", "SIGKILL", "supervisor", "llama-server"
    )  # fmt: skip
    assert "page cache re-read from disk at" in v.summary
    assert "still starting" not in v.summary
    assert "no room for the files it reads" in v.advice
    assert any(text.startswith(f"{cgroup.path}: page cache re-read") for _, text in v.evidence)
    # named while it happened: what tail showed, replayed
    r = CliRunner().invoke(main, ["replay", "--tail", str(trace)])
    assert r.exit_code == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "thrash " in ln]
    assert lines and "page cache re-read from disk" in lines[0], r.stdout[-3000:]


# `repro`'s workload: the server with a load. It starts llama-server (argv[3:]) and, once
# /health says 200, asks for 4 tokens every second with a burst of 2 at once every 8 s. Its log
# (argv[2]) is the oracle the tool does not write: "healthy", the latency of each answer, and
# every second its own memory cgroup's workingset_refault_file and OOM kills.
LOADED_SERVER = """
import json, subprocess, sys, threading, time, urllib.request
base, log, server = sys.argv[1], open(sys.argv[2], "a", buffering=1), sys.argv[3:]
child = subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
lines = open("/proc/self/cgroup").read().splitlines()
v1 = [ln.split(":", 2)[2] for ln in lines if ":memory:" in ln]
cg = f"/sys/fs/cgroup/memory{v1[0]}" if v1 else "/sys/fs/cgroup" + lines[0].split(":", 2)[2]
def counters():
    st = dict(ln.split() for ln in open(f"{cg}/memory.stat"))
    refaults = st.get("total_workingset_refault_file", st.get("workingset_refault_file"))
    events = f"{cg}/memory.oom_control" if v1 else f"{cg}/memory.events"
    ev = dict(ln.split() for ln in open(events))
    return f"refaults {refaults} oom_kill {ev['oom_kill']}"
def ask():
    body = json.dumps({"prompt": "Once upon a time", "n_predict": 4, "seed": 1}).encode()
    t0 = time.monotonic()
    try:
        req = urllib.request.Request(base + "/completion", body, {"Content-Type": "x"})
        urllib.request.urlopen(req, timeout=60).read()
        log.write(f"latency {time.monotonic() - t0:.3f}\\n")
    except Exception:
        time.sleep(0.5)
def healthy():
    try:
        return urllib.request.urlopen(base + "/health", timeout=1).status == 200
    except Exception:
        return False
while child.poll() is None and not healthy():
    time.sleep(0.2)
log.write(f"healthy {counters()}\\n")
def steady():
    while True:
        ask()
        time.sleep(1)
threading.Thread(target=steady, daemon=True).start()
n = 0
while child.poll() is None:
    time.sleep(1)
    n += 1
    log.write(counters() + "\\n")
    for _ in range(2 if n % 8 == 0 else 0):
        threading.Thread(target=ask, daemon=True).start()
sys.exit(child.wait())
"""


def test_repro_skips_a_limit_that_thrashes_for_the_smallest_that_serves(
    tmp_path: Path, built: tuple[Path, Path], parent_cgroup: str
) -> None:
    """``repro --memory-max 512M,160M`` on the loaded server with a probe that does real work
    (a one-token completion): under 160M nothing is killed and /health would be fast, but the
    mapped model is re-read on every request, so 160M is degraded, not survived; 512M serves,
    and is the answer. 512M first on purpose: a page stays charged to the cgroup that read it,
    so unless repro drops each run's page cache the 160M run would find the whole model cached
    (charged to the removed 512M cgroup) and "survive" at a peak of ~120 MiB."""
    binary, shared = built
    model = private_copy(shared, tmp_path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    (tmp_path / "loaded.py").write_text(LOADED_SERVER)
    log = tmp_path / "load.log"
    server = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
              "-t", "2", "--no-warmup"]  # fmt: skip
    r = CliRunner().invoke(
        main,
        ["repro", "--memory-max", "512M,160M", "--parent-cgroup", parent_cgroup,
         "--probe", f"{base}/completion", "--probe-data", '{"prompt": "Hi", "n_predict": 1}',
         "--probe-timeout", "10", "--probe-interval", "1", "--probe-failures", "0",
         "--duration", "20", "--out-dir", str(tmp_path / "runs"), "--json", "--",
         sys.executable, str(tmp_path / "loaded.py"), base, str(log), *server],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    large, small = doc["runs"]
    # the workload's own log, one part per run: what its client saw and its cgroup counted
    parts = [p.split() for p in log.read_text().split("healthy")[1:]][::-1]  # 160M's first
    assert len(parts) == 2, log.read_text()

    def figures(words: list[str], key: str) -> list[float]:
        return [float(words[i + 1]) for i, w in enumerate(words) if w == key]

    refaulted = [(f[-1] - f[0]) * 4096 for f in (figures(p, "refaults") for p in parts)]
    answered = [figures(p, "latency") for p in parts]
    assert [figures(p, "oom_kill")[-1] for p in parts] == [0, 0]  # nothing was killed
    # under 160M the model was re-read from disk several times over; under 512M hardly at all
    assert refaulted[0] > 2 * model.stat().st_size > 20 * refaulted[1], refaulted
    # and the server answered its client less often and more slowly, if at all (the 2 CPUs
    # are shared: 8 tokens took 0.7-9 s under 512M here, 14 s or no answer under 160M)
    assert len(answered[1]) >= 2 and len(answered[0]) < len(answered[1]), answered
    assert all(a > sorted(answered[1])[len(answered[1]) // 2] for a in answered[0]), answered
    # the tool's word: 160M degraded by thrash, no kill; 512M survived and is the answer
    assert (small["setting"], small["outcome"], small["liveness_kill"]) == (
        "160M", "degraded", False
    )  # fmt: skip
    why = small["degraded"]
    assert why["thrash"] is not None and why["thrash"]["refault_bytes_per_s"] >= 16 * MiB
    assert any(w.startswith("page cache re-read from disk at") for w in why["reasons"]), why
    assert (large["setting"], large["outcome"], large["degraded"]) == ("512M", "survived", None)
    assert large["probes"] >= 10 and large["thrash"] is None
    assert doc["smallest_surviving"]["setting"] == "512M"
    assert doc["conclusion"]["kind"] == "smallest_survived"
    assert doc["conclusion"]["text"].split(" that survived: ")[1].startswith("512M ")
