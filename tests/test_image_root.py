"""Tier 3 (root): the container image (deploy/Containerfile) builds and runs.

No registry is reachable here, so its base is made locally: the bare Debian 12 root of
scripts/bare-target imported into podman. The image is built from dist/ (scripts/build's wheel
and wheelhouse: no network in the build) and run with what a DaemonSet grants (privileged, the
host's pid and cgroup namespaces, the host's cgroup filesystem): `whyrestart doctor` passes in it,
with the bundled libbpf.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parent.parent


# runc, cgroupfs and the ulimits this kind of host allows (as tests/test_podman_root.py runs it)
CONF = ROOT / "tests" / "data" / "runtimes" / "containers.conf"


def _podman(*args: str, timeout: float = 900, stdin: bytes | None = None) -> str:
    env = {**os.environ, "CONTAINERS_CONF": str(CONF)}
    r = subprocess.run(
        ["podman", *args], input=stdin, capture_output=True, timeout=timeout, env=env
    )
    assert r.returncode == 0, (args, r.stderr.decode(errors="replace")[-3000:])
    return r.stdout.decode(errors="replace")


def test_image_builds_on_a_local_base_and_doctor_passes_in_it(
    bare_target: Path, production_wheel: Path, tmp_path: Path
) -> None:
    uniq = f"{os.getpid()}-{tmp_path.name}".lower()
    base = f"localhost/whyrestart-test-base:{uniq}"
    image = f"localhost/whyrestart-test-image:{uniq}"
    dist = production_wheel.parent
    assert (dist / "wheelhouse" / production_wheel.name).exists()
    try:
        tar = subprocess.run(
            ["tar", "-C", str(bare_target), "--exclude=./tmp/*", "-c", "."],
            capture_output=True,
            check=True,
            timeout=300,
        ).stdout
        _podman("import", "-", base, stdin=tar)
        _podman(
            "build",
            "-q",
            "--build-arg",
            f"BASE={base}",
            "-f",
            str(ROOT / "deploy" / "Containerfile"),
            "-t",
            image,
            str(dist),
        )
        out = _podman(
            "run",
            "--rm",
            "--privileged",
            "--pid=host",
            "--cgroupns=host",
            "--network=none",
            "-v",
            "/sys/fs/cgroup:/sys/fs/cgroup",
            image,
            "doctor",
            "--json",
        )
        doc = json.loads(out)
        checks = {c["name"]: c for c in doc["checks"]}
        assert doc["ok"] is True, [c for c in doc["checks"] if not c["ok"]]
        assert checks["libbpf"]["detail"].startswith("libbpf 1."), checks["libbpf"]
        assert ", bundled (/opt/whyrestart/" in checks["libbpf"]["detail"], checks["libbpf"]
        assert checks["hook:exit"]["ok"] is True
    finally:
        subprocess.run(["podman", "rmi", "-f", image, base], capture_output=True, timeout=300)
