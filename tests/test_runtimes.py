"""Runtime clients (tracer.runtimes): podman CLI, Docker Engine API, systemd, the poller.

Tier 1 (no root): the parsers on real output captured on the development VM
(``tests/data/runtimes``: ``podman inspect`` from podman 4.3.1 with runc and cgroupfs, and the
same containers through podman's Docker-compatible API v1.41), the clients' failure paths
against stand-ins (a fake ``podman``/``systemctl`` script, a unix-socket HTTP server), and the
restart-count poller with an in-memory runtime. The ``systemctl show`` fixtures are written from
systemd's documented ``Key=value`` output: no systemd runs on the development VMs.

Tier ``root`` (real podman): containers from a busybox image built offline, in a store of
their own (``--root/--runroot/--tmpdir`` under a temp dir, ``CONTAINERS_CONF`` pointing at
``tests/data/runtimes/containers.conf``), so nothing touches the host's default store; every
container, image, mount and the store itself are removed in teardown. The Docker client is
tested against ``podman system service`` serving the Docker API on a unix socket.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import shutil
import socket
import socketserver
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.containers import podman_container, systemd_unit
from tests.serving import serving
from tracer.analysis.units import unit_of_cgroup
from tracer.parse.cgroup import memory_path
from tracer.parse.systemd import parse_systemctl_show
from tracer.runtimes import (
    ContainerInfo,
    DockerRuntime,
    PodmanRuntime,
    RestartCountError,
    RestartCountPoller,
    RestartCountSample,
    Runtime,
    SystemdRuntime,
    detect,
)
from tracer.runtimes.base import k8s_names, restart_policy_text
from tracer.runtimes.docker import docker_hosts, info_from_docker_inspect
from tracer.runtimes.podman import info_from_podman_inspect
from tracer.runtimes.systemd import info_from_systemctl_show, unit_cgroup_path

DATA = Path(__file__).parent / "data" / "runtimes"
CONTAINERS_CONF = DATA / "containers.conf"

# The containers in the fixtures (captured together, so the Docker API files describe the
# same containers as the podman ones).
EXITED_ID = "155ba686a160a7a606c1661a81f2dd20e2f5a268d499ece6767bd3c7c8fed055"
HEALTH_ID = "dc73314a3f56a2e9d63cd66d248e4fcb2db23574ee2ae592a662f3f3fb03f409"
OOM_ID = "537f88ee40b2add2d2733b9b23db617751f4310657268051b6b0c614fb155950"


def _load(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def _wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


# =============================================================================================
# Tier 1: parsers on real output


def test_podman_inspect_exited_with_restarts() -> None:
    info = info_from_podman_inspect(_load("podman_inspect_exited_restart.json")[0])
    assert info == podman_container(
        EXITED_ID,
        "t1",
        image="localhost/bb:test",
        # how the last run ended: exit 3 at FinishedAt (RFC 3339 with nanoseconds, the values
        # worked out with datetime by hand)
        exit_code=3,
        started_ns=1796042285561505333,
        finished_ns=1796042285584425170,
        command="sh",
    )


def test_podman_inspect_running_with_healthcheck() -> None:
    info = info_from_podman_inspect(_load("podman_inspect_running_health.json")[0])
    assert info is not None
    assert info.id == HEALTH_ID and info.name == "t4"
    assert info.state == "running" and info.pid == 25621
    assert info.cgroup_path == f"/libpod_parent/libpod-{HEALTH_ID}"
    assert info.healthcheck == ("CMD-SHELL", "cat /etc/hostname")
    assert info.restart_policy == "no"  # podman leaves RestartPolicy.Name "" without --restart
    assert info.restart_count == 0
    unit = unit_of_cgroup(info.cgroup_path)
    assert unit is not None and (unit.kind, unit.key) == ("podman", HEALTH_ID)


def test_podman_inspect_oom_claim_kept() -> None:
    # A real cgroup OOM kill (the kernel log said CONSTRAINT_MEMCG for this container's memcg,
    # exit 137), yet podman 4.3 says OOMKilled=false: the claim is recorded as it is.
    doc = _load("podman_inspect_oom.json")[0]
    assert doc["State"]["ExitCode"] == 137
    info = info_from_podman_inspect(doc)
    assert info is not None and info.id == OOM_ID
    assert info.oom_killed is False
    assert info.state == "exited"


def test_docker_api_same_containers() -> None:
    for podman_file, docker_file in [
        ("podman_inspect_exited_restart.json", "docker_api_exited_restart.json"),
        ("podman_inspect_running_health.json", "docker_api_running_health.json"),
        ("podman_inspect_oom.json", "docker_api_oom.json"),
    ]:
        p = info_from_podman_inspect(_load(podman_file)[0])
        d = info_from_docker_inspect(_load(docker_file))
        assert p is not None and d is not None
        assert d.runtime == "docker"
        assert d.name == p.name  # Docker's "/t1" loses its slash
        assert d.cgroup_path is None  # the Engine API has no cgroup path
        for field in ("id", "pid", "restart_count", "restart_policy", "healthcheck", "image",
                      "state", "oom_killed"):  # fmt: skip
            assert getattr(d, field) == getattr(p, field), field


def test_docker_api_label_runtime_name() -> None:
    info = info_from_docker_inspect(_load("docker_api_exited_restart.json"), runtime="podman")
    assert info is not None and info.runtime == "podman"


def test_docker_k8s_names_from_labels_and_name() -> None:
    doc = _load("docker_api_running_health.json")
    doc["Name"] = "/k8s_server_llm-7d9f_serving_0f6c2a4e-1b2c-4d5e-8f90-123456789abc_3"
    info = info_from_docker_inspect(doc)
    assert info is not None and (info.pod, info.namespace) == ("llm-7d9f", "serving")
    doc["Config"]["Labels"] = {
        "io.kubernetes.pod.name": "llm-abc",
        "io.kubernetes.pod.namespace": "prod",
    }
    info = info_from_docker_inspect(doc)
    assert info is not None and (info.pod, info.namespace) == ("llm-abc", "prod")
    assert k8s_names("web", None) == (None, None)
    assert k8s_names("x", {"io.kubernetes.pod.name": "p"}) == ("p", None)


@pytest.mark.parametrize("parse", [info_from_podman_inspect, info_from_docker_inspect])
def test_inspect_parsers_tolerate_junk(parse: Callable[[Any], ContainerInfo | None]) -> None:
    assert parse({}) is None
    assert parse({"Id": 7}) is None
    info = parse(
        {
            "Id": "abc",
            "State": None,
            "Config": {"Healthcheck": {"Test": ["NONE"]}, "Labels": None},
            "HostConfig": {"RestartPolicy": {"Name": "always", "MaximumRetryCount": 0}},
            "RestartCount": True,  # not a count
        }
    )
    assert info is not None
    assert (info.id, info.pid, info.state, info.restart_count) == ("abc", 0, "", None)
    assert info.healthcheck is None  # ["NONE"] disables an image's HEALTHCHECK
    assert info.restart_policy == "always"
    assert info.oom_killed is None


def test_restart_policy_text() -> None:
    assert restart_policy_text({}) == "no"
    assert restart_policy_text({"Name": "", "MaximumRetryCount": 0}) == "no"
    assert restart_policy_text({"Name": "on-failure", "MaximumRetryCount": 0}) == "on-failure"
    assert restart_policy_text({"Name": "on-failure", "MaximumRetryCount": 5}) == "on-failure:5"
    assert restart_policy_text({"Name": "unless-stopped"}) == "unless-stopped"


def test_parse_proc_cgroup() -> None:
    hybrid = (  # a podman container's init on the development VM (v1 memory, hybrid)
        "9:name=systemd:/libpod_parent/libpod-4dc2\n"
        "8:pids:/libpod_parent/libpod-4dc2\n"
        "4:memory:/libpod_parent/libpod-4dc2\n"
        "3:cpuset:/libpod_parent/libpod-4dc2\n"
        "1:cpu:/libpod_parent/libpod-4dc2\n"
        "0::/libpod_parent/libpod-4dc2\n"
    )
    assert memory_path(hybrid) == "/libpod_parent/libpod-4dc2"
    # Memory controller co-mounted with others (Debian 9 style "cpu,cpuacct,memory" is rare,
    # but the controller list is comma separated).
    assert memory_path("5:blkio,memory:/docker/abc\n0::/\n") == "/docker/abc"
    v2 = "0::/system.slice/docker-4c0d3b8a1f2e.scope\n"
    assert memory_path(v2) == "/system.slice/docker-4c0d3b8a1f2e.scope"
    assert memory_path("") is None
    assert memory_path("garbage\n9:name=systemd:/x\n") is None


# =============================================================================================
# Tier 1: the podman client against a stand-in CLI


def _fake_cli(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def test_podman_cli_passes_globals_env_and_parses(tmp_path: Path) -> None:
    fixture = DATA / "podman_inspect_running_health.json"
    record = tmp_path / "argv"
    podman = _fake_cli(
        tmp_path,
        "podman",
        f'printf "%s\\n" "$@" > {record}; echo "conf=$CONTAINERS_CONF" >> {record}\n'
        f"cat {fixture}\n",
    )
    # A proc tree in which the container's pid sits in a different cgroup than podman said:
    # the kernel's word wins.
    proc = tmp_path / "proc"
    (proc / "25621").mkdir(parents=True)
    (proc / "25621" / "cgroup").write_text("4:memory:/from/proc\n0::/\n")
    rt = PodmanRuntime(
        podman,
        global_args=["--root", "/r", "--runroot", "/rr"],
        env={"CONTAINERS_CONF": "/c.conf"},
        proc_root=str(proc),
    )
    assert rt.available()
    info = rt.find("t4")
    assert info is not None and info.id == HEALTH_ID
    assert info.cgroup_path == "/from/proc"
    assert rt.last_error is None
    argv = record.read_text().splitlines()
    assert argv == [
        "--root", "/r", "--runroot", "/rr", "inspect", "--type", "container", "--", "t4",
        "conf=/c.conf",
    ]  # fmt: skip
    # by_id: the id (or a prefix) answers, a name does not.
    assert rt.by_id(HEALTH_ID[:12]) is not None
    assert rt.by_id("t4") is None and rt.last_error is not None
    assert rt.restart_count(HEALTH_ID) == 0
    # Without a readable /proc entry podman's CgroupPath stays.
    rt2 = PodmanRuntime(podman, proc_root=str(tmp_path / "noproc"))
    info2 = rt2.find("t4")
    assert info2 is not None and info2.cgroup_path == f"/libpod_parent/libpod-{HEALTH_ID}"


def test_podman_cli_failures_are_none_with_reason(tmp_path: Path) -> None:
    missing = _fake_cli(
        tmp_path,
        "podman-missing",
        'echo "[]"; echo "Error: inspecting object: no such container $5" >&2; exit 125\n',
    )
    rt = PodmanRuntime(missing)
    assert rt.find("ghost") is None
    assert rt.last_error == "podman: no container 'ghost'"
    assert rt.restart_count("ghost") is None

    hung = _fake_cli(tmp_path, "podman-hung", "exec sleep 30\n")
    rt = PodmanRuntime(hung, timeout_s=0.2)
    assert rt.find("x") is None
    assert rt.last_error is not None and "timed out after 0.2 s" in rt.last_error

    garbage = _fake_cli(tmp_path, "podman-garbage", "echo 'not json'\n")
    rt = PodmanRuntime(garbage)
    assert rt.find("x") is None
    assert rt.last_error is not None and "no JSON" in rt.last_error

    broken = _fake_cli(
        tmp_path, "podman-broken", "echo 'Error: database is locked' >&2; exit 125\n"
    )
    rt = PodmanRuntime(broken)
    assert rt.find("x") is None
    assert rt.last_error is not None and "database is locked" in rt.last_error

    rt = PodmanRuntime(str(tmp_path / "no-such-podman"))
    assert not rt.available()
    assert rt.find("x") is None
    assert rt.last_error is not None and "could not run" in rt.last_error
    assert rt.find("  ") is None


# =============================================================================================
# Tier 1: the Docker client against a unix-socket HTTP server


class _UnixHTTPServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False
    routes: dict[str, tuple[int, bytes]]
    delay_s: float = 0.0
    paths: list[str]


class _UnixHandler(http.server.BaseHTTPRequestHandler):
    server: _UnixHTTPServer

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        if self.server.delay_s:
            time.sleep(self.server.delay_s)
        status, body = self.server.routes.get(self.path, (404, b'{"message":"no such container"}'))
        with contextlib.suppress(OSError):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def address_string(self) -> str:
        return "unix"  # the base class indexes client_address, which is "" on unix sockets

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake_docker() -> Iterator[_UnixHTTPServer]:
    # /tmp, not tmp_path: a unix socket path must fit in 108 bytes.
    d = tempfile.mkdtemp(prefix="wr-dock-")
    srv = _UnixHTTPServer(os.path.join(d, "docker.sock"), _UnixHandler)
    srv.routes, srv.paths = {}, []
    with serving(srv):
        yield srv
    shutil.rmtree(d, ignore_errors=True)


def test_docker_client_fake_server(fake_docker: _UnixHTTPServer) -> None:
    body = (DATA / "docker_api_exited_restart.json").read_bytes()
    fake_docker.routes = {
        "/_ping": (200, b"OK"),
        "/containers/t1/json": (200, body),
        f"/containers/{EXITED_ID[:12]}/json": (200, body),
        "/containers/broken/json": (500, b'{"message":"boltdb: database not open"}'),
        "/containers/garbage/json": (200, b"<html>"),
        "/containers/a%2Fb%20c/json": (200, body),
    }
    sock = str(fake_docker.server_address)
    rt = DockerRuntime(sock)
    assert rt.available()
    info = rt.find("/t1")  # as `docker inspect` shows names
    assert info is not None and (info.id, info.name, info.restart_count) == (EXITED_ID, "t1", 2)
    assert rt.last_error is None
    assert rt.by_id(EXITED_ID[:12]) is not None
    assert rt.restart_count(EXITED_ID[:12]) == 2
    assert rt.find("a/b c") is not None  # quoted into one path segment
    assert rt.find("ghost") is None
    assert rt.last_error == f"docker: no container or Compose service 'ghost' at unix://{sock}"
    assert rt.find("broken") is None
    assert rt.last_error is not None and "500" in rt.last_error and "boltdb" in rt.last_error
    assert rt.find("garbage") is None
    assert rt.last_error is not None and "non-JSON" in rt.last_error

    pinned = DockerRuntime(sock, api_version="1.41")
    pinned.find("t1")
    assert fake_docker.paths[-2] == "/v1.41/containers/t1/json"  # (then the Compose label)


def _compose_query(service: str) -> str:
    filters = json.dumps({"label": [f"com.docker.compose.service={service}"]})
    return f"/containers/json?all=1&filters={urllib.parse.quote(filters)}"


def test_docker_finds_a_compose_service_by_its_name(fake_docker: _UnixHTTPServer) -> None:
    body = (DATA / "docker_api_exited_restart.json").read_bytes()
    fake_docker.routes = {
        "/_ping": (200, b"OK"),
        _compose_query("web"): (
            200,
            json.dumps([{"Id": EXITED_ID, "Names": ["/p_web_1"]}]).encode(),
        ),
        f"/containers/{EXITED_ID}/json": (200, body),
        _compose_query("db"): (
            200,
            json.dumps(
                [{"Id": "a" * 64, "Names": ["/p_db_2"]}, {"Id": "b" * 64, "Names": ["/p_db_1"]}]
            ).encode(),
        ),
        _compose_query("gone"): (200, b"[]"),
    }
    rt = DockerRuntime(str(fake_docker.server_address))
    info = rt.find("web")  # no container named "web": the one container of service "web"
    assert info is not None and info.id == EXITED_ID and rt.last_error is None
    assert rt.find("db") is None
    assert rt.last_error == (
        "docker: Compose service 'db' has 2 containers (p_db_1, p_db_2): name one of them"
    )
    assert rt.find("gone") is None
    assert rt.last_error is not None and "no container or Compose service 'gone'" in rt.last_error


def test_docker_hosts_follow_the_docker_client(tmp_path: Path) -> None:
    run_user = tmp_path / "run-user"
    for uid in ("1000", "1001"):
        (run_user / uid).mkdir(parents=True)
        (run_user / uid / "docker.sock").write_text("")
    system = "unix:///var/run/docker.sock"
    rootless = [f"unix://{run_user}/1000/docker.sock", f"unix://{run_user}/1001/docker.sock"]
    home = tmp_path / "home"
    # DOCKER_HOST wins alone, whatever it names
    assert docker_hosts({"DOCKER_HOST": "unix:///x.sock"}, run_user=str(run_user)) == [
        "unix:///x.sock"
    ]
    assert docker_hosts({}, run_user=str(run_user), home=str(home)) == [system, *rootless]
    # the invoking user's rootless daemon first among the rootless ones
    assert docker_hosts({"SUDO_UID": "1001"}, run_user=str(run_user), home=str(home)) == [
        system,
        rootless[1],
        rootless[0],
    ]
    # the current context, as `docker context use` stores it
    meta = home / ".docker" / "contexts" / "meta" / hashlib.sha256(b"rootless").hexdigest()
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(
        json.dumps({"Name": "rootless", "Endpoints": {"docker": {"Host": "unix:///r.sock"}}})
    )
    (home / ".docker" / "config.json").write_text(json.dumps({"currentContext": "rootless"}))
    assert docker_hosts({}, run_user=str(run_user), home=str(home))[:2] == [
        "unix:///r.sock",
        system,
    ]
    assert (
        docker_hosts({"DOCKER_CONTEXT": "default"}, run_user=str(run_user), home=str(home))[0]
        == system
    )


def test_docker_says_why_it_does_not_answer(tmp_path: Path) -> None:
    tcp = DockerRuntime.for_host("tcp://10.0.0.1:2375")
    assert not tcp.available()
    assert tcp.last_error is not None and "only unix:// sockets are supported" in tcp.last_error
    d = tempfile.mkdtemp(prefix="wr-dead-")
    try:
        # a socket file nobody listens on: what a crashed dockerd leaves behind
        dead = os.path.join(d, "docker.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(dead)
        s.close()
        rt = DockerRuntime.for_host(f"unix://{dead}")
        assert not rt.available()
        assert rt.last_error == f"docker at unix://{dead}: Connection refused (is dockerd running?)"
    finally:
        shutil.rmtree(d, ignore_errors=True)
    missing = DockerRuntime(str(tmp_path / "none.sock"))
    assert not missing.available()
    assert missing.last_error == f"docker at unix://{tmp_path}/none.sock: no socket there"


def test_container_error_names_the_dead_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracer.errors import UsageError
    from tracer.pipeline.follow import Follower

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/gone.sock")
    with pytest.raises(UsageError) as err:
        Follower(["web"], None, lambda _cid: None)
    text = str(err.value)
    assert "--container web" in text and f"docker at unix://{tmp_path}/gone.sock" in text
    assert "DOCKER_HOST" in text or "podman" in text


def test_docker_client_timeout_and_no_socket(fake_docker: _UnixHTTPServer, tmp_path: Path) -> None:
    fake_docker.delay_s = 1.0
    rt = DockerRuntime(str(fake_docker.server_address), timeout_s=0.1)
    assert rt.find("t1") is None
    assert rt.last_error is not None and "timed out" in rt.last_error
    assert not rt.available()

    gone = DockerRuntime(str(tmp_path / "docker.sock"))
    assert not gone.available()
    assert gone.find("t1") is None
    assert gone.last_error is not None and "No such file" in gone.last_error

    not_a_socket = tmp_path / "file.sock"
    not_a_socket.write_text("")
    assert not DockerRuntime(str(not_a_socket)).available()


# =============================================================================================
# Tier 1: systemd


def test_systemctl_show_parser() -> None:
    props = parse_systemctl_show((DATA / "systemctl_show_oom_restarting.txt").read_text())
    info = info_from_systemctl_show("model-server", props)
    # (this capture has no ExecMain* properties: no exit, no times)
    assert info == systemd_unit(
        "model-server.service",
        restart_count=3,
        oom_killed=True,  # Result=oom-kill: systemd's claim
        cgroup_when_started="/system.slice/model-server.service",
    )
    running = info_from_systemctl_show(
        "nginx", parse_systemctl_show((DATA / "systemctl_show_running.txt").read_text())
    )
    assert running is not None
    assert (running.pid, running.restart_count, running.oom_killed) == (4242, 0, False)
    assert running.restart_policy == "always" and running.state == "active"
    unit = unit_of_cgroup(running.cgroup_path)
    assert unit is not None and (unit.kind, unit.key) == ("systemd", "nginx.service")
    not_found = parse_systemctl_show((DATA / "systemctl_show_not_found.txt").read_text())
    assert info_from_systemctl_show("nope", not_found) is None
    # Before systemd v235 there is no NRestarts: no count, not zero.
    old = dict(props)
    del old["NRestarts"]
    old_info = info_from_systemctl_show("model-server", old)
    assert old_info is not None and old_info.restart_count is None
    assert parse_systemctl_show("junk line\nA=b=c\n") == {"A": "b=c"}
    # how the main process last ended (systemd >= v232 property names): killed by signal 9
    killed = dict(props)
    killed.update(
        ExecMainCode="2",
        ExecMainStatus="9",
        ExecMainPID="5150",
        ExecMainStartTimestampMonotonic="1000000",
        ExecMainExitTimestampMonotonic="2500000",
    )
    k = info_from_systemctl_show("model-server", killed)
    assert k is not None
    assert (k.exit_code, k.exit_pid, k.started_ns, k.finished_ns) == (137, 5150, 10**9, 25 * 10**8)
    exited = {**killed, "ExecMainCode": "1", "ExecMainStatus": "42"}
    e = info_from_systemctl_show("model-server", exited)
    assert e is not None and e.exit_code == 42
    never = {**killed, "ExecMainExitTimestampMonotonic": "0"}
    n = info_from_systemctl_show("model-server", never)
    assert n is not None and (n.exit_code, n.finished_ns, n.exit_pid) == (None, None, 0)


def test_a_stopped_unit_is_followed_where_its_slice_puts_it() -> None:
    """Between restarts (and before the first start) ControlGroup is empty; the unit's
    cgroup will be at its slice's path: every dash-prefix of a slice is its parent."""
    assert unit_cgroup_path("hog.service", "system.slice") == "/system.slice/hog.service"
    assert unit_cgroup_path("a.service", "wr-x-y.slice") == (
        "/wr.slice/wr-x.slice/wr-x-y.slice/a.service"
    )
    assert unit_cgroup_path("init.scope", "-.slice") == "/init.scope"
    for bad in ("", "system", "a--b.slice", "-a.slice", "../x.slice"):
        assert unit_cgroup_path("a.service", bad) is None, bad
    stopped = {
        "Id": "hog.service",
        "LoadState": "loaded",
        "ActiveState": "inactive",
        "ControlGroup": "",
        "Slice": "ml.slice",
        "NRestarts": "0",
    }
    info = info_from_systemctl_show("hog", stopped)
    assert info is not None and (info.cgroup_path, info.cgroup_when_started) == (
        None,
        "/ml.slice/hog.service",
    )


