"""Tier 3 (root): a real multi-worker Python model server (tests/servers/pymodel: gunicorn's
master, uvicorn workers, a memory-mapped 96 MiB model) in a memory cgroup of its own, recorded
with an http probe of its /health (issue 29 item 2).

(a) A request whose working memory does not fit gets its worker OOM-killed; the master
respawns it and keeps serving: the verdict is the worker's cgroup_oom, a child's death, not a
restart of the unit (the k8s#104454 class). (b) A master that gives up when a worker dies
(vllm#45626 "Failed core proc(s)") exits 1: its verdict passes the worker's OOM kill on, with
the gap. (c) Under `--restart on-failure:3` podman restarts the container after each: `record`
names each restart's cause, and `history --restarts` on the always-on agent's state summarises
the crash loop, both as many restarts as podman counted. The oracles are not the tool's: the
server's own HTTP answers, the kernel log's OOM line (dmesg), the cgroup's failcnt and OOM-kill
counter, podman's RestartCount."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.recording import record_while, wait_for
from tests.servers import pymodel
from tests.servers.pymodel import image
from tests.workloads import in_cgroup
from tracer.events import ProbeSample
from tracer.pipeline.follow import ProbeSetup
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup
from tracer.sources.probes import parse_probe
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.root

MiB = 1024 * 1024
LIMIT = 256 * MiB  # the model (96 MiB of page cache) and three processes (~50 MiB) fit
BIG_MIB = 400  # one request's working memory that does not


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pymodel.weights(tmp_path_factory.mktemp("pymodel") / "weights.f32")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    """The server's status and body ((0, reason) when it did not answer)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:  # refused, reset, closed without a response
        return 0, str(e).encode()


def healthy(url: str, pid: int) -> bool:
    status, body = get(f"{url}/health", 1)
    return status == 200 and json.loads(body)["pid"] == pid


def killed_in_kernel_log(pid: int) -> list[str]:
    """The kernel log's OOM-kill lines for ``pid`` (dmesg, read here: not the tool's reader)."""
    out = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    return re.findall(rf"Memory cgroup out of memory: Killed process {pid} \(.*", out)


@dataclass
class Run:
    res: RecordResult
    master: int
    workers: list[int]  # the workers serving before the big request
    cgroup: str
    failcnt: int
    oom_kills: int  # memory.oom_control's oom_kill: the kernel's count for this cgroup
    answers_after: list[tuple[int, bytes]]  # /generate once the big request had failed


def cg_file(cg: ChildCgroup, name: str) -> str:
    return Path(cg.abs_path, name).read_text()


def pids_in(cg: ChildCgroup) -> list[int]:
    return [int(p) for p in cg_file(cg, "cgroup.procs").split()]


def ppid_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.fixture
def server_cgroup(parent_cgroup: str, layout: CgroupLayout) -> Iterator[ChildCgroup]:
    name = f"pyserver-{os.getpid()}-{time.monotonic_ns()}"
    with ChildCgroup(parent_cgroup, name, LIMIT, layout=layout) as cg:
        yield cg


