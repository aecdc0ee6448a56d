"""Tier 3 (root): llama.cpp's real `llama-server` with its weights mapped (its default) under a
memory limit below the model's size: it loads, answers /health healthy and keeps serving, but
every forward pass re-reads the model from disk (issue 29 item 4, issue 30 §2).

A supervisor that checks real work (a one-token completion with a 0.5 s timeout, as some
deployments probe a model server) while a client keeps the server busy sees those time out and
kills a server that is neither hung nor out of memory. The tool must name the thrash while it
happens (``replay --tail`` shows what ``tail`` showed) and judge the kill a probe kill with the
thrash as its reason.

The oracles are not the tool's: the supervisor's own log of what it saw and did, the server's
/health answering 200 before the kill, and the cgroup's own memory.stat read by this test
(workingset_refault_file rising by more than the cgroup's whole page cache, no OOM kill)."""

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
