"""Tier 3 (root, to become another user): doctor run by an unprivileged user tells the truth
about what that user can read (issue 22 finding 8: it said tracefs was not mounted, though it
is, mode 0700, and that /dev/kmsg was readable, though reading it needs CAP_SYSLOG)."""

from __future__ import annotations

import shutil
import subprocess

import orjson
import pytest

from tracer.sources import system

pytestmark = pytest.mark.root


def test_doctor_as_nobody(unprivileged: tuple[list[str], dict[str, str]]) -> None:
    wr, env = unprivileged
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv not installed (util-linux)")
    if not system.tracefs_mounts():
        pytest.skip("tracefs is not mounted here")
    out = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *wr, "doctor", "--json"],
        capture_output=True, text=True, cwd="/", timeout=60, env=env,
    ).stdout  # fmt: skip
    checks = {c["name"]: c for c in orjson.loads(out)["checks"]}
    tracefs, kmsg = checks["tracefs"], checks["kmsg"]
    assert not tracefs["ok"]
    assert "is mounted at" in tracefs["detail"] and "cannot read" in tracefs["detail"]
    assert tracefs["fix"] == "run as root"
    readable, _ = system.kmsg_readable()  # as root, here
    assert readable
    assert not kmsg["ok"] and "not readable" in kmsg["detail"]
