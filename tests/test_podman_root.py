"""Tier 3 with a real container runtime: podman (runc, cgroupfs, file events) from Debian's
packages, a busybox image built here (no registry is reachable), --network=none.

Each test records with ``--container NAME`` while the container runs, and removes every
container it made. Memory tests always run under the container's --memory limit.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import podmanimg
from tests.mt.program import the_program
from tests.podmanimg import busybox_image, podman, run_detached
from tests.recording import record_while, wait_for
from tracer.events import OomKill, ProbeSample
from tracer.pipeline.record import Recorder, Targets
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.root

MiB = 1 << 20

# per test run: a concurrent run removing its image must not take our containers with it
IMAGE = f"localhost/whyrestart-test-busybox:{os.getpid()}"


@pytest.fixture(scope="module", autouse=True)
def podman_ready(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    root = tmp_path_factory.mktemp("busybox-root")
    with busybox_image(root, IMAGE, ("sh", "sleep", "cat", "rm", "touch", "dd", "true", "kill")):
        yield


@pytest.fixture
def name() -> Iterator[str]:
    n = f"wr-test-{os.getpid()}-{time.monotonic_ns() % 100000}"
    yield n
    podman("rm", "-f", "-t", "0", n, check=False)


def state(name: str) -> tuple[str, int, str]:
    st, count, oom = podman(
        "inspect", "-f", "{{.State.Status}} {{.RestartCount}} {{.State.OOMKilled}}", name
    ).stdout.split()
    return st, int(count), oom


def create_oom_loop(name: str, restarts: int) -> None:
    """podmanimg.create_oom_loop in this file's image."""
    podmanimg.create_oom_loop(name, restarts, IMAGE)


def test_oom_restarts_are_linked_and_agree_with_podman(tmp_path: Path, name: str) -> None:
    create_oom_loop(name, 2)

    def start_and_wait() -> None:
        podman("start", name)
        wait_for(lambda: state(name)[:2] == ("exited", 2))
        time.sleep(1.0)  # podman shows "exited" between restarts too: make sure it stays

    res = record_while(tmp_path, name, start_and_wait)
    st, count, oom_claim = state(name)
    print(
        f"podman says: state={st} RestartCount={count} OOMKilled={oom_claim}; "
        f"whyrestart says: {[v.cause for v in res.verdicts]}"
    )
    assert [(v.cause, v.unit, v.main) for v in res.verdicts] == [
        ("cgroup_oom", f"podman {name}", True)
    ] * 3
    assert all(v.limit_bytes == 64 * 1024 * 1024 and v.limit_cgroup for v in res.verdicts)
    assert [r.cause for r in res.restarts] == ["cgroup_oom", "cgroup_oom"]
    assert res.restart_counts == [(f"podman {name}", 2, 2, "podman")]


def test_a_multithreaded_main_process_oom_killed_in_a_worker_is_one_cgroup_oom(
    tmp_path: Path, name: str, mtwork_static: Path
) -> None:
    """The twin of the test above with tests/mt/mtwork.c (mounted read-only) as the container's
    main process: five threads, the last worker (wrk4) allocating until the OOM killer ends the
    process under --memory=64m."""
    podman(
        "create", "--name", name, "--network=none", "--memory=64m",
        "-v", f"{mtwork_static}:/mtwork:ro", IMAGE, "/mtwork", "oom", "5",
    )  # fmt: skip

    def start_and_wait() -> None:
        podman("start", name)
        wait_for(lambda: state(name)[0] == "exited")

    res = record_while(tmp_path, name, start_and_wait)
    events = read_trace(res.path).events
    [(v, ex)] = the_program(events, res.verdicts)
    assert ex.status == signal.SIGKILL
    assert [(v.cause, v.unit, v.main) for v in res.verdicts] == [
        ("cgroup_oom", f"podman {name}", True)
    ]
    assert (v.limit_bytes, bool(v.limit_cgroup)) == (64 * MiB, True)
    [oom] = [e for e in events if isinstance(e, OomKill)]
    assert (oom.victim_pid, oom.victim_comm, oom.memcg) == (ex.pid, "mtwork", True)


def test_a_failing_health_check_with_kill_on_failure_is_a_probe_kill(
    tmp_path: Path, name: str
) -> None:
    run_detached(
        name,
        "--health-cmd",
        "cat /tmp/ok",
        "--health-retries",
        "1",
        "--health-interval",
        "0",
        "--health-on-failure=kill",
        IMAGE,
        "sh",
        "-c",
        "touch /tmp/ok; sleep 8; rm /tmp/ok; sleep 300",
    )

    def drive_health_checks() -> None:
        # no systemd timers here: run the checks the way a timer would
        def check_once() -> bool:
            podman("healthcheck", "run", name, check=False)
            return state(name)[0] != "running"

        wait_for(check_once)

    res = record_while(tmp_path, name, drive_health_checks)
    probes = [e for e in read_trace(res.path).events if isinstance(e, ProbeSample)]
    assert probes and probes[0].ok and not probes[-1].ok
    assert all(p.target == "healthcheck" and p.unit == f"podman {name}" for p in probes)
    main = [v for v in res.verdicts if v.main]
    assert [v.cause for v in main] == ["probe_kill"]
    assert main[0].sender_role == "supervisor"
    assert sum("probe healthcheck" in what for _, what in main[0].evidence) >= 1