def serve_and_overload(
    tmp_path: Path, cg: ChildCgroup, model: Path, exit_on_worker_death: bool
) -> Run:
    """Record the server in ``cg`` with a probe of its /health; once it is healthy, one request
    whose working memory does not fit; then (if it is still up) a small one, and a SIGTERM."""
    port = free_port()
    # (a second before each worker maps the model: /health's 503s are long enough to probe)
    argv, env = pymodel.command(port, model, 2, exit_on_worker_death, load_s=1.0)
    own = {k: v for k, v in env.items() if k.startswith("PYMODEL_")}
    command = in_cgroup(cg, "env", *(f"{k}={v}" for k, v in own.items()), *argv)
    url = f"http://127.0.0.1:{port}"
    probes = ProbeSetup([parse_probe(f"{url}/health")], 0.3, 0.5)
    targets = Targets(command=command, probes=probes)
    rec = Recorder(str(tmp_path / "pyserver.trace"), targets, duration=90)
    out: dict[str, RecordResult] = {}
    t = threading.Thread(target=lambda: out.setdefault("res", rec.run()))
    t.start()
    try:
        # the server's own word: 200 once both workers have mapped and read the model
        wait_for(lambda: get(f"{url}/health", 1)[0] == 200, 60, "/health 200")
        time.sleep(0.5)  # (both workers up: each answers 503 until its model is read)
        procs = pids_in(cg)
        [master] = [p for p in procs if ppid_of(p) not in procs]
        workers = sorted(p for p in procs if p != master)
        assert len(workers) == 2, procs
        status, _ = get(f"{url}/generate?mib={BIG_MIB}&tokens=4", 30)
        assert status == 0  # its worker died under it: no answer
        answers: list[tuple[int, bytes]] = []
        if not exit_on_worker_death:
            # (the victim may still be listed while it exits: wait for the newcomer)
            before = {master, *workers}
            wait_for(lambda: bool(set(pids_in(cg)) - before), 30, "the master's respawned worker")
            [new] = set(pids_in(cg)) - before
            # the new worker answers 503 until it has read the model, then 200 with its pid
            # (the listening socket spreads the probes over both workers)
            wait_for(lambda: healthy(url, new), 30, "/health 200 from the respawned worker")
            answers = [get(f"{url}/generate?mib=8&tokens=4", 10) for _ in range(4)]
        failcnt = int(cg_file(cg, "memory.failcnt"))
        oom_kills = int(re.findall(r"oom_kill (\d+)", cg_file(cg, "memory.oom_control"))[0])
        if not exit_on_worker_death:
            os.kill(master, 15)  # a clean stop: the master stops its workers and exits 0
        t.join(60)
    finally:
        if t.is_alive():
            rec.stop.set("test failed")
            t.join(30)
    assert not t.is_alive()
    return Run(out["res"], master, workers, cg.path, failcnt, oom_kills, answers)


def the_oom_killed_worker(run: Run) -> int:
    """The one worker the kernel log says the OOM killer took."""
    [victim] = [w for w in run.workers if killed_in_kernel_log(w)]
    assert run.failcnt > 0 and run.oom_kills == 1
    return victim


def test_a_worker_oom_killed_while_the_master_respawns_it_is_a_childs_death(
    tmp_path: Path, server_cgroup: ChildCgroup, model: Path
) -> None:
    run = serve_and_overload(tmp_path, server_cgroup, model, exit_on_worker_death=False)
    victim = the_oom_killed_worker(run)
    # the master kept serving, from the survivor and from the worker it forked anew
    assert [s for s, _ in run.answers_after] == [200] * 4
    assert run.res.command_status == 0  # the SIGTERM's clean stop
    [v] = [v for v in run.res.verdicts if v.pid == victim]
    assert (v.cause, v.confidence, v.main) == ("cgroup_oom", "high", False)
    assert (v.limit_cgroup, v.limit_bytes) == (run.cgroup, LIMIT)
    assert v.comm == "gunicorn"
    assert any(what.startswith("kernel log: CONSTRAINT_MEMCG") for _, what in v.evidence)
    # the recorded probes saw the server load: 503 while its workers read the model, then 200
    codes = [e.status for e in read_trace(run.res.path).events if isinstance(e, ProbeSample)]
    assert 503 in codes and 200 in codes[codes.index(503) :], codes
    # a child's death, not a restart of the unit: its main process (the master) lived on
    assert run.res.restarts == []
    [m] = [v for v in run.res.verdicts if v.pid == run.master]
    assert (m.cause, m.exit_code, m.main) == ("app_exit", 0, True)


def test_a_master_exiting_1_after_its_workers_oom_kill_passes_the_oom_on(
    tmp_path: Path, server_cgroup: ChildCgroup, model: Path
) -> None:
    run = serve_and_overload(tmp_path, server_cgroup, model, exit_on_worker_death=True)
    victim = the_oom_killed_worker(run)
    assert run.res.command_status == 1  # gunicorn's HaltServer: "Failed core proc(s)"
    [w] = [v for v in run.res.verdicts if v.pid == victim]
    assert (w.cause, w.main) == ("cgroup_oom", False)
    [m] = [v for v in run.res.verdicts if v.pid == run.master]
    assert (m.cause, m.confidence, m.main, m.exit_code) == ("cgroup_oom", "medium", True, 1)
    assert (m.limit_cgroup, m.limit_bytes) == (run.cgroup, LIMIT)
    gap = r"(\d+ ms|\d+\.\d s)"
    line = re.compile(rf"exited 1, {gap} after its worker pid {victim} \(gunicorn\) was OOM-killed")
    assert any(line.fullmatch(what) for _, what in m.evidence), m.evidence
    assert line.match(m.summary), m.summary