def test_unit_followed_across_restarts_with_systemds_count(tmp_path: Path) -> None:
    """--unit: the unit's cgroup path is followed from before it starts (a mkdir there is
    ours, wherever the id), its restart count is polled from systemd under the label its
    processes get, and execs in it are the unit's own, never health checks."""
    from tracer.errors import UsageError
    from tracer.events import CgroupMkdir, Exec
    from tracer.pipeline.follow import Follower

    systemctl = _fake_cli(
        tmp_path,
        "systemctl",
        "printf 'Id=hog.service\\nLoadState=loaded\\nActiveState=inactive\\nControlGroup=\\n"
        "Slice=system.slice\\nNRestarts=2\\nRestart=on-failure\\nResult=oom-kill\\n"
        "ExecMainCode=2\\nExecMainStatus=9\\nExecMainExitTimestampMonotonic=5\\n'\n",
    )
    rt = SystemdRuntime(systemctl, run_dir=str(tmp_path))
    f = Follower([], None, lambda _cid: None, runtimes=[rt], units=["hog"])
    assert f.following and f.initial_cgroups() == []
    assert f.follow_paths() == ["/system.slice/hog.service"]
    mkdir = CgroupMkdir(ts=5, cgroup_id=77, path="/system.slice/hog.service", level=2)
    assert f.on_events([mkdir]) == ([], [77])
    other = CgroupMkdir(ts=6, cgroup_id=78, path="/system.slice/x.service", level=2)
    assert f.on_events([other]) == ([], [])
    execs = [Exec(ts=7 + i, pid=100 + i, comm="awk", filename="/usr/bin/awk", cgroup_id=77)
             for i in range(2)]  # fmt: skip
    assert f.on_events(execs) == ([], [])
    f.poller.watch(f.followed[0].label, rt, "hog.service")
    f.poller.poll_once()
    # with systemd's record of the last exit: SIGKILL (137), Result=oom-kill
    assert [tuple(s)[1:] for s in f.poller.poll()] == [
        ("systemd hog.service", "systemd", 2, 137, True)
    ]
    with pytest.raises(UsageError, match="--unit nope: systemd is not running here"):
        Follower([], None, lambda _cid: None, runtimes=[], units=["nope"])
    gone = _fake_cli(tmp_path, "systemctl-nf", f"cat {DATA / 'systemctl_show_not_found.txt'}\n")
    with pytest.raises(UsageError, match=r"--unit nope: systemd: no unit 'nope\.service'"):
        Follower(
            [],
            None,
            lambda _cid: None,
            runtimes=[SystemdRuntime(gone, run_dir=str(tmp_path))],
            units=["nope"],
        )


