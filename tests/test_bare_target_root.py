"""Tier 3 (root): the wheel on a bare target, a Debian 12 root made by debootstrap that has
python3, python3-venv and pip and nothing else of a checkout's (scripts/bare-target checks: no
clang, llvm, libbpf, bpftool, gcc, libelf).

In a chroot of it, with /proc, /sys (its cgroup mounts included) and /dev bind-mounted in a
private mount namespace, scripts/build's wheel installs into a venv of the target's python,
`whyrestart doctor` passes, and `whyrestart record` of a memory hog that moves itself into a
child memory cgroup of 64 MiB gives cgroup_oom, high, naming that cgroup and its limit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup

pytestmark = pytest.mark.root

MiB = 1 << 20
# Touches every page it takes (bytes filled with "x"), so the charge reaches the limit.
HOG = "b = []\nwhile True:\n    b.append(b'x' * (1 << 20))\n"


def test_wheel_on_a_bare_target_doctor_and_a_cgroup_oom(
    bare_target: Path, production_wheel: Path, tmp_path: Path
) -> None:
    target = bare_target
    layout = CgroupLayout.from_system()
    assert layout.memory_root is not None
    run = f"wr-bare-{os.getpid()}-{tmp_path.name}"
    inside = target / "tmp" / run  # what the chroot sees as /tmp/RUN
    inside.mkdir(parents=True)
    try:
        shutil.copy(production_wheel, inside / production_wheel.name)
        # pip in the target reaches PyPI with this host's network setup: its DNS and the CAs it
        # trusts (a proxy here re-signs TLS with a CA of its own)
        shutil.copy("/etc/resolv.conf", target / "etc" / "resolv.conf")
        certs = target / "etc" / "ssl" / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy("/etc/ssl/certs/ca-certificates.crt", certs / "ca-certificates.crt")
        with ChildCgroup(own_memory_cgroup(), run, 64 * MiB) as cg:
            procs = os.path.join(layout.memory_root, cg.path.lstrip("/"), "cgroup.procs")
            (inside / "hog.py").write_text(HOG)
            hog = f"echo $$ > {procs} && exec python3 /tmp/{run}/hog.py"
            venv = f"/tmp/{run}/venv"
            script = "\n".join(
                [
                    "set -e",
                    f"T={target}",
                    "mount --rbind /proc $T/proc",
                    "mount --rbind /sys $T/sys",
                    "mount --rbind /dev $T/dev",
                    f"chroot $T /usr/bin/python3 -m venv {venv}",
                    f"chroot $T {venv}/bin/pip install -q /tmp/{run}/{production_wheel.name}",
                    f"chroot $T {venv}/bin/whyrestart doctor --json > {inside}/doctor.json",
                    f"chroot $T {venv}/bin/whyrestart record --json -o /tmp/{run}/hog.trace"
                    f" -- sh -c '{hog}' > {inside}/verdicts.json || true",
                ]
            )
            r = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                capture_output=True,
                text=True,
                timeout=1200,
            )
            assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
            limit_cgroup = cg.path
        doctor = json.loads((inside / "doctor.json").read_text())
        assert doctor["ok"] is True, [c for c in doctor["checks"] if not c["ok"]]
        libbpf = next(c for c in doctor["checks"] if c["name"] == "libbpf")
        assert f"bundled (/tmp/{run}/venv/" in libbpf["detail"], libbpf
        doc = json.loads((inside / "verdicts.json").read_text())
        ooms = [v for v in doc["verdicts"] if v["cause"] == "cgroup_oom"]
        assert len(ooms) == 1, doc["verdicts"]
        [oom] = ooms
        assert oom["confidence"] == "high", oom
        assert oom["limit_bytes"] == 64 * MiB, oom
        assert oom["limit_cgroup"] == limit_cgroup, (limit_cgroup, oom)
    finally:
        shutil.rmtree(inside, ignore_errors=True)
