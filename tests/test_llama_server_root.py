"""Tier 3 (root): llama.cpp's real `llama-server` (scripts/build-llama) serving a generated
272 MiB llama model (llm/model.py), in a memory cgroup of its own, recorded with an http
probe of its /health (issue 29 items 1 and 4).

(a) Loaded without mmap (`--load-mode none`: the weights are read into buffers) under a limit
at half the model's size, it is OOM-killed during the load: cgroup_oom at the limit, said to
have died while starting (no probe had passed) and that it needed more than the limit.
(b) A 64 Ki-token context (its KV cache, zeroed, so charged at once: 1.5 GiB) under 1 GiB is
OOM-killed while it allocates that cache, with the model mapped and within the limit.
(c) A liveness-style supervisor that kills after 3 failed /health polls, with no initial delay,
kills it while it is loading: probe_kill, still starting, advising a startup probe.
(d) (b) in a podman container (llm/image.py) under a restart policy: each start is
OOM-killed, and the verdicts and restarts agree with podman's RestartCount.

The oracles are not the tool's: the server's own HTTP answers (/health 503 while loading, never
200), the kernel log's OOM line (dmesg), the cgroup's failcnt and OOM-kill counter, and the
supervisor's own record of what it saw, podman's RestartCount and exit code."""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llm import image
from llm.server import BuildFailed, Built, argv, built, free_port, status_of
from tests.recording import record_while, wait_for
from tests.workloads import in_cgroup
from tracer.analysis.analyzer import Verdict
from tracer.pipeline.follow import ProbeSetup
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup
from tracer.sources.probes import parse_probe

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
GiB = 1024 * MiB


@pytest.fixture(scope="module")
def built_server() -> Built:
    """The built binary and the generated model (llm.server.built: scripts/build-llama is
    cached, so only a first build takes minutes; a skip says why the build failed)."""
    try:
        return built()
    except BuildFailed as exc:
        pytest.skip(f"llama-server could not be built (scripts/build-llama): {exc}")


@pytest.fixture(scope="module")
def llama_server(built_server: Built) -> Path:
    return built_server.binary


@pytest.fixture(scope="module")
def model(built_server: Built) -> Path:
    """The generated model (272 MiB), cached beside the binary."""
    return built_server.model


def killed_in_kernel_log(pid: int) -> list[str]:
    """The kernel log's OOM-kill lines for ``pid`` (dmesg, read here: not the tool's reader)."""
    out = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    return re.findall(rf"Memory cgroup out of memory: Killed process {pid} \(llama-server\).*", out)


def server_argv(binary: Path, model: Path, port: int, *extra: str) -> list[str]:
    # 2 threads (this kind of host has 2 cores); no warm-up run: the load is the test
    return argv(binary, model, port, *extra, threads=2)


@dataclass
class Run:
    res: RecordResult
    pid: int  # the llama-server process
    statuses: list[int] = field(default_factory=list)  # /health as the test saw it, in order
    failcnt: int = 0
    oom_kills: int = 0
    side: str = ""  # what a supervisor printed


def cg_value(cg: ChildCgroup, name: str, key: str | None = None) -> int:
    text = Path(cg.abs_path, name).read_text()
    if key is None:
        return int(text.split()[0])
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    raise AssertionError(f"no {key} in {name}: {text!r}")


@pytest.fixture
def cgroup_of(parent_cgroup: str, layout: CgroupLayout) -> Iterator[object]:
    """``cgroup_of(limit)``: a child memory cgroup with that limit, removed after the test."""
    made: list[ChildCgroup] = []

    def make(limit: int) -> ChildCgroup:
        name = f"llm-{os.getpid()}-{time.monotonic_ns()}"
        cg = ChildCgroup(parent_cgroup, name, limit, layout=layout)
        cg.__enter__()
        made.append(cg)
        return cg

    yield make
    for cg in reversed(made):
        cg.__exit__(None, None, None)


def record_server(tmp_path: Path, cg: ChildCgroup, port: int, argv: list[str]) -> Run:
    """Record ``argv`` (moved into ``cg`` first) with a 0.1 s probe of its /health, to its end;
    meanwhile poll /health as a client would, keeping each answer."""
    url = f"http://127.0.0.1:{port}/health"
    probes = ProbeSetup([parse_probe(url)], 0.1, 0.5)
    rec = Recorder(
        str(tmp_path / "llama.trace"),
        Targets(command=in_cgroup(cg, *argv), probes=probes),
        duration=120,
    )
    out: dict[str, RecordResult] = {}
    t = threading.Thread(target=lambda: out.setdefault("res", rec.run()))
    t.start()
    statuses: list[int] = []
    while t.is_alive():
        statuses.append(status_of(url, 0.5))
        time.sleep(0.05)
    t.join()
    res = out["res"]
    [pid] = {v.pid for v in res.verdicts if v.comm == "llama-server"}
    return Run(
        res,
        pid,
        statuses,
        failcnt=cg_value(cg, "memory.failcnt"),
        oom_kills=cg_value(cg, "memory.oom_control", "oom_kill"),
    )


