"""Tier 3 (root, real kernel): the recorder never watches itself.

Whatever the target — every process (``record --all``, ``tail --all``), pid 1 and its
descendants (``--pid 1``), a cgroup that holds the recorder (``--cgroup``) — the processes the
recorder starts (ldconfig, podman inspect, exec health probes) and their descendants are no
evidence: the kernel filter leaves them out. Here the recorder's helpers are its exec probes
(run by its probe thread, each starting a child of its own). The recorder runs in a thread of
this test process; what the test's own thread starts is no helper and must be seen, and so must
a stranger started before the recording and orphaned at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracer.events import Event, Exit, ProbeSample
from tracer.pipeline.follow import ProbeSetup
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup
from tracer.sources.probes import parse_probe

pytestmark = pytest.mark.root

# The stranger: moves itself into argv[3] (a cgroup.procs file, or "-"), waits for the go file
# argv[1], runs a child that exits 203, and writes argv[2].
STRANGER = """
import os, subprocess, sys, time
go, done, procs = sys.argv[1:4]
if procs != "-":
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
while not os.path.exists(go):
    time.sleep(0.01)
subprocess.run(["sh", "-c", "exit 203"])
open(done, "w").close()
"""


@pytest.fixture
def cgroup(layout: CgroupLayout) -> Iterator[ChildCgroup]:
    parent = own_memory_cgroup(layout=layout)
    with ChildCgroup(parent, f"wr-test-self-{os.getpid()}", None, layout=layout) as cg:
        yield cg


def run_with_helpers(
    tmp_path: Path, targets: Targets, *, tail: bool = False, procs: str = "-"
) -> tuple[RecordResult, list[Event]]:
    go, done = tmp_path / "go", tmp_path / "done"
    args = [sys.executable, "-c", STRANGER, str(go), str(done), procs]
    subprocess.run(["sh", "-c", '"$@" &', "sh", *args], check=True)  # orphaned at once
    seen: list[Event] = []

    def on_event(ev: Event | None, _verdicts: object) -> None:
        if ev is not None:
            seen.append(ev)

    out = None if tail else str(tmp_path / "self.trace")
    # the recorder's helpers: an exec probe every 0.2 s, and the probe's own child
    probe = parse_probe("exec:sh -c \"sh -c 'exit 204'; exit 205\"")
    targets.probes = ProbeSetup([probe], 0.2, 2.0)
    ready = threading.Event()
    rec = Recorder(out, targets, duration=60, on_event=on_event, on_ready=ready.set)
    results: list[RecordResult] = []
    errors: list[BaseException] = []

    def record() -> None:
        try:
            results.append(rec.run())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=record)
    thread.start()
    try:
        while not ready.wait(0.05) and thread.is_alive():
            pass
        go.touch()
        # not the recorder's: this test's own thread, a program using the recorder
        subprocess.run(["sh", "-c", "exit 202"])
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the stranger's last exits reach the recorder
    finally:
        go.touch()
        rec.stop.set("test done")
        thread.join(60)
    if errors:
        raise errors[0]
    assert done.exists()
    return results[0], seen


def check(res: RecordResult, events: list[Event], *, own: bool = True) -> None:
    codes = {e.status >> 8 for e in events if isinstance(e, Exit) and e.comm == "sh"}
    assert 203 in codes, "the stranger's child was not seen"
    if own:
        assert 202 in codes, "the test thread's child was not seen"
    assert not codes & {204, 205}, f"the recorder's helpers were recorded: {codes}"
    assert not [v for v in res.verdicts if v.comm == "sh" and v.exit_code in (204, 205)]
    assert not [e for e in events if isinstance(e, Exit) and e.pid == os.getpid()]
    probed = [e for e in events if isinstance(e, ProbeSample)]
    assert len(probed) >= 2 and not any(p.ok for p in probed)  # the helpers did run


def test_record_all(tmp_path: Path) -> None:
    check(*run_with_helpers(tmp_path, Targets(all=True)))


def test_tail_all(tmp_path: Path) -> None:
    check(*run_with_helpers(tmp_path, Targets(all=True), tail=True))


def test_pid_1(tmp_path: Path) -> None:
    # (the test's own child is in the recorder's process subtree, which seeding --pid 1 leaves
    # out, and it is forked by no watched process)
    check(*run_with_helpers(tmp_path, Targets(pids=[1])), own=False)


def test_a_cgroup_that_holds_the_recorder(tmp_path: Path, cgroup: ChildCgroup) -> None:
    procs = os.path.join(cgroup.abs_path, "cgroup.procs")
    Path(procs).write_text(str(os.getpid()))  # the recorder (this process) moves in
    # (ChildCgroup moves this process back out at the end)
    check(*run_with_helpers(tmp_path, Targets(cgroups=[cgroup.path]), procs=procs))
