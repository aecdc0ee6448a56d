"""Tier 3 (root, real kernel): ``tail`` warns of the limit before the OOM killer acts.

A real process grows its anonymous memory steadily, 8 MiB a second, in a child memory cgroup
limited to 256 MiB (about 30 s to the kill). The real CLI's ``tail`` must print its
time-to-limit warning line (tracer/analysis/eta.py) before its OOM line.
"""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from tests.workloads import in_cgroup
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup

pytestmark = pytest.mark.root

MiB = 1024 * 1024
LIMIT = 256 * MiB
# 1 MiB touched every 1/8 s, until the OOM killer takes it
GROW = (
    "import time\n"
    "chunks = []\n"
    "start = time.monotonic()\n"
    "while True:\n"
    "    chunks.append(bytearray(b'x' * (1 << 20)))\n"
    "    time.sleep(max(0.0, start + len(chunks) / 8 - time.monotonic()))\n"
)


def test_tail_warns_before_the_oom_kill(parent_cgroup: str, layout: CgroupLayout) -> None:
    name = f"eta-grow-{os.getpid()}"
    with ChildCgroup(parent_cgroup, name, LIMIT, layout=layout) as cg:
        cmd = [sys.executable, "-m", "tracer.cli", "tail", "--json", "--"]
        res = subprocess.run(
            [*cmd, *in_cgroup(cg, sys.executable, "-c", GROW)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        path = cg.path
    lines = [orjson.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    texts = [ln["text"] for ln in lines]
    oom = [i for i, t in enumerate(texts) if t.startswith("OOM ")]
    eta = [i for i, ln in enumerate(lines) if "eta" in ln]
    assert oom, (texts, res.stderr[-2000:])
    assert eta and eta[0] < oom[0], texts
    first = lines[eta[0]]
    est = first["eta"]
    assert (est["limit_bytes"], est["limit_path"], est["growing"]) == (LIMIT, path, "anon")
    assert 6 * MiB < est["rate_bytes_per_s"] < 10 * MiB
    # the warning came with time to act: the kill followed at least 5 s later
    lead_s = (lines[oom[0]]["ts"] - first["ts"]) / 1e9
    assert lead_s >= 5, (lead_s, texts)
    assert "will reach its 256.0 MiB limit" in first["text"] and " in ~" in first["text"]