def test_systemd_not_available_here_or_without_run_dir(tmp_path: Path) -> None:
    rt = SystemdRuntime(run_dir=str(tmp_path / "no-systemd"))
    assert not rt.available()
    if not os.path.isdir("/run/systemd/system"):
        assert not SystemdRuntime().available()  # this machine: systemd is not PID 1


def test_systemd_client_with_stand_in(tmp_path: Path) -> None:
    record = tmp_path / "argv"
    systemctl = _fake_cli(
        tmp_path,
        "systemctl",
        f'printf "%s\\n" "$@" > {record}\n'
        f'case "$5" in\n'
        f"  nginx.service) cat {DATA / 'systemctl_show_running.txt'} ;;\n"
        f"  *) cat {DATA / 'systemctl_show_not_found.txt'} ;;\n"
        f"esac\n",
    )
    rt = SystemdRuntime(systemctl, run_dir=str(tmp_path))
    assert rt.available()
    info = rt.find("nginx")
    assert info is not None and info.id == "nginx.service" and info.pid == 4242
    assert record.read_text().splitlines()[:2] == ["show", "-p"]
    assert record.read_text().splitlines()[-1] == "nginx.service"
    assert rt.restart_count("nginx.service") == 0
    assert rt.find("nope") is None and rt.last_error == "systemd: no unit 'nope.service'"

    no_pid1 = _fake_cli(
        tmp_path,
        "systemctl-nopid1",
        'echo "System has not been booted with systemd as init system (PID 1)." >&2\nexit 1\n',
    )
    rt = SystemdRuntime(no_pid1, run_dir=str(tmp_path))
    assert rt.find("nginx") is None
    assert rt.last_error is not None and "not been booted with systemd" in rt.last_error


