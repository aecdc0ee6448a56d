"""Tier 3 (root): whyrestart mounts tracefs itself where it is not mounted (a container, a
minimal host), as the classic tracepoint rungs need it. Run in a private mount namespace with
tracefs unmounted there, so the host's mount is untouched."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tracer.sources import system

pytestmark = pytest.mark.root


def test_ensure_tracefs_mounts_it_when_missing() -> None:
    code = (
        "import os; from tracer.sources import system\n"
        "assert system.tracefs_events_dir() is None, 'still mounted'\n"
        "print(system.ensure_tracefs())\n"
    )
    script = (
        f"umount {system.TRACEFS} 2>/dev/null || true; umount {system.DEBUGFS_TRACING} "
        f"2>/dev/null || true; umount /sys/kernel/debug 2>/dev/null || true; "
        f'exec {sys.executable} -c "$0"'
    )
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script, code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == system.TRACEFS