def test_podman_stop_is_a_signal_kill_by_the_runtime(tmp_path: Path, name: str) -> None:
    # sh as PID 1 of the container ignores SIGTERM: podman stop has to SIGKILL after the grace
    run_detached(
        name,
        "--stop-timeout",
        "2",
        IMAGE,
        "sh",
        "-c",
        "sleep 300",
    )
    res = record_while(tmp_path, name, lambda: podman("stop", name) and None)
    main = [v for v in res.verdicts if v.main]
    assert [v.cause for v in main] == ["signal_kill"]
    assert main[0].sender_role == "supervisor"
    assert "SIGTERM, then SIGKILL" in main[0].summary


def test_supervisord_restarts_are_linked_with_their_causes(tmp_path: Path) -> None:
    """A program under supervisord (not a container: a process supervisor) that fails three
    times, then asks supervisord to shut down: three app_exit verdicts, three restarts linked,
    and the last run stopped by supervisord itself (signal_kill, sender the supervisor)."""
    # the one installed beside this interpreter (a pyenv shim would be a bash wrapper)
    beside = Path(sys.executable).parent / "supervisord"
    supervisord = str(beside) if beside.exists() else shutil.which("supervisord")
    if supervisord is None:
        pytest.fail("supervisord is missing: scripts/setup installs it with the dev extra")
    runs = tmp_path / "runs"
    worker = tmp_path / "worker.py"
    # runs 1-3 fail with code 3; run 4 sends SIGTERM to supervisord and waits to be stopped
    worker.write_text(f"""import os, signal, time
with open({str(runs)!r}, "a+") as f:
    f.write("run\\n")
    f.seek(0)
    n = len(f.readlines())
if n >= 4:
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(30)
time.sleep(0.2)
os._exit(3)
""")
    conf = tmp_path / "supervisord.conf"
    conf.write_text(f"""[supervisord]
nodaemon=true
logfile={tmp_path}/supervisord.log
pidfile={tmp_path}/supervisord.pid
[program:worker]
command={sys.executable} {worker}
autorestart=true
startsecs=0
startretries=100
""")
    res = Recorder(
        str(tmp_path / "s.trace"),
        Targets(command=["timeout", "-s", "TERM", "60", supervisord, "-c", str(conf)]),
        duration=90,
    ).run()
    assert runs.read_text().count("run") == 4
    unit = f"{Path(sys.executable).name} under supervisord"
    mine = [v for v in res.verdicts if v.unit == unit]
    assert [(v.cause, v.exit_code, v.main) for v in mine] == [("app_exit", 3, True)] * 3 + [
        ("signal_kill", None, True)
    ]
    assert (mine[-1].signal, mine[-1].sender_role) == ("SIGTERM", "supervisor")
    links = [r for r in res.restarts if r.unit == unit]
    assert [r.cause for r in links] == ["app_exit"] * 3


# ~3.5 restarts a second here (podman 4.3, runc): 2,000 take ~10 minutes, so the default is a
# short loop; WR_CRASH_LOOP_RESTARTS=2000 runs the long one. The 2,000-cgroup loop of
# tests/test_exact_root.py covers the kernel side at full length.
CRASH_LOOP_RESTARTS = int(os.environ.get("WR_CRASH_LOOP_RESTARTS", "60"))