def test_detect_returns_only_available(tmp_path: Path) -> None:
    found = detect(docker_socket=str(tmp_path / "no.sock"))
    assert all(isinstance(rt, Runtime) and rt.available() for rt in found)
    assert "docker" not in [rt.name for rt in found]
    assert ("podman" in [rt.name for rt in found]) == (shutil.which("podman") is not None)


# =============================================================================================
# Tier 1: the restart-count poller with an in-memory runtime


class _MemRuntime(Runtime):
    """Counts set by the test; ``gate`` can hold a lookup to prove callers never wait."""

    name = "mem"

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.running: dict[str, int] = {}  # id -> main pid (its cgroup: /docker/<id>)
        self.raise_for: set[str] = set()
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def available(self) -> bool:
        return True

    def find(self, name_or_id: str) -> ContainerInfo | None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if name_or_id in self.raise_for:
            raise RuntimeError("client bug")
        if name_or_id not in self.counts:
            self._fail(f"mem: no container {name_or_id!r}", quiet=True)
            return None
        self._ok()
        pid = self.running.get(name_or_id, 0)
        path = f"/docker/{name_or_id}" if pid else None
        return ContainerInfo("mem", name_or_id, name_or_id, path, pid, self.counts[name_or_id],
                             "always", None, "", "running", None)  # fmt: skip