def server_verdict(run: Run) -> Verdict:
    [v] = [v for v in run.res.verdicts if v.pid == run.pid]
    return v


def test_a_load_without_mmap_under_half_the_model_dies_while_starting(
    tmp_path: Path, llama_server: Path, model: Path, cgroup_of: object
) -> None:
    size = model.stat().st_size
    limit = size // 2 // MiB * MiB
    assert callable(cgroup_of)
    cg: ChildCgroup = cgroup_of(limit)
    port = free_port()
    run = record_server(
        tmp_path, cg, port, server_argv(llama_server, model, port, "--load-mode", "none")
    )
    # the oracles: the kernel killed it in this cgroup, and it never answered healthy
    assert len(killed_in_kernel_log(run.pid)) == 1
    assert run.oom_kills == 1 and run.failcnt > 0
    assert 200 not in run.statuses
    v = server_verdict(run)
    assert (v.cause, v.confidence, v.comm, v.signal) == (
        "cgroup_oom", "high", "llama-server", "SIGKILL"
    )  # fmt: skip
    assert (v.limit_cgroup, v.limit_bytes) == (cg.path, limit)
    assert "; it was still starting (none of its" in v.summary
    assert f"it needed more than {limit / MiB:.1f} MiB" in v.advice
    assert "while it was still starting" in v.advice and "15% headroom" not in v.advice
    assert any(what.startswith("kernel log: CONSTRAINT_MEMCG") for _, what in v.evidence)


def test_a_64k_context_under_1_gib_is_killed_allocating_its_kv_cache(
    tmp_path: Path, llama_server: Path, model: Path, cgroup_of: object
) -> None:
    """6 layers x (K + V) x 65536 positions x 1024 x F16 = 1.5 GiB of KV cache, zeroed when
    allocated: over a 1 GiB limit that the mapped model (272 MiB) alone fits under."""
    assert callable(cgroup_of)
    cg: ChildCgroup = cgroup_of(1 * GiB)
    port = free_port()
    run = record_server(tmp_path, cg, port, server_argv(llama_server, model, port, "-c", "65536"))
    assert len(killed_in_kernel_log(run.pid)) == 1
    assert run.oom_kills == 1 and 200 not in run.statuses
    v = server_verdict(run)
    assert (v.cause, v.confidence, v.comm) == ("cgroup_oom", "high", "llama-server")
    assert (v.limit_cgroup, v.limit_bytes) == (cg.path, 1 * GiB)
    assert "; it was still starting (none of its" in v.summary
    assert "it needed more than 1.0 GiB" in v.advice
    # the KV cache is anonymous memory: it, not the mapped model, filled the cgroup
    parts = dict(v.breakdown)
    anon = parts.get("anon", parts.get("anon_rss", 0))
    assert anon > 512 * MiB, v.breakdown


# A liveness probe with no initial delay, as a home-made supervisor (or a kubelet with
# initialDelaySeconds 0, failureThreshold 3) runs it: it starts the server (argv[2:]), polls
# /health every 0.1 s and SIGKILLs it after 3 failures in a row (a 503 while loading is a
# failure). It prints each status it saw, then what it did.
SUPERVISOR = """
import os, signal, subprocess, sys, time, urllib.error, urllib.request
url, server = sys.argv[1], sys.argv[2:]
child = subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
failed = 0
while child.poll() is None:
    time.sleep(0.1)
    try:
        status = urllib.request.urlopen(url, timeout=0.1).status
    except urllib.error.HTTPError as e:
        status = e.code
    except Exception:
        status = 0
    print(status, flush=True)
    failed = 0 if status == 200 else failed + 1
    if failed == 3:
        os.kill(child.pid, signal.SIGKILL)
        print("killed", child.pid, flush=True)
        break
child.wait()
"""


def test_a_liveness_probe_during_a_slow_load_kills_a_server_still_starting(
    tmp_path: Path, llama_server: Path, model: Path, cgroup_of: object
) -> None:
    """The load outlasts the probe's failure budget (3 x 0.1 s): a 64 Ki-token context, its
    1.5 GiB KV cache zeroed as it is allocated, takes 1.5 s here to load (and longer on a busier
    host), and /health answers 503 all along."""
    assert callable(cgroup_of)
    cg: ChildCgroup = cgroup_of(3 * GiB)  # (room for it all: no memory in this story)
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    (tmp_path / "supervisor.py").write_text(SUPERVISOR)
    log = tmp_path / "supervisor.log"
    server = server_argv(llama_server, model, port, "-c", "65536")
    argv = ["sh", "-c", f'exec "$@" > {log}', "sh", sys.executable, str(tmp_path / "supervisor.py")]
    run = record_server(tmp_path, cg, port, [*argv, url, *server])
    seen = log.read_text().split()
    # the supervisor's own word: it killed the server after 3 answers that were not 200
    assert seen[-2:] == ["killed", str(run.pid)] and "200" not in seen[:-2], seen
    assert run.oom_kills == 0 and 200 not in run.statuses
    v = server_verdict(run)
    assert (v.cause, v.signal, v.sender_role, v.comm) == (
        "probe_kill", "SIGKILL", "supervisor", "llama-server"
    )  # fmt: skip
    assert v.confidence == "high" and v.probe_failures >= 3
    assert "; it was still starting: it had never answered its probe healthy" in v.summary
    assert "startup probe" in v.advice and "not more memory" in v.advice


