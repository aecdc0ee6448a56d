"""The memory workloads the root tests run, and how a command puts itself in a cgroup."""

from __future__ import annotations

import os

from tracer.sources.cgroupfs import ChildCgroup

# Anonymous memory, 1 MiB a step, until the OOM killer takes it.
HOG = "chunks = []\nwhile True:\n    chunks.append(b'x' * (1 << 20))\n"


def cache_churn(reads: int) -> str:
    """A script (``python -c SCRIPT PATH``) that makes page cache of its own beyond a small
    limit, 96 MiB written to PATH, and reads it back ``reads`` times: reclaim stalls, no OOM
    kill; PATH is removed after. PATH belongs on disk (not tmpfs) so that its cache is
    reclaimable."""
    return f"""
import os, sys
path = sys.argv[1]
with open(path, "wb") as f:
    for _ in range(96):
        f.write(os.urandom(1 << 20))
for _ in range({reads}):
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
os.unlink(path)
"""


def in_cgroup(cg: ChildCgroup, *argv: str) -> list[str]:
    """A command line that moves itself into the cgroup, then execs argv."""
    procs = os.path.join(cg.abs_path, "cgroup.procs")
    return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]