def test_containers_seen_only_being_created_are_not_polled() -> None:
    """cgroup_mkdir is reported for every cgroup on the host while containers are followed:
    another user's container is named, but its restart count is polled only once a process
    of ours runs in it (it stayed out of the recording's restart counts)."""
    from tracer.pipeline.follow import Follower

    rt = _MemRuntime()
    mine, theirs = "a" * 64, "b" * 64
    rt.counts = {mine: 0, theirs: 0}
    f = Follower([], None, lambda _cid: None, runtimes=[rt])
    seen = f.name(1, f"/docker/{theirs}", 0, created=True)
    assert seen is not None and seen.unit_id == theirs
    f.poller.poll_once()
    assert f.poller.poll() == []
    assert f.name(2, f"/docker/{mine}", 0) is not None  # named by a process event
    f.name(3, f"/docker/{'c' * 64}", 0, created=True)
    f.poller.poll_once()
    assert [s.unit for s in f.poller.poll()] == [f"mem {mine}"]
    f.running_in(1)
    f.poller.poll_once()
    assert [s.unit for s in f.poller.poll()] == [f"mem {theirs}"]


def test_a_cgroup_seen_being_created_takes_its_main_process_from_the_kernel() -> None:
    """A crash-looping container gets a new cgroup at the same path for every run, and the
    runtime, asked a moment after the mkdir, may already describe the next run: its pid must
    not name the main process of the cgroup just made (its real main process then looked
    exec'd in: a main exit and a restart link went missing). A cgroup that was there before
    (named by a process event) still takes the runtime's pid."""
    from tracer.pipeline.follow import Follower

    rt = _MemRuntime()
    cid = "a" * 64
    rt.counts, rt.running = {cid: 7}, {cid: 4242}
    made = Follower([], None, lambda _cid: None, runtimes=[rt]).name(
        1, f"/docker/{cid}", 0, created=True
    )
    assert made is not None and (made.unit_id, made.main_pid) == (cid, 0)
    there = Follower([], None, lambda _cid: None, runtimes=[rt]).name(2, f"/docker/{cid}", 0)
    assert there is not None and (there.unit_id, there.main_pid) == (cid, 4242)


