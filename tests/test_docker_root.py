"""Tier 3 (root): Docker Engine and Compose for real, against a private dockerd (tests/dockerd.py).

The recorder finds the daemon the way a docker client does (``DOCKER_HOST`` here, pointing at
the private socket); containers are named per test run; images are the busybox rootfs imported
by the ``docker_engine`` fixture (no registry).
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.dockerd import DockerdFailed, DockerEngine, start_dockerd
from tests.mt.program import the_program
from tests.recording import record_while, wait_for
from tracer.cli import main
from tracer.events import ProbeSample
from tracer.outputs.text import Clock, verdict_table
from tracer.pipeline.record import RecordResult
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.root

MiB = 1024 * 1024


@pytest.fixture
def engine(docker_engine: DockerEngine, monkeypatch: pytest.MonkeyPatch) -> DockerEngine:
    """The session's dockerd, found by the recorder through DOCKER_HOST as a client would."""
    monkeypatch.setenv("DOCKER_HOST", docker_engine.host)
    return docker_engine


def compose_file(engine: DockerEngine, path: Path, services: str) -> None:
    (path / "docker-compose.yml").write_text(f'version: "2.4"\nservices:\n{services}')


def record_oom_loop(
    tmp_path: Path,
    engine: DockerEngine,
    prefix: str,
    command: list[str],
    restarts: int,
    volumes: tuple[str, ...] = (),
) -> tuple[RecordResult, str]:
    """A Compose service "hog" running ``command`` under mem_limit 32m (no swap) with restart:
    on-failure:``restarts``, recorded from its first start until Docker has restarted it that
    many times and it stays exited (Docker's RestartCount and OOMKilled checked): the result
    and the container's name."""
    project = engine.unique(prefix)
    compose_file(
        engine,
        tmp_path,
        f"""  hog:
    image: {engine.image}
    network_mode: none
    mem_limit: 32m
    memswap_limit: 32m
    restart: on-failure:{restarts}
    volumes: {json.dumps(list(volumes))}
    command: {json.dumps(command)}
""",
    )
    engine.compose(tmp_path, project, "up", "--no-start")
    name = f"{project}_hog_1"

    def start_and_wait() -> None:
        engine.compose(tmp_path, project, "start")

        def done() -> bool:
            st = engine.inspect(name)
            return st["State"]["Status"] == "exited" and st["RestartCount"] == restarts

        wait_for(done, 120, f"{restarts + 1} OOM kills and {restarts} restarts")

    try:
        # by its Compose service name: the label finds the one container of service "hog"
        res = record_while(tmp_path, "hog", start_and_wait)
        st = engine.inspect(name)
    finally:
        engine.compose(tmp_path, project, "down", "-t", "0", check=False)
    assert (st["RestartCount"], st["State"]["OOMKilled"], st["State"]["ExitCode"]) == (
        restarts,
        True,
        137,
    )
    return res, name


def test_compose_oom_restarts_are_cgroup_ooms_and_agree_with_docker(
    tmp_path: Path, engine: DockerEngine
) -> None:
    """restart: on-failure:3 with mem_limit 32m and a program that outgrows it: four OOM
    kills, three restarts, and Docker's RestartCount (3) agrees with the restarts linked."""
    awk = 'BEGIN { s = "xxxxxxxxxxxxxxxx"; while (1) s = s s }'
    res, name = record_oom_loop(tmp_path, engine, "wroom", ["awk", awk], 3)
    unit = f"docker {name}"
    assert [(v.cause, v.unit, v.main, v.confidence) for v in res.verdicts] == [
        ("cgroup_oom", unit, True, "high")
    ] * 4
    assert all(v.limit_bytes == 32 * MiB and v.limit_cgroup for v in res.verdicts)
    assert [(r.unit, r.cause) for r in res.restarts] == [(unit, "cgroup_oom")] * 3
    assert res.restart_counts == [(unit, 3, 3, "docker")]


def test_a_multithreaded_service_oom_killed_in_a_worker_is_one_cgroup_oom_per_run(
    tmp_path: Path, engine: DockerEngine, mtwork_static: Path
) -> None:
    """The twin of the test above with tests/mt/mtwork.c (mounted read-only) as the service:
    five threads, the last worker (wrk4) allocating until the OOM killer ends the process;
    restarted once: two runs, each one exit record and one cgroup_oom naming the program."""
    mount = f"{mtwork_static}:/mtwork:ro"
    res, name = record_oom_loop(
        tmp_path, engine, "wrmtoom", ["/mtwork", "oom", "5"], 1, volumes=(mount,)
    )
    runs = the_program(read_trace(res.path).events, res.verdicts, runs=2)
    unit = f"docker {name}"
    assert [(v.cause, v.unit, v.main, v.limit_bytes) for v, _ in runs] == [
        ("cgroup_oom", unit, True, 32 * MiB)
    ] * 2
    assert [ex.status for _, ex in runs] == [signal.SIGKILL] * 2
    assert len(res.verdicts) == 2
    assert [(r.unit, r.cause) for r in res.restarts] == [(unit, "cgroup_oom")]
    assert res.restart_counts == [(unit, 1, 1, "docker")]


