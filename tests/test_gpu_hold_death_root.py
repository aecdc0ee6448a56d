"""Tier 3 (root, real kernel): no process the kernel held at its first GPU call is ever left
stopped, however the recorder and its guard end (issue 31 item 4).

The held program is tests/gpu/fast.c with the stand-in libcuda found through LD_LIBRARY_PATH
(as in test_gpu_hold_root.py). The recorder (``whyrestart record --pid``) runs in a memory
cgroup of its own, its guard with it, as the agent runs in its systemd unit or pod; the watched
service runs outside it. The recorder is SIGSTOPped once its header is written, so that the
hold it takes cannot be ended by it, then its cgroup dies one way or another.

cgroup v1 (this host) has no memory.oom.group: its OOM killer picks one task at a time. The OOM
test makes the recorder the victim of a real OOM kill of its cgroup, then does what
memory.oom.group does next on v2 (mm/memcontrol.c ``oom_kill_memcg_member``: SIGKILL to every
task of the group whose oom_score_adj is not -1000) from user space. What v1 cannot show is the
kernel itself choosing the group; what matters to the guard, the -1000 exemption, is the same
test in both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpu import build
from tests.test_gpu_hold_root import Fast, MiB, _state, _wait_for, record
from tracer.gpu.side import GpuSide
from tracer.sources import system
from tracer.trace.reader import read_trace

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(build.gcc() is None, reason="no C compiler (gcc) to build the stand-ins"),
]

MEMCG_V1 = Path("/sys/fs/cgroup/memory")
WHYRESTART = os.path.join(os.path.dirname(sys.executable), "whyrestart")


@pytest.fixture
def fast(tmp_path: Path) -> Fast:
    """A stand-in and its program per test (as test_gpu_hold_root's): nothing has probed it."""
    libdir = tmp_path / "lib"
    libdir.mkdir()
    build.libcuda(libdir)
    return Fast(libdir, build.fast(tmp_path, libdir))


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A memory cgroup of the recorder's own (v1), emptied and removed after."""
    if not (MEMCG_V1 / "memory.limit_in_bytes").exists():
        pytest.skip("needs the cgroup v1 memory controller at /sys/fs/cgroup/memory")
    cg = MEMCG_V1 / f"guard-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        yield cg
    finally:
        for _ in range(100):
            pids = _procs(cg)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        cg.rmdir()


def _procs(cg: Path) -> list[int]:
    return [int(p) for p in (cg / "cgroup.procs").read_text().split()]


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(k) for k in f.read().split()]
    return []


def _stopped_children(pid: int) -> list[int]:
    out = []
    for k in _children(pid):
        with contextlib.suppress(OSError):
            if _state(k) == "T":
                out.append(k)
    return out