def test_a_runtimes_late_answer_about_a_recreated_cgroup_names_no_main_process() -> None:
    """The runtime answers a moment after the cgroup was seen (a run OOM-killed within 100 ms
    of its start): when the path holds a new cgroup by then, the pid it gives is the next run's
    and must not be this cgroup's main process."""
    from tracer.pipeline.follow import Follower

    rt = _MemRuntime()
    cid = "a" * 64
    rt.counts, rt.running = {cid: 1}, {cid: 4242}
    path = f"/docker/{cid}"
    moved = Follower([], None, lambda _cid: None, runtimes=[rt], id_now=lambda _p: 99)
    info = moved.name(1, path, 0)
    assert info is not None and (info.unit_id, info.main_pid) == (cid, 0)
    still = Follower([], None, lambda _cid: None, runtimes=[rt], id_now=lambda _p: 1)
    info = still.name(1, path, 0)
    assert info is not None and info.main_pid == 4242


def _clock() -> Callable[[], int]:
    ticks = iter(range(1, 1_000_000))
    return lambda: next(ticks)


def test_poll_soon_makes_the_next_pass_now() -> None:
    """A followed unit's process ended: the poller asks at once, not at its interval."""
    rt = _MemRuntime()
    rt.counts = {"aaa": 0}
    poller = RestartCountPoller(interval_s=3600.0)
    poller.watch("web", rt, "aaa")
    with poller:
        wait = time.monotonic() + 10
        while not poller.poll() and time.monotonic() < wait:  # the first pass
            time.sleep(0.01)
        rt.counts["aaa"] = 1
        poller.poll_soon()
        got: list[RestartCountSample] = []
        while not got and time.monotonic() < wait:
            time.sleep(0.01)
            got = poller.poll()
    assert [(s.unit, s.restart_count) for s in got] == [("web", 1)]