# -- (c) in a podman container with a restart policy -----------------------------------------

CONF = Path(__file__).resolve().parent / "data" / "runtimes" / "containers.conf"
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(CONF)}
# conmon writes a file named "oom" into its working directory when its container is OOM-killed
# (tests/podmanimg.py): podman runs from a scratch directory, not the checkout
# (made and removed by server_image)
PODMAN_CWD = Path(tempfile.gettempdir()) / f"pyserver-podman-{os.getpid()}"


def podman(*args: str, check: bool = True, stdin: bytes | None = None) -> str:
    r = subprocess.run(
        ["podman", *args],
        input=stdin,
        capture_output=True,
        timeout=300,
        env=PODMAN_ENV,
        cwd=PODMAN_CWD,
    )
    if check:
        assert r.returncode == 0, (args, r.stderr.decode(errors="replace")[-3000:])
    return r.stdout.decode(errors="replace")


@pytest.fixture(scope="module")
def server_image(bare_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's image (tests/servers/pymodel/image.py) on the bare Debian root imported as
    its base, under tags of this run's own."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("podman and runc are not installed (scripts/setup installs them)")
    base = f"localhost/pyserver-test-base:{os.getpid()}"
    tag = f"localhost/pyserver-test-image:{os.getpid()}"
    PODMAN_CWD.mkdir(exist_ok=True)
    try:
        tar = subprocess.run(
            ["tar", "-C", str(bare_target), "--exclude=./tmp/*", "-c", "."],
            capture_output=True,
            check=True,
            timeout=300,
        ).stdout
        podman("import", "-", base, stdin=tar)
        image.build(tag, base, tmp_path_factory.mktemp("pymodel-image") / "ctx", PODMAN_ENV)
        yield tag
    finally:
        podman("rmi", "-f", tag, base, check=False)
        shutil.rmtree(PODMAN_CWD, ignore_errors=True)


def restart_count(name: str) -> int:
    return int(podman("inspect", "-f", "{{.RestartCount}}", name).strip())


@dataclass
class CrashLoop:
    """vllm#45626 under `--restart on-failure:3`: a container whose master exits 1 when a
    worker dies; each overload OOM-kills a worker, so podman restarts the container."""

    name: str
    url: str
    answers: list[int]

    @classmethod
    def create(cls, server_image: str, model: Path) -> CrashLoop:
        name = f"pyserver-{os.getpid()}-{time.monotonic_ns() % 100000}"
        port = free_port()
        podman(
            "create", "--name", name, "--network=host", "--memory=256m",
            "--restart=on-failure:3", "-v", f"{model}:/model/weights.f32:ro",
            "-e", f"PYMODEL_PORT={port}", "-e", "PYMODEL_WEIGHTS=/model/weights.f32",
            "-e", "PYMODEL_WORKERS=2", "-e", "PYMODEL_EXIT_ON_WORKER_DEATH=1",
            server_image,
        )  # fmt: skip
        return cls(name, f"http://127.0.0.1:{port}", [])

    def overload_twice(self) -> None:
        """Start it, overload it twice (each time until podman has restarted it), then wait
        until the third run serves."""
        podman("start", self.name)
        for n in (1, 2):
            wait_for(lambda: get(f"{self.url}/health", 1)[0] == 200, 60, "/health 200")
            time.sleep(0.5)  # (both workers up)
            self.answers.append(get(f"{self.url}/generate?mib={BIG_MIB}&tokens=4", 30)[0])
            wait_for(lambda: restart_count(self.name) == n, 60, f"podman's restart {n}")  # noqa: B023
        wait_for(lambda: get(f"{self.url}/health", 1)[0] == 200, 60, "/health 200 at last")

    def remove(self) -> None:
        podman("rm", "-f", "-t", "0", self.name, check=False)


def test_restarts_after_worker_ooms_agree_with_podmans_restart_count(
    tmp_path: Path, server_image: str, model: Path
) -> None:
    """`record` of the crash loop, twice: two restarts, each named the worker's cgroup_oom, as
    many as podman's RestartCount."""
    loop = CrashLoop.create(server_image, model)
    name, url, answers = loop.name, loop.url, loop.answers
    probes = ProbeSetup([parse_probe(f"{url}/health")], 0.3, 0.5)
    try:
        res = record_while(tmp_path, name, loop.overload_twice, probes=probes)
        count = restart_count(name)
    finally:
        loop.remove()
    assert answers == [0, 0] and count == 2
    unit = f"podman {name}"
    mains = [v for v in res.verdicts if v.main and v.unit == unit and v.exit_code == 1]
    assert [(v.cause, v.confidence) for v in mains] == [("cgroup_oom", "medium")] * 2
    assert all("was OOM-killed" in v.summary for v in mains)
    workers = [v for v in res.verdicts if not v.main and v.cause == "cgroup_oom"]
    # (at least one worker a run: on a loaded host the OOM killer may take the second worker
    # too before the master's exit ends the run; each kill is the kernel log's, and the
    # restarts stay exactly podman's count)
    assert len(workers) >= 2 and all(killed_in_kernel_log(v.pid) for v in workers)
    assert all(v.unit == unit for v in workers)
    assert [r.cause for r in res.restarts] == ["cgroup_oom", "cgroup_oom"]
    assert res.restart_counts == [(unit, 2, 2, "podman")]


def test_history_summarises_the_crash_loop_the_agent_saw_as_podman_counted_it(
    tmp_path: Path, server_image: str, model: Path
) -> None:
    """The same crash loop under the always-on agent (issue 30 §4): `history --restarts --unit
    NAME --json` on its state dir gives as many restarts as podman's RestartCount, each run
    before a restart ended by an OOM kill with its peak at the container's 256 MiB, and the
    back-off between runs. The oracles: podman's RestartCount, and the server's own answers
    (each overload's connection dropped: 0)."""
    from tests.test_agent_root import WHYRESTART, AgentProc, until

    state = tmp_path / "state"
    agent = AgentProc(state)
    loop = CrashLoop.create(server_image, model)
    history = [
        *WHYRESTART, "history", "--state-dir", str(state), "--restarts", "--unit", loop.name,
        "--json",
    ]  # fmt: skip

    def loops() -> list[dict[str, Any]]:
        out = subprocess.run(history, capture_output=True, check=True, timeout=60).stdout
        return list(json.loads(out)["loops"])

    try:
        agent.wait_ready()
        loop.overload_twice()
        count = restart_count(loop.name)
        # the agent's journal follows within a round or two
        until(lambda: bool(loops()) and loops()[0]["restarts"] >= count, timeout=30)
        [found] = loops()
        text = subprocess.run(history[:-1], capture_output=True, text=True, timeout=60).stdout
        print(text)  # (shown with -s, and when the test fails)
        assert agent.stop()[0] == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
        loop.remove()
    assert loop.answers == [0, 0] and count == 2
    assert found["unit"] == f"podman {loop.name}"
    assert found["restarts"] == count
    # the two runs podman restarted ended in an OOM kill; the third was still serving
    assert found["causes"] == {"cgroup_oom": count}, found
    ended = [r for r in found["runs"] if r["cause"] is not None]
    assert [r["cause"] for r in ended] == ["cgroup_oom"] * count, found["runs"]
    assert all(r["limit_bytes"] == LIMIT for r in ended), found["runs"]
    assert all(r["lived_ns"] and r["lived_ns"] > 0 for r in ended), found["runs"]
    assert len(found["backoff_ns"]) == count and all(g >= 0 for g in found["backoff_ns"])
    assert f"podman {loop.name}: 3 runs, 2 restarts; cgroup_oom 2x" in text, text
