"""Tier 3 (root, real kernel): a tmpfs that fills a memory cgroup is named as what filled it
(issue 30 §1).

A process in a child memory cgroup writes files into a small tmpfs mounted in a temporary
directory until the OOM killer kills it. The tmpfs pages stay charged to the cgroup after the
kill, so the kernel's own figures are read after it: the tmpfs's used blocks and the cgroup's
memory.stat shmem.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recording import record
from tests.workloads import in_cgroup
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup

pytestmark = pytest.mark.root

MiB = 1 << 20
LIMIT = 64 * MiB

# Writes 1 MiB files into the tmpfs at argv[1] until it is killed.
FILL_TMPFS = """
import sys
i = 0
while True:
    with open(f"{sys.argv[1]}/f{i}", "wb") as f:
        f.write(b"x" * (1 << 20))
    i += 1
"""


def shmem_of(cg: ChildCgroup, version: int) -> int:
    text = Path(cg.abs_path, "memory.stat").read_text()
    stat = dict(line.split() for line in text.splitlines() if line)
    return int(stat["total_shmem" if version == 1 else "shmem"])


def test_a_tmpfs_that_filled_the_cgroup_is_named_dominant(
    tmp_path: Path, parent_cgroup: str, layout: CgroupLayout
) -> None:
    mnt = tmp_path / "shm"
    mnt.mkdir()
    name = f"compose-tmpfs-{os.getpid()}"
    with ChildCgroup(parent_cgroup, name, LIMIT, layout=layout) as cg:
        # larger than the limit: the cgroup fills first, not the filesystem
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", name, str(mnt)], check=True)
        try:
            res = record(tmp_path, in_cgroup(cg, sys.executable, "-c", FILL_TMPFS, str(mnt)))
            # the kernel's figures: the files stay, and stay charged, after the kill
            st = os.statvfs(mnt)
            tmpfs_used = (st.f_blocks - st.f_bfree) * st.f_frsize
            charged = shmem_of(cg, layout.memory_version)
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    [v] = [v for v in res.verdicts if v.cause == "cgroup_oom"]
    assert "were tmpfs/shared memory" in v.summary, v.summary
    assert "stay charged to the cgroup after the process dies" in v.advice
    parts = dict(v.breakdown)
    assert parts["shmem"] == max(parts[k] for k in ("anon", "shmem", "file_unmapped"))
    for kernel_says in (tmpfs_used, charged):
        assert abs(parts["shmem"] - kernel_says) <= 0.1 * kernel_says, (parts, kernel_says)
    assert parts["shmem"] >= LIMIT // 2