def test_poller_changes_only_and_errors_once() -> None:
    rt = _MemRuntime()
    rt.counts = {"aaa": 0, "bbb": 5}
    poller = RestartCountPoller(interval_s=1.0, clock=_clock())
    poller.watch("web", rt, "aaa")
    poller.watch("db", rt, "bbb")
    poller.poll_once()
    assert poller.poll() == [
        RestartCountSample(1, "web", "mem", 0),
        RestartCountSample(2, "db", "mem", 5),
    ]
    poller.poll_once()
    assert poller.poll() == []  # nothing changed
    rt.counts["aaa"] = 1
    del rt.counts["bbb"]  # the db container disappeared
    poller.poll_once()
    poller.poll_once()
    samples = poller.poll()
    assert [(s.unit, s.restart_count) for s in samples] == [("web", 1)]
    errors = poller.errors()
    assert errors == [RestartCountError(errors[0].ts, "db", "mem", "mem: no container 'bbb'")]
    rt.raise_for.add("aaa")  # a runtime that breaks its promise does not stop polling
    poller.poll_once()
    assert [e.message for e in poller.errors()] == ["RuntimeError: client bug"]
    rt.raise_for.clear()
    rt.counts["bbb"] = 5  # back: an error resets, the count was not seen changing
    poller.poll_once()
    assert poller.poll() == []
    poller.unwatch("web")
    rt.counts["aaa"] = 9
    poller.poll_once()
    assert poller.poll() == []
    assert poller.dropped == 0


def test_poller_every_sample_when_asked() -> None:
    rt = _MemRuntime()
    rt.counts = {"aaa": 2}
    poller = RestartCountPoller(changes_only=False, clock=_clock())
    poller.watch("web", rt, "aaa")
    poller.poll_once()
    poller.poll_once()
    assert [s.restart_count for s in poller.poll()] == [2, 2]


def test_poller_bounded_queue() -> None:
    rt = _MemRuntime()
    poller = RestartCountPoller(changes_only=False, max_queue=3, clock=_clock())
    rt.counts = {"aaa": 0}
    poller.watch("web", rt, "aaa")
    for _ in range(5):
        poller.poll_once()
    samples = poller.poll()
    assert [s.ts for s in samples] == [3, 4, 5]  # the newest kept
    assert poller.dropped == 2


def test_poller_thread_never_blocks_caller_and_final_pass() -> None:
    rt = _MemRuntime()
    rt.counts = {"aaa": 0}
    rt.gate = threading.Event()
    poller = RestartCountPoller(interval_s=0.01)
    poller.watch("web", rt, "aaa")
    poller.start()
    assert rt.entered.wait(10)  # the thread is now stuck inside the runtime
    done = threading.Event()

    def caller() -> None:
        poller.poll()
        poller.errors()
        poller.watch("db", rt, "aaa")
        poller.unwatch("db")
        done.set()

    threading.Thread(target=caller, daemon=True).start()
    assert done.wait(10), "poll()/watch() waited on a runtime lookup"
    rt.gate.set()
    rt.gate = None
    _wait_for(lambda: bool(poller.poll()), 10, "a first sample")
    rt.counts["aaa"] = 4  # changed just before stop: the final pass must see it
    poller.stop()
    assert [s.restart_count for s in poller.poll()][-1:] == [4]


# =============================================================================================
# Tier root: real podman


BUSYBOX_APPLETS = ("sh", "sleep", "echo", "cat", "kill", "true", "false", "yes", "dd", "head")


class Podman:
    """The podman CLI bound to one isolated store."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.global_args = [
            "--root", f"{base}/storage",
            "--runroot", f"{base}/run",
            "--tmpdir", f"{base}/tmp",  # podman's events file and exit files live here
        ]  # fmt: skip
        self.env = {"CONTAINERS_CONF": str(CONTAINERS_CONF)}
        self.image = "localhost/whyrestart-busybox:test"

    def __call__(self, *args: str, timeout: float = 60, check: bool = True) -> str:
        proc = subprocess.run(
            ["podman", *self.global_args, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **self.env},
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc.stdout.strip()

    def runtime(self) -> PodmanRuntime:
        return PodmanRuntime(global_args=self.global_args, env=self.env, timeout_s=20)

    def service(self, socket_path: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["podman", *self.global_args, "system", "service", "--time=0", f"unix://{socket_path}"],
            env={**os.environ, **self.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def _podman_reason() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed"
    if shutil.which("busybox") is None:
        return "busybox (Debian busybox-static) is not installed: no offline image"
    return None


def _unmount_under(base: str) -> None:
    """Unmount whatever podman left mounted under ``base`` (overlay bind-mounts its own
    storage directory), deepest first, so the tree can be deleted."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in sorted((p for p in points if p.startswith(base + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


@pytest.fixture(scope="module")
def podman() -> Iterator[Podman]:
    reason = _podman_reason()
    if reason:
        pytest.skip(reason)
    base = tempfile.mkdtemp(prefix="wr-podman-")  # short: the service socket lives here
    pm = Podman(base)
    try:
        rootfs = Path(base, "rootfs")
        (rootfs / "bin").mkdir(parents=True)
        busybox = shutil.which("busybox")
        assert busybox is not None
        shutil.copy2(busybox, rootfs / "bin" / "busybox")
        for applet in BUSYBOX_APPLETS:
            (rootfs / "bin" / applet).symlink_to("busybox")
        tarball = Path(base, "rootfs.tar")
        with tarfile.open(tarball, "w") as tar:
            tar.add(rootfs, arcname=".")
        pm("import", str(tarball), pm.image)
        yield pm
    finally:
        pm("rm", "--all", "--force", "--time", "0", check=False)
        pm("rmi", "--all", "--force", check=False)
        _unmount_under(base)
        shutil.rmtree(base, ignore_errors=True)


def _name() -> str:
    return f"wr-test-{uuid.uuid4().hex[:10]}"


