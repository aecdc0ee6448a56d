"""Lab tier: a global OOM for real (issue 18). The lab VM has 2 GiB and no memory limit on the
workload: a process that allocates until the host runs out is killed by the host's OOM killer,
and the verdict is ``global_oom`` at high confidence (BPF's OOM event with no memcg constraint,
and the kernel log's ``CONSTRAINT_NONE`` report, agree).

Only here: on the development machines the whole host must never be run out of memory. The
test process and the recorder are made unkillable by the OOM killer (``oom_score_adj`` -1000,
what a node agent would set for itself); the workload sets its own to 1000, so that it, and
nothing the VM needs, is the one chosen.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracer.events import KmsgOom, OomKill
from tracer.pipeline.record import Recorder, Targets
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.lab

HOG = """
with open("/proc/self/oom_score_adj", "w") as f:
    f.write("1000")
chunks = []
while True:
    chunks.append(bytearray(1 << 20))  # zeroed: every page touched
"""


@pytest.fixture
def unkillable() -> Iterator[None]:
    path = Path("/proc/self/oom_score_adj")
    before = path.read_text().strip()
    path.write_text("-1000")
    try:
        yield
    finally:
        path.write_text(before)


def test_the_host_running_out_is_a_global_oom(tmp_path: Path, unkillable: None) -> None:
    res = Recorder(
        str(tmp_path / "global.trace"), Targets(command=[sys.executable, "-c", HOG]), duration=300
    ).run()
    [v] = res.verdicts
    assert (v.cause, v.confidence, v.signal) == ("global_oom", "high", "SIGKILL")
    assert v.limit_cgroup is None and v.limit_bytes is None
    events = list(read_trace(res.path).events)
    ooms = [e for e in events if isinstance(e, OomKill)]
    kmsg = [e for e in events if isinstance(e, KmsgOom)]
    assert [(o.victim_pid, o.memcg) for o in ooms] == [(v.pid, False)]
    # oom_control's constraint (the best rung reads it): the whole machine, not NUMA nodes
    exact = "none" if res.header.hooks["oom_context"] else ""
    assert [(o.constraint, o.exiting) for o in ooms] == [(exact, False)]
    assert [(k.victim_pid, k.memcg, k.constraint) for k in kmsg] == [
        (v.pid, False, "CONSTRAINT_NONE")
    ]
    assert res.lost == 0