class Held:
    """A service whose program is held by a recorder in ``cgroup`` that can no longer resume
    it (stopped): ``recorder`` and the ``guard`` it started, both in the cgroup."""

    def __init__(self, tmp_path: Path, fast: Fast, cg: Path) -> None:
        go, self.rcfile, trace = tmp_path / "go", tmp_path / "rc", tmp_path / "run.trace"
        script = (
            f"while [ ! -e {go} ]; do sleep 0.01; done; "
            f"LD_LIBRARY_PATH={fast.libdir} FAKE_CUDA_BUDGET_BYTES={MiB} {fast.program} fail; "
            f"echo $? > {self.rcfile}.tmp; mv {self.rcfile}.tmp {self.rcfile}"
        )
        self.service = subprocess.Popen(["sh", "-c", script])
        self.recorder = subprocess.Popen(
            [
                "sh",
                "-c",
                f'echo $$ > {cg}/cgroup.procs && exec "$0" "$@"',
                WHYRESTART,
                "record",
                "-o",
                str(trace),
                "--pid",
                str(self.service.pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # the header is written once every source is set up, the GPU side's guard included
        _wait_for(lambda: trace.exists() and trace.stat().st_size > 0)
        [self.guard] = [p for p in _procs(cg) if p != self.recorder.pid]
        self.recorder.send_signal(signal.SIGSTOP)
        go.touch()
        _wait_for(lambda: bool(_stopped_children(self.service.pid)))

    def ran_on(self, timeout: float = 30) -> bool:
        """The held program was resumed: it ran, its allocation was refused (exit 2)."""
        try:
            self.service.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return self.rcfile.read_text().strip() == "2"

    def close(self) -> None:
        # a failing test leaves nothing stopped either
        for k in _children(self.service.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(k, signal.SIGKILL)
        for p in (self.recorder, self.service):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def held(tmp_path: Path, fast: Fast, cgroup: Path) -> Iterator[Held]:
    h = Held(tmp_path, fast, cgroup)
    try:
        yield h
    finally:
        h.close()


def _oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def _ignored(pid: int) -> set[signal.Signals]:
    with open(f"/proc/{pid}/status") as f:
        mask = int(next(ln for ln in f if ln.startswith("SigIgn:")).split()[1], 16)
    return {s for s in signal.Signals if mask >> (s - 1) & 1}


def test_the_guard_ignores_what_a_unit_stop_sends(held: Held) -> None:
    # (it sets this up as it starts, a few ms after the recorder's header may be written)
    want = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    _wait_for(lambda: want <= _ignored(held.guard), timeout=10)


def test_systemctl_stop_then_its_sigkill_of_a_hung_recorder_leaves_nothing_stopped(
    held: Held, cgroup: Path
) -> None:
    """KillMode=control-group: SIGTERM to every task of the unit; the recorder (stopped: hung)
    does not exit in TimeoutStopSec and is SIGKILLed. The guard is what resumes the hold."""
    for pid in _procs(cgroup):
        os.kill(pid, signal.SIGTERM)
    held.recorder.kill()
    assert held.recorder.wait(timeout=30) == -signal.SIGKILL
    assert held.ran_on()


@pytest.mark.skipif(
    not system.has_capability(system.CAP_SYS_RESOURCE),
    reason="root here lacks CAP_SYS_RESOURCE (the sandbox's capability set): no process can "
    "lower its oom_score_adj, so the guard cannot be spared by memory.oom.group",
)
def test_an_oom_kill_of_the_recorders_cgroup_leaves_nothing_stopped(
    held: Held, cgroup: Path
) -> None:
    assert _oom_score_adj(held.guard) == -1000
    # memory.oom.group kills the members in one pass, before any of them runs again: the guard
    # must not see the recorder's death before its own turn comes
    os.kill(held.guard, signal.SIGSTOP)
    # the recorder is the OOM killer's pick (as the agent, the largest task of its pod, is)
    Path(f"/proc/{held.recorder.pid}/oom_score_adj").write_text("1000")
    usage = int((cgroup / "memory.usage_in_bytes").read_text())
    (cgroup / "memory.limit_in_bytes").write_text(str(usage + 32 * MiB))
    hog = subprocess.Popen(
        [
            "sh",
            "-c",
            f'echo $$ > {cgroup}/cgroup.procs && exec "$0" "$@"',
            sys.executable,
            "-c",
            "import time; b = b'x' * (256 << 20); time.sleep(60)",
        ]
    )
    try:
        assert held.recorder.wait(timeout=60) == -signal.SIGKILL
        oom = dict(ln.split() for ln in (cgroup / "memory.oom_control").read_text().splitlines())
        assert int(oom["oom_kill"]) >= 1
        # what memory.oom.group goes on to do: every member but the OOM_SCORE_ADJ_MIN ones
        for pid in _procs(cgroup):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if _oom_score_adj(pid) != -1000:
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(held.guard, signal.SIGCONT)
        assert held.ran_on()
    finally:
        hog.kill()
        hog.wait()


def test_a_recorder_and_its_guard_sigkilled_together_leave_it_to_the_next_recorder(
    held: Held, cgroup: Path, tmp_path: Path
) -> None:
    for pid in _procs(cgroup):
        os.kill(pid, signal.SIGKILL)
    _wait_for(lambda: not _procs(cgroup))
    assert _stopped_children(held.service.pid)  # a leftover nobody alive will resume
    trace = tmp_path / "next.trace"
    nxt = subprocess.Popen(
        [WHYRESTART, "record", "-o", str(trace), "--", "sleep", "60"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert held.ran_on()
    finally:
        nxt.send_signal(signal.SIGINT)
        nxt.wait(timeout=60)
    # (which recorder resumed it is not asserted: every recorder with the shared holds map
    # sweeps, and on a shared host another one may come first; the footer of the one that did
    # counts it in gpu_holds.leftovers_resumed)
    assert read_trace(str(trace)).footer is not None


def test_no_hold_while_the_recorders_heartbeat_is_stale(
    tmp_path: Path,
    fast: Fast,
) -> None:
    """A recorder that stopped looping (stuck, frozen, or dead with a guard that lives on)
    holds nobody: the program runs at once, its loader spared and counted. (Not checked
    through its parent's waitpid(WUNTRACED): another helper's agent on a shared host may hold it
    too, and that is not this recorder's hold.)"""
    side = GpuSide(filter_all=False, memcg_v1=True, attach_host=False)
    try:
        assert side.describe()["hold"] == "ready", side.warnings
        assert side.hooks is not None
        time.sleep(2.5)  # no poll: the heartbeat is older than the kernel's 2 s
        env = {
            **os.environ,
            "LD_LIBRARY_PATH": str(fast.libdir),
            "FAKE_CUDA_BUDGET_BYTES": str(MiB),
        }
        go = tmp_path / "go"
        script = f"while [ ! -e {go} ]; do sleep 0.01; done; exec {fast.program} fail"
        parent = subprocess.Popen(["sh", "-c", script], env=env)
        side.watch([parent.pid])  # it becomes the program (exec)
        go.touch()
        assert parent.wait(timeout=30) == 2
        counts = side.hooks.hold_counts_now()
        assert counts[0] == 0  # taken
        assert counts[2] == 1  # spared: the heartbeat was stale
    finally:
        side.close()


@pytest.mark.skipif(not os.path.exists("/usr/bin/strace"), reason="needs strace (apt: strace)")
def test_a_traced_program_is_never_held(
    tmp_path: Path,
    fast: Fast,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a debugger the hold's SIGSTOP goes to the tracer and our one SIGCONT can be spent
    before it passes the stop on: the task would stay stopped. It is spared, and counted."""
    _res, _events, holds = record(
        tmp_path,
        fast,
        monkeypatch,
        "-o",
        "/dev/null",
        str(fast.program),
        "fail",
        program=Path("/usr/bin/strace"),
    )
    assert holds["taken"] == 0
    assert holds["spared_traced"] == 1


def test_a_recorder_outside_the_host_pid_namespace_is_refused_naming_the_fix(
    tmp_path: Path,
) -> None:
    out = str(tmp_path / "ns.trace")
    r = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", WHYRESTART, "record", "-o", out, "true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert "pid namespace of its own" in r.stderr
    assert "--pid=host" in r.stderr


def test_the_host_pid_namespace_is_told_apart_by_its_inode() -> None:
    assert system.pid_namespace_problem() is None
    assert os.stat("/proc/self/ns/pid").st_ino == system.INIT_PID_NS_INO