@pytest.mark.root
def test_podman_restart_count_reaches_two(podman: Podman) -> None:
    name = _name()
    cid = podman("create", "--name", name, "--network=none", "--memory=64m",
                 "--restart=on-failure:2", podman.image, "sh", "-c", "exit 3")  # fmt: skip
    rt = podman.runtime()
    created = rt.find(name)
    assert created is not None and created.id == cid
    assert (created.state, created.restart_count) == ("created", 0)
    assert created.restart_policy == "on-failure:2"

    poller = RestartCountPoller(interval_s=0.05)
    poller.watch(name, rt, cid)
    with poller:
        podman("start", name)

        def done() -> bool:
            info = rt.find(name)
            return info is not None and info.state == "exited" and info.restart_count == 2

        # The restart count reaches 2 just before the third run starts; exited with 2 must
        # then hold (the third exit is the last one: on-failure:2 allows two restarts).
        _wait_for(done, 60, "3 exits and 2 restarts")
        time.sleep(1.0)
        assert done()
    samples = poller.poll()
    counts = [s.restart_count for s in samples]
    assert counts == sorted(counts) and counts[-1] == 2, counts
    assert all(s.unit == name and s.source == "podman" for s in samples)
    assert poller.errors() == []

    info = rt.find(name)
    assert info is not None
    assert (info.id, info.name, info.runtime) == (cid, name, "podman")
    assert (info.state, info.restart_count, info.pid) == ("exited", 2, 0)
    assert info.oom_killed is False
    assert info.image == podman.image
    prefix = rt.find(cid[:12])
    assert prefix is not None and prefix.id == cid
    assert rt.by_id(cid[:12]) == prefix
    assert rt.restart_count(cid) == 2


@pytest.mark.root
def test_podman_running_container_cgroup(podman: Podman) -> None:
    name = _name()
    cid = podman("run", "-d", "--name", name, "--network=none", "--memory=64m",
                 "--health-cmd", "cat /etc/hostname", "--health-interval", "0",
                 podman.image, "sleep", "1000")  # fmt: skip
    try:
        rt = podman.runtime()
        info = rt.find(name)
        assert info is not None and info.id == cid
        assert info.state == "running" and info.pid > 0
        assert info.healthcheck == ("CMD-SHELL", "cat /etc/hostname")
        # cgroupfs manager (containers.conf): podman's own parent cgroup, libpod-<id> below it.
        assert info.cgroup_path == f"/libpod_parent/libpod-{cid}"
        with open(f"/proc/{info.pid}/cgroup") as f:
            assert memory_path(f.read()) == info.cgroup_path
        unit = unit_of_cgroup(info.cgroup_path)
        assert unit is not None and (unit.kind, unit.key) == ("podman", cid)
        v1 = f"/sys/fs/cgroup/memory{info.cgroup_path}/memory.limit_in_bytes"
        if os.path.exists(v1):  # the path is the real memory cgroup with --memory's limit
            assert Path(v1).read_text().strip() == str(64 * 1024 * 1024)
        assert rt.find(cid[:12]) == info
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)


@pytest.mark.root
def test_podman_missing_and_disappearing(podman: Podman) -> None:
    rt = podman.runtime()
    assert rt.find("wr-no-such-container") is None
    assert rt.last_error == "podman: no container 'wr-no-such-container'"

    name = _name()
    cid = podman("create", "--name", name, "--network=none", podman.image, "true")
    assert rt.by_id(name) is None  # a name is not an id
    poller = RestartCountPoller()
    poller.watch(name, rt, cid)
    poller.poll_once()
    assert [s.restart_count for s in poller.poll()] == [0]
    podman("rm", name)
    poller.poll_once()
    poller.poll_once()
    assert poller.poll() == []
    errors = poller.errors()
    assert len(errors) == 1 and errors[0].unit == name and "no container" in errors[0].message


@pytest.fixture(scope="module")
def docker_api(podman: Podman) -> Iterator[DockerRuntime]:
    sock = os.path.join(podman.base, "podman.sock")
    service = podman.service(sock)
    rt = DockerRuntime(sock, timeout_s=10)
    try:
        _wait_for(lambda: (service.poll() is None and rt.available()) or service.poll() is not None,
                  30, "podman system service")  # fmt: skip
        if service.poll() is not None:
            pytest.fail(f"podman system service exited {service.returncode}")
        yield rt
    finally:
        service.terminate()
        try:
            service.wait(10)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait(10)


@pytest.mark.root
def test_docker_api_against_podman_service(podman: Podman, docker_api: DockerRuntime) -> None:
    name = _name()
    cid = podman("run", "-d", "--name", name, "--network=none", "--memory=64m",
                 "--restart=on-failure:2", podman.image, "sh", "-c", "exit 3")  # fmt: skip

    def done() -> bool:
        info = docker_api.find(name)
        return info is not None and info.state == "exited" and info.restart_count == 2

    _wait_for(done, 60, "3 exits and 2 restarts through the Docker API")
    info = docker_api.find(name)
    assert info is not None
    assert (info.runtime, info.id, info.name) == ("docker", cid, name)
    assert (info.state, info.restart_count, info.restart_policy) == ("exited", 2, "on-failure:2")
    assert info.image == podman.image
    by_prefix = docker_api.find(cid[:12])
    assert by_prefix is not None and by_prefix.id == cid
    assert docker_api.restart_count(cid) == 2
    assert docker_api.find("wr-no-such-container") is None
    assert docker_api.last_error == (
        f"docker: no container or Compose service 'wr-no-such-container' at {docker_api.host}"
    )

    running = _name()
    rid = podman("run", "-d", "--name", running, "--network=none", podman.image, "sleep", "1000")
    try:
        rinfo = docker_api.find(running)
        assert rinfo is not None and rinfo.id == rid and rinfo.state == "running"
        assert rinfo.pid > 0
        # The API has no cgroup path; it comes from /proc/PID/cgroup.
        assert rinfo.cgroup_path == f"/libpod_parent/libpod-{rid}"
    finally:
        podman("rm", "--force", "--time", "0", running, check=False)
