"""Tier 3 (root): the production wheel (scripts/build) works with no system libbpf.

scripts/build makes the wheel (CO-RE objects and a libbpf built from Debian's source inside,
repaired by auditwheel); it is installed into a fresh virtualenv of the system python, away from
the checkout; then, in a private mount namespace where the system's libbpf and libelf files are
covered by /dev/null (so nothing on the library search path can load), `whyrestart doctor`
loads the bundled libbpf, the bundled objects, and attaches its hooks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parent.parent
HIDDEN = ("libbpf.so", "libelf.so")  # what the bundled libbpf must not take from the system


def _system_files(prefixes: tuple[str, ...]) -> list[str]:
    """The real files behind every ldconfig entry whose name starts with one of ``prefixes``."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines()[1:]:
        name, _, path = line.strip().partition(" => ")
        if name.startswith(prefixes) and os.path.exists(path):
            found.add(os.path.realpath(path))
    return sorted(found)


def test_wheel_carries_objects_and_libbpf_and_is_manylinux(production_wheel: Path) -> None:
    wheel = production_wheel
    assert re.fullmatch(r"whyrestart-[\d.]+-py3-none-manylinux_2_\d+_x86_64\.whl", wheel.name)
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("libbpf.so.1", "whyrestart.bpf.o", "gpu.bpf.o"):
        assert f"tracer/bpf/_bundled/{name}" in names
    # auditwheel grafted libbpf's own dependency that no manylinux policy allows
    assert any(re.fullmatch(r"whyrestart\.libs/libelf-[^/]+\.so[.\d]*", n) for n in names), names


def test_doctor_from_the_wheel_with_no_system_libbpf(
    production_wheel: Path, tmp_path: Path
) -> None:
    hidden = _system_files(HIDDEN)
    assert any("libbpf" in f for f in hidden), "no system libbpf to hide (scripts/setup has one)"
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=300)
    r = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(production_wheel)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = tmp_path / "doctor.json"
    # One shell in a private mount namespace: cover the system libraries, prove they cannot be
    # loaded, then run doctor. cwd and env keep the checkout off sys.path.
    script = "\n".join(
        [
            "set -e",
            *(f"mount --bind /dev/null {f}" for f in hidden),
            f"if {venv}/bin/python -c 'import ctypes; ctypes.CDLL(\"libbpf.so.1\")' 2>/dev/null;"
            " then echo 'system libbpf still loads'; exit 3; fi",
            f"{venv}/bin/python -c 'import tracer; print(tracer.__file__)'",
            f"{venv}/bin/whyrestart doctor --json > {report}",
        ]
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("WHYRESTART_BPF_OBJECT", None)
    env.pop("WHYRESTART_GPU_BPF_OBJECT", None)
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    site = str(venv / "lib")
    assert r.stdout.strip().startswith(site), r.stdout  # the installed package, not the checkout
    doc = json.loads(report.read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert doc["ok"] is True, [c for c in doc["checks"] if not c["ok"]]
    libbpf = checks["libbpf"]
    assert libbpf["ok"] is True
    assert re.fullmatch(
        rf"libbpf 1\.\d+, bundled \({re.escape(site)}/.*/libbpf\.so\.1\)", libbpf["detail"]
    )
    assert checks["bpf_object"]["detail"].startswith(site)
    assert checks["hook:exit"]["ok"] is True, checks["hook:exit"]
