"""The agent's deployment files, checked offline: the DaemonSet against Kubernetes' own schemas
(kubernetes-validate, strict), the systemd unit with systemd-analyze, and both against the CLI
they start (every option they pass is one `whyrestart agent` takes)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tracer.cli import main

ROOT = Path(__file__).resolve().parent.parent
DAEMONSET = ROOT / "deploy" / "daemonset.yaml"
UNIT = ROOT / "deploy" / "whyrestart.service"


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]


def _agent_args(args: list[str]) -> None:
    """Parse ``args`` as the CLI would (click raises on an unknown option or a bad value)."""
    assert args[0] == "agent"
    cmd = main.get_command(None, "agent")  # type: ignore[arg-type]
    assert cmd is not None
    cmd.make_context("agent", list(args[1:]))


def test_daemonset_validates_against_kubernetes_schemas() -> None:
    res = subprocess.run(
        ["kubernetes-validate", "--strict", str(DAEMONSET)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("passed") == 2


def test_daemonset_grants_what_the_agent_reads() -> None:
    ds = next(d for d in _docs() if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert {"operator": "Exists"} in pod["tolerations"]
    notes = ds["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/port"] == "9464"
    [c] = pod["containers"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {
        "/sys/fs/cgroup",
        "/sys/kernel/btf",
        "/sys/kernel/tracing",
        "/dev/kmsg",
        "/var/lib/whyrestart",
        "/run/containerd",  # the CRI socket (tracer/runtimes/cri.py's default)
    } <= mounts
    _agent_args(c["args"])
    assert "--metrics-addr=0.0.0.0:9464" in c["args"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert c["image"] == f"whyrestart:{version}"  # what scripts/build image tags


def test_systemd_unit_starts_the_agent_with_options_it_takes() -> None:
    text = UNIT.read_text()
    [line] = re.findall(r"^ExecStart=(.*)$", text, re.M)
    argv = line.split()
    assert argv[0].endswith("/whyrestart")
    _agent_args(argv[1:])
    assert "ReadWritePaths=/var/lib/whyrestart" in text


def test_systemd_unit_verifies() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    res = subprocess.run([analyze, "verify", "--man=no", str(UNIT)], capture_output=True, text=True)
    # (verify also checks that ExecStart's binary exists: /usr/local/bin/whyrestart is where
    # `pip install` puts it on a host, not here)
    problems = [
        ln
        for ln in (res.stdout + res.stderr).splitlines()
        if ln.strip() and "/usr/local/bin/whyrestart" not in ln and "Command " not in ln
    ]
    assert problems == [], problems


def test_alerting_rules_pass_promtool() -> None:
    from tests.test_agent_prometheus_root import prometheus_tool

    res = subprocess.run(
        [
            prometheus_tool("promtool"),
            "check",
            "rules",
            str(ROOT / "deploy" / "prometheus-rules.yaml"),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 5 rules found" in res.stdout


def test_orchestrators_wait_for_the_agents_readiness() -> None:
    """Kubernetes probes /readyz (tracer/agent/serve.py), systemd waits for READY=1
    (tracer/agent/sdnotify.py): neither counts the agent up before its hooks are attached."""
    from tracer.agent.serve import READY_PATH

    ds = next(d for d in _docs() if d["kind"] == "DaemonSet")
    [c] = ds["spec"]["template"]["spec"]["containers"]
    probe = c["readinessProbe"]["httpGet"]
    assert probe["path"] == READY_PATH
    [port] = [p for p in c["ports"] if p["name"] == probe["port"]]
    assert f"--metrics-addr=0.0.0.0:{port['containerPort']}" in c["args"]
    text = UNIT.read_text()
    assert re.findall(r"^Type=(.*)$", text, re.M) == ["notify"]
    # (the notify socket is AF_UNIX: the unit's address families must allow it)
    [families] = re.findall(r"^RestrictAddressFamilies=(.*)$", text, re.M)
    assert "AF_UNIX" in families.split()


def test_the_unit_may_resume_a_held_process_of_any_user() -> None:
    """The GPU hold SIGSTOPs a program of whatever user loads libcuda; the agent and its guard
    resume it with SIGCONT, which a root without CAP_KILL may not send to another user's
    process (kill(2): EPERM), so the program would stay stopped."""
    text = UNIT.read_text()
    for key in ("AmbientCapabilities", "CapabilityBoundingSet"):
        [caps] = re.findall(rf"^{key}=(.*)$", text, re.M)
        assert "CAP_KILL" in caps.split(), key


def test_the_image_installs_what_the_cri_client_imports() -> None:
    """Every module outside the standard library and the package that tracer/runtimes/cri.py
    imports (grpc, when it asks a node's CRI socket) is a requirement of the `cri` extra, and
    the image installs that extra from a wheelhouse that holds it (scripts/build downloads it;
    deploy/Containerfile installs it and imports grpc in its builder). tests/test_image_root.py
    asks a real containerd from the built image."""
    import ast
    import sys

    tree = ast.parse((ROOT / "tracer" / "runtimes" / "cri.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}  # fmt: skip
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module and not n.level}  # fmt: skip
    third_party = imported - set(sys.stdlib_module_names) - {"tracer", "__future__"}
    assert third_party == {"grpc"}, third_party  # (import name grpc: distribution grpcio)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert [r for r in extras["cri"] if re.match(r"grpcio\b", r)], extras["cri"]
    containerfile = (ROOT / "deploy" / "Containerfile").read_text()
    assert "--find-links /tmp/wheelhouse 'whyrestart[cri]'" in containerfile
    assert "python3 -c 'import grpc'" in containerfile
    build = (ROOT / "scripts" / "build").read_text()
    assert '--dest dist/wheelhouse "whyrestart[cri] @ file://' in build
