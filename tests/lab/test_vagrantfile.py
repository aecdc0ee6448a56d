"""The Vagrantfile for users' own labs stays valid: ``vagrant validate --ignore-provider`` (Debian
package vagrant) on the host, so it never rots. Not a lab-VM test: it needs no VM and no box."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "env", [{}, {"WHYRESTART_GPU_PCI": "0000:65:00.0"}], ids=["default", "gpu"]
)
def test_vagrantfile_validates(tmp_path: Path, env: dict[str, str]) -> None:
    vagrant = shutil.which("vagrant")
    if vagrant is None:
        pytest.skip("vagrant is not installed: scripts/setup installs it (Debian package vagrant)")
    run_env = {
        **os.environ,
        **env,
        # keep vagrant's state out of the repository and the user's home
        "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot"),
        "VAGRANT_HOME": str(tmp_path / "home"),
        "VAGRANT_CHECKPOINT_DISABLE": "1",
    }
    proc = subprocess.run(
        [vagrant, "validate", "--ignore-provider"],
        cwd=ROOT,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "validated successfully" in proc.stdout