# -- (d) in a podman container with a restart policy -----------------------------------------

CONF = Path(__file__).resolve().parent / "data" / "runtimes" / "containers.conf"
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(CONF)}
# conmon writes a file named "oom" into its working directory when its container is OOM-killed
# (tests/podmanimg.py): podman runs from a scratch directory, not the checkout
PODMAN_CWD = Path(tempfile.gettempdir()) / f"llm-podman-{os.getpid()}"


def as_outside() -> None:
    """In podman's child, before exec: undo what the recording in this process set on itself
    (tracer/selfguard.py: RLIMIT_DATA 1 GiB, oom_score_adj -900), which a container started
    from here would inherit (its 1.5 GiB KV cache refused by malloc: an exit 1, not an OOM)."""
    inf = resource.RLIM_INFINITY
    resource.setrlimit(resource.RLIMIT_DATA, (inf, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    Path("/proc/self/oom_score_adj").write_text("0")


def podman(*args: str, check: bool = True) -> str:
    r = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=300, env=PODMAN_ENV,
        cwd=PODMAN_CWD, preexec_fn=as_outside,
    )  # fmt: skip
    if check:
        assert r.returncode == 0, (args, r.stderr[-3000:])
    return r.stdout


@pytest.fixture(scope="module")
def server_image(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-server's image (llm/image.py), under a tag of this run's own."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("podman and runc are not installed (scripts/setup installs them)")
    tag = f"localhost/llm-llama-server:{os.getpid()}"
    PODMAN_CWD.mkdir(exist_ok=True)
    try:
        ctx = tmp_path_factory.mktemp("llama-image")
        image.build(tag, llama_server, ctx, PODMAN_ENV, PODMAN_CWD)
        yield tag
    finally:
        podman("rmi", "-f", tag, check=False)
        shutil.rmtree(PODMAN_CWD, ignore_errors=True)


def test_a_container_restarted_on_its_kv_cache_oom_agrees_with_podmans_count(
    tmp_path: Path, server_image: str, model: Path
) -> None:
    """(b) in a container under `--memory=1g --restart=on-failure:2`: every start is OOM-killed
    allocating the 64 Ki context's KV cache, podman restarts it twice and gives up. Three
    cgroup_oom verdicts, each while starting, two restarts named so, as podman counts them."""
    name = f"llm-{os.getpid()}-{time.monotonic_ns() % 100000}"
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    podman(
        "create", "--name", name, "--network=host", "--memory=1g", "--memory-swap=1g",
        "--restart=on-failure:2", "-v", f"{model}:/model.gguf:ro", server_image,
        "-m", "/model.gguf", "--host", "127.0.0.1", "--port", str(port), "-t", "2",
        "--no-warmup", "-c", "65536",
    )  # fmt: skip
    statuses: list[int] = []

    def start_and_wait() -> None:
        podman("start", name)

        def given_up() -> bool:
            statuses.append(status_of(url, 0.5))
            state = podman("inspect", "-f", "{{.State.Status}} {{.RestartCount}}", name).split()
            return state == ["exited", "2"]

        wait_for(given_up, 120, "podman's second restart, and its giving up")

    probes = ProbeSetup([parse_probe(url)], 0.1, 0.5)
    try:
        res = record_while(tmp_path, name, start_and_wait, probes=probes)
        state = podman("inspect", "-f", "{{.RestartCount}} {{.State.ExitCode}}", name).split()
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)
    assert state == ["2", "137"] and 200 not in statuses
    unit = f"podman {name}"
    mains = [v for v in res.verdicts if v.main and v.unit == unit]
    assert [(v.cause, v.confidence, v.comm) for v in mains] == [
        ("cgroup_oom", "high", "llama-server")
    ] * 3
    assert all(len(killed_in_kernel_log(v.pid)) == 1 for v in mains)
    assert all(
        v.limit_bytes == 1 * GiB and "it needed more than 1.0 GiB" in v.advice for v in mains
    )
    assert all("; it was still starting (none of its" in v.summary for v in mains)
    assert [r.cause for r in res.restarts] == ["cgroup_oom", "cgroup_oom"]
    assert res.restart_counts == [(unit, 2, 2, "podman")]
