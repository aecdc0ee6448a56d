"""Tier 3 (root): a real Prometheus server (Debian's `prometheus`) scrapes the agent every second
while a real cgroup OOM kill and a real podman container's OOM restart happen; PromQL through
Prometheus's HTTP API returns the counters."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.test_agent_root import AgentProc, free_port, until
from tests.test_podman_root import (  # noqa: F401
    IMAGE,
    create_oom_loop,
    name,
    podman,
    podman_ready,
    state,
)
from tests.workloads import HOG, in_cgroup
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup

pytestmark = pytest.mark.root

MiB = 1024 * 1024


ROOT = Path(__file__).resolve().parent.parent


def prometheus_tool(tool: str) -> str:
    """Debian's prometheus/promtool, as scripts/setup unpacks them (or installed)."""
    cached = ROOT / ".cache" / "prometheus" / "usr" / "bin" / tool
    exe = str(cached) if cached.exists() else shutil.which(tool)
    if exe is None:
        pytest.skip(f"{tool} not found: scripts/setup unpacks Debian's prometheus into .cache")
    return exe


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    exe = prometheus_tool("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    log = (tmp_path / "prometheus.log").open("wb")
    proc: subprocess.Popen[bytes] | None = None

    def start(agent_port: int) -> None:
        nonlocal proc
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: whyrestart\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{agent_port}']\n"
        )
        proc = subprocess.Popen(
            [
                exe,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=log,
        )
        until(lambda: _get(f"http://127.0.0.1:{port}/-/ready") is not None, timeout=60)

    try:
        yield f"http://127.0.0.1:{port}", start  # type: ignore[misc]
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return bytes(r.read())
    except OSError:
        return None


def query(base: str, promql: str) -> float | None:
    """The one value of an instant query, or None when it has no result."""
    body = _get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    if body is None:
        return None
    result = orjson.loads(body)["data"]["result"]
    return float(result[0]["value"][1]) if len(result) == 1 else None


def test_prometheus_scrapes_the_agents_oom_kills_and_restarts(
    tmp_path: Path,
    prometheus: tuple[str, object],
    name: str,  # noqa: F811
) -> None:
    base, start = prometheus
    layout = CgroupLayout.from_system()
    if layout.memory_root is None:
        pytest.skip("no memory cgroup controller mounted")
    agent = AgentProc(tmp_path / "state")
    try:
        agent.wait_ready()
        start(agent.port)  # type: ignore[operator]
        until(lambda: query(base, 'up{job="whyrestart"}') == 1.0, timeout=60)

        cg_name = f"wr-prom-oom-{os.getpid()}"
        with ChildCgroup(own_memory_cgroup(layout=layout), cg_name, 64 * MiB, layout=layout) as cg:
            hog = subprocess.run(in_cgroup(cg, sys.executable, "-c", HOG))
            assert hog.returncode == -signal.SIGKILL

        create_oom_loop(name, 1)
        podman("start", name)
        until(lambda: state(name)[:2] == ("exited", 1), timeout=60)
        # the unit's label: podman's name for it, or its id where podman did not answer in time
        cid = podman("inspect", "-f", "{{.Id}}", name).stdout.strip()
        unit = f"podman ({name}|{cid[:12]})"
        # both runs of the restarted container, OOM-killed, and the restart between them
        oom_exits = f'sum(whyrestart_exits_total{{unit=~"{unit}",cause="cgroup_oom"}})'
        until(lambda: query(base, oom_exits) == 2.0, timeout=60)
        restarts = f'sum(whyrestart_restarts_total{{unit=~"{unit}",cause="cgroup_oom"}})'
        try:
            until(lambda: query(base, restarts) == 1.0, timeout=60)
        except AssertionError:
            lines = [ln for ln in agent.metrics().splitlines() if "restarts_total{" in ln]
            raise AssertionError(f"no cgroup_oom restart on /metrics: {lines}") from None
        ooms = query(base, f'sum(whyrestart_exits_total{{unit=~"{unit}",cause="cgroup_oom"}})')
        assert ooms == 2.0  # the first run and the restarted one
        assert query(base, f'sum(whyrestart_oom_kills_total{{unit=~"{unit}"}})') == 2.0
        # the plain cgroup's kill too (its process is in no unit: unit="")
        assert (query(base, 'sum(whyrestart_oom_kills_total{limit_scope="own"})') or 0) >= 3.0
        assert query(base, "whyrestart_agent_process_resident_memory_bytes") is not None
        assert agent.stop()[0] == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