def autoheal(engine: DockerEngine, name: str, first_start: str) -> bool:
    """What willfarrell/autoheal does for Compose: restart a container Docker marks unhealthy
    (``POST /containers/{id}/restart?t=2``). True once it has restarted it and it runs again."""
    st = engine.inspect(name)["State"]
    if st.get("Health", {}).get("Status") == "unhealthy" and st["StartedAt"] == first_start:
        engine.docker("restart", "-t", "2", name)
    return bool(st["StartedAt"] != first_start and st["Status"] == "running")


def test_compose_failing_healthcheck_then_restart_is_a_probe_kill(
    tmp_path: Path, engine: DockerEngine
) -> None:
    """The health check passes, then fails twice (unhealthy); the container is restarted
    through Docker, whose runc sends SIGTERM, then SIGKILL after 2 s (sleep as PID 1 ignores
    SIGTERM): a probe_kill, with the failed checks as evidence."""
    project = engine.unique("wrhealth")
    compose_file(
        engine,
        tmp_path,
        f"""  web:
    image: {engine.image}
    network_mode: none
    command: ["sh", "-c", "touch /tmp/ok; sleep 3; rm /tmp/ok; exec sleep 300"]
    healthcheck:
      test: ["CMD", "cat", "/tmp/ok"]
      interval: 1s
      timeout: 1s
      retries: 2
""",
    )
    engine.compose(tmp_path, project, "up", "--no-start")
    name = f"{project}_web_1"

    def run_and_heal() -> None:
        engine.compose(tmp_path, project, "start")
        st = engine.inspect(name)["State"]
        assert st["Status"] == "running", st
        wait_for(lambda: autoheal(engine, name, st["StartedAt"]), 120, "unhealthy, restarted")

    try:
        res = record_while(tmp_path, name, run_and_heal)
    finally:
        engine.compose(tmp_path, project, "down", "-t", "0", check=False)
    probes = [e for e in read_trace(res.path).events if isinstance(e, ProbeSample)]
    unit = f"docker {name}"
    assert probes and all(p.target == "healthcheck" and p.unit == unit for p in probes)
    assert probes[0].ok
    failed = [p for p in probes if not p.ok]
    assert len(failed) >= 2, probes  # (Docker keeps checking until the restart lands)
    main = [v for v in res.verdicts if v.main]
    assert [(v.cause, v.unit, v.signal, v.sender_role) for v in main] == [
        ("probe_kill", unit, "SIGKILL", "supervisor")
    ]
    assert sum("probe healthcheck" in what for _, what in main[0].evidence) >= 1
    assert [(r.unit, r.cause) for r in res.restarts] == [(unit, "probe_kill")]
    # Docker's RestartCount leaves out restarts it was asked for: said so, not a disagreement
    assert res.restart_counts == [(unit, 1, 0, "docker")]
    text = verdict_table(
        res.verdicts, Clock(res.header.started_ns, None), restart_counts=res.restart_counts
    )
    assert "1 of them not by its restart policy: a `docker restart`" in text
    assert "DISAGREES" not in text


def test_docker_stop_is_a_signal_kill_with_its_grace_period(
    tmp_path: Path, engine: DockerEngine
) -> None:
    name = engine.unique("wrstop")
    engine.docker("run", "-d", "--name", name, "--network", "none", engine.image, "sleep", "300")
    try:
        res = record_while(tmp_path, name, lambda: engine.docker("stop", "-t", "2", name) and None)
    finally:
        engine.docker("rm", "-f", name, check=False)
    main = [v for v in res.verdicts if v.main]
    assert [(v.cause, v.unit, v.sender_role) for v in main] == [
        ("signal_kill", f"docker {name}", "supervisor")
    ]
    m = re.search(r"SIGTERM, then SIGKILL (\d+\.\d) s later", main[0].summary)
    assert m is not None, main[0].summary
    assert float(m.group(1)) >= 2.0  # docker stop -t 2: the grace period, at least


def test_no_such_compose_service_or_container_is_a_clear_error(
    tmp_path: Path, engine: DockerEngine
) -> None:
    r = CliRunner().invoke(
        main, ["record", "-q", "-o", str(tmp_path / "x.trace"), "--container", "wr-no-such-svc"]
    )
    assert r.exit_code != 0
    assert "--container wr-no-such-svc: no such container" in r.output
    assert f"no container or Compose service 'wr-no-such-svc' at {engine.host}" in r.output
    assert "docker ps -a" in r.output
    assert "Traceback" not in r.output
    # and docker-compose itself, asked for a service the project lacks
    compose_file(engine, tmp_path, f"  web:\n    image: {engine.image}\n    network_mode: none\n")
    out = engine.compose(
        tmp_path, engine.unique("wrnone"), "up", "--no-start", "nosuch", check=False
    )
    assert out.returncode != 0 and "No such service: nosuch" in out.stderr


def test_a_dockerd_that_cannot_start_says_why(tmp_path: Path, docker_engine: DockerEngine) -> None:
    # (docker_engine: only where a dockerd can run at all)
    t0 = time.monotonic()
    with pytest.raises(DockerdFailed) as err:
        start_dockerd(extra_args=("--storage-driver=no-such",))
    assert "dockerd exited with 1" in str(err.value)
    # the daemon's own words, picked out of its log
    assert "failed to start daemon: error initializing graphdriver: driver not supported" in str(
        err.value
    )
    assert time.monotonic() - t0 < 90