def test_a_crash_looping_container_keeps_the_watched_cgroup_table_bounded(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each restart gives the container a new cgroup: the recording must survive any number
    of them, the kernel's watched-cgroup table holding only the live one(s)."""
    import ctypes

    from tracer.bpf import hooks

    sizes: list[int] = []
    refused: list[int] = []

    class Hooks(hooks.KernelHooks):
        def watch_cgroup(self, cgroup_id: int) -> bool:
            ok = super().watch_cgroup(cgroup_id)
            sizes.append(len({k.value for k in self.watched_cgroups.keys(ctypes.c_uint64)}))  # type: ignore[arg-type, attr-defined]
            return ok

        def close(self) -> None:
            refused.append(self.watched_cgroups_refused())
            super().close()

    monkeypatch.setattr(hooks, "KernelHooks", Hooks)
    n = CRASH_LOOP_RESTARTS
    podman(
        "create", "--name", name, "--network=none", f"--restart=on-failure:{n}", IMAGE,
        "sh", "-c", "exit 3",
    )  # fmt: skip

    def start_and_wait() -> None:
        podman("start", name)
        wait_for(lambda: state(name)[:2] == ("exited", n), seconds=60 + n)
        time.sleep(1.0)  # podman shows "exited" between restarts too: make sure it stays

    # (a loaded host ran 285 restarts in 120 s, not 3.5 a second: the recording outlasts the loop)
    res = record_while(tmp_path, name, start_and_wait, duration=120 + n)
    unit = f"podman {name}"
    main = [(v.cause, v.exit_code, v.unit) for v in res.verdicts if v.main]
    assert main == [("app_exit", 3, unit)] * (n + 1)
    assert len(res.restarts) == n
    assert res.restart_counts == [(unit, n, n, "podman")]
    assert refused == [0]
    assert sizes and max(sizes) <= 2, max(sizes)


def test_supervisord_as_a_containers_entrypoint_restarts_reach_the_agents_journal(
    tmp_path: Path, name: str
) -> None:
    """Issue 31 item 7: supervisord as PID 1 of a podman container (the s6-overlay, runit, pm2
    pattern) restarts a program that fails three times; then the container is stopped. The
    program and supervisord share the container's cgroup, so the agent's kernel filter once
    dropped the program's execs (and would drop a clean exit): its three failures were judged
    as the container's side processes and no restart was linked. From the agent's journal:
    three app_exit verdicts with code 3 for the program, three restarts linked, and the last
    run stopped by supervisord (signal_kill, sender the supervisor)."""
    from tests.test_agent_root import AgentProc, until
    from tracer.agent.journal import read_journal

    venv = os.path.realpath(sys.prefix)  # supervisord's shebang names it
    supervisord = os.path.join(venv, "bin", "supervisord")
    if not os.path.exists(supervisord):
        pytest.fail("supervisord is missing: scripts/setup installs it with the dev extra")
    # the host's python in the container: /usr (and Debian's merged /lib) and the venv mounted
    # read-only into a busybox root, as the other tests' images are made (no registry here)
    root = tmp_path / "root"
    root.mkdir()

    def usr_links() -> None:
        for d in ("lib", "lib64"):
            (root / d).symlink_to(f"usr/{d}")

    image = f"localhost/whyrestart-test-supervisord:{os.getpid()}"
    work = tmp_path / "work"  # (the same path inside: supervisord's config names it)
    work.mkdir()
    runs = work / "runs"
    program = work / f"wr-worker-{os.getpid()}"  # its name is its unit's: unique per run
    # runs 1-3 fail with code 3, run 4 stays up until the container is stopped
    program.write_text(f"""#!/usr/bin/python3
import time
with open({str(runs)!r}, "a+") as f:
    f.write("run\\n")
    f.seek(0)
    n = len(f.readlines())
time.sleep(300 if n >= 4 else 0.2)
raise SystemExit(3)
""")
    program.chmod(0o755)
    conf = work / "supervisord.conf"
    conf.write_text(f"""[supervisord]
nodaemon=true
logfile={work}/supervisord.log
pidfile={work}/supervisord.pid
[program:worker]
command={program}
autorestart=true
startsecs=0
startretries=100
stopwaitsecs=5
""")
    state_dir = tmp_path / "state"
    agent = AgentProc(state_dir)
    unit = f"{program.name} under supervisord"

    def journal(kind: str) -> list[dict[str, Any]]:
        entries = read_journal(str(state_dir / "journal.jsonl"))
        return [e for e in entries if e["kind"] == kind and e["unit"] == unit]

    try:
        agent.wait_ready()
        with busybox_image(root, image, ("sh",), prepare=usr_links):
            run_detached(
                name, "-v", "/usr:/usr:ro", "-v", f"{venv}:{venv}:ro", "-v", f"{work}:{work}",
                image, supervisord, "-c", str(conf),
            )  # fmt: skip
            wait_for(lambda: runs.exists() and runs.read_text().count("run") == 4, seconds=60)
            # (a restart reaches the journal once its old exit's verdict is out)
            until(lambda: len(journal("restart")) == 3, timeout=30)
            podman("stop", "-t", "10", name)
            until(lambda: len(journal("verdict")) == 4, timeout=30)
            podman("rm", "-f", "-t", "0", name)
        assert agent.stop()[0] == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
    assert runs.read_text().count("run") == 4
    verdicts = [(e["cause"], e["verdict"]) for e in journal("verdict")]
    assert [(c, v["exit_code"], v["main"]) for c, v in verdicts] == [("app_exit", 3, True)] * 3 + [
        ("signal_kill", None, True)
    ], verdicts
    # the last run stopped by supervisord at `podman stop`
    last = verdicts[-1][1]
    assert (last["signal"], last["sender_role"]) == ("SIGTERM", "supervisor")
    restarts = [e["restart"] for e in journal("restart")]
    assert [r["cause"] for r in restarts] == ["app_exit"] * 3
    # each restart links one run to the next, the first three the failed ones
    pids = [e["pid"] for e in journal("verdict")]
    assert [(r["old_pid"], r["new_pid"]) for r in restarts] == list(itertools.pairwise(pids))
