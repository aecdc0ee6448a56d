"""Tier 3: the recorder under bad conditions. It ends cleanly on signals, keeps a replayable
trace when killed or when the disk fills, runs beside another recorder, and does not pass its
own protections on to the workload."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tracer.trace.reader import TraceReader, read_trace

pytestmark = pytest.mark.root

WR = [sys.executable, "-m", "tracer.cli"]


def start(trace: Path, *cmd: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*WR, "record", "-q", "-o", str(trace), "--", *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_header(trace: Path) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if trace.exists() and trace.stat().st_size > 0:
            return
        time.sleep(0.05)
    raise AssertionError("the recorder never wrote its header")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_the_recording_with_its_footer(tmp_path: Path, sig: int) -> None:
    trace = tmp_path / "s.trace"
    # only the recorder gets the signal; it passes it on to the command (tracer/spawn.py)
    rec = start(trace, "sh", "-c", "exec >/dev/null 2>&1; sleep 0.2; sh -c 'exit 5'; sleep 30")
    wait_for_header(trace)
    time.sleep(1.5)
    rec.send_signal(sig)
    out, _err = rec.communicate(timeout=60)
    assert rec.returncode == 128 + sig
    t = read_trace(str(trace))
    assert t.footer is not None
    name = signal.Signals(sig).name
    assert t.footer.exit == f"interrupted by {name}; the command was sent {name}"
    assert "code 5" in out or "exit_code" in out or "app_exit" in out


def test_sigkill_leaves_a_trace_that_replays(tmp_path: Path) -> None:
    trace = tmp_path / "k.trace"
    rec = start(
        trace,
        "sh",
        "-c",
        "exec >/dev/null 2>&1; for i in 1 2 3; do sh -c 'exit 7'; done; sleep 30",
    )
    wait_for_header(trace)
    time.sleep(2.5)  # the recorder flushes at least once a second
    import psutil

    [command] = psutil.Process(rec.pid).children()
    rec.kill()
    rec.wait()
    # the command does not outlive even a recorder killed with SIGKILL (PR_SET_PDEATHSIG)
    command.wait(timeout=10)  # (not our child: psutil polls until it is gone, or raises)
    assert not command.is_running()
    reader = TraceReader(str(trace))
    events = list(reader)
    assert reader.footer is None
    assert any("no footer" in w for w in reader.warnings)
    exits = [e for e in events if e.KIND == "exit"]
    assert len(exits) == 3  # the three `exit 7` shells


def test_disk_full_ends_with_a_clear_error_and_a_valid_trace(tmp_path: Path) -> None:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(mnt)], check=True)
    try:
        trace = mnt / "full.trace"
        rec = start(trace, "sh", "-c", "for i in $(seq 400); do sh -c 'exit 1'; done")
        _out, err = rec.communicate(timeout=120)
        assert rec.returncode == 7, err
        assert "disk full" in err.lower() or "no space" in err.lower()
        reader = TraceReader(str(trace))
        events = list(reader)  # valid up to its last whole record
        assert events and reader.header.schema == 1
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_two_recorders_at_once_each_see_their_own(tmp_path: Path) -> None:
    a = start(tmp_path / "a.trace", "sh", "-c", "sleep 1; exit 11")
    b = start(tmp_path / "b.trace", "sh", "-c", "sleep 1; exit 12")
    a.communicate(timeout=60)
    b.communicate(timeout=60)
    codes_a = {
        e.status >> 8 for e in read_trace(str(tmp_path / "a.trace")).events if e.KIND == "exit"
    }
    codes_b = {
        e.status >> 8 for e in read_trace(str(tmp_path / "b.trace")).events if e.KIND == "exit"
    }
    assert 11 in codes_a and 12 not in codes_a
    assert 12 in codes_b and 11 not in codes_b
    assert (a.returncode, b.returncode) == (11, 12)


def test_the_workload_does_not_inherit_the_recorders_protections(tmp_path: Path) -> None:
    want_adj = Path("/proc/self/oom_score_adj").read_text().strip()
    out = subprocess.run(
        [
            *WR,
            "record",
            "-q",
            "-o",
            str(tmp_path / "g.trace"),
            "--",
            "sh",
            "-c",
            "cat /proc/self/oom_score_adj; grep 'Max data' /proc/self/limits >&2",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines()[0] == want_adj
    assert "unlimited" in out.stderr.splitlines()[0]
    header = read_trace(str(tmp_path / "g.trace")).header
    assert "self_protection" in header.extra


def test_redact_keeps_the_command_line_out(tmp_path: Path) -> None:
    trace = tmp_path / "r.trace"
    subprocess.run(
        [
            *WR,
            "record",
            "-q",
            "--redact",
            "-o",
            str(trace),
            "--",
            "sh",
            "-c",
            "exit 0 # secret-token-123",
        ],
        check=True,
        capture_output=True,
    )
    assert b"secret-token-123" not in trace.read_bytes()


def test_replay_needs_no_privileges(
    tmp_path: Path, unprivileged: tuple[list[str], dict[str, str]]
) -> None:
    trace = tmp_path / "p.trace"
    subprocess.run(
        [*WR, "record", "-q", "-o", str(trace), "--", "sh", "-c", "exit 3"],
        check=False,
        capture_output=True,
    )
    wr, env = unprivileged
    # a place the unprivileged user can read (pytest's own tmp dirs are root-only)
    shared = Path(tempfile.mkdtemp(prefix="wr-replay-"))
    try:
        shared.chmod(0o755)
        copy = shared / "p.trace"
        copy.write_bytes(trace.read_bytes())
        copy.chmod(0o644)
        out = subprocess.run(
            [*wr, "replay", str(copy)],
            capture_output=True,
            text=True,
            user="nobody",
            check=True,
            cwd="/",
            env=env,
        )
        assert "app_exit" in out.stdout and "code 3" in out.stdout
    finally:
        shutil.rmtree(shared)


def test_a_flood_is_taken_in_bounded_batches_and_nothing_is_dropped_by_us() -> None:
    """A drain hands over at most batch_max records, however fast the producer is, and the
    records past the cap stay in the ring for the next drain."""

    from tracer.bpf import hooks, layout
    from tracer.bpf.decode import Decoder
    from tracer.bpf.libbpf import RingBuffer
    from tracer.events import Exit

    probe = hooks.KernelHooks(
        layout.WrConfig(
            filter_all=1,
            memcg_v1=0,
            # no recorder here: this process's children are the workload, not its helpers
            self_tgid=0,
            watch_cgroups=0,
            stall_threshold_ns=10_000_000,
            follow_cgroups=0,
            hierarchy_id=0,
        )
    )
    try:
        probe.attach()
        rb = RingBuffer(probe.events, batch_max=10)
        try:
            n = 40
            procs = [subprocess.Popen(["sh", "-c", "exit 42"]) for _ in range(n)]
            for p in procs:
                p.wait()
            mine = {p.pid for p in procs}
            sizes: list[int] = []
            seen: set[int] = set()
            decoder = Decoder()
            for _ in range(200):
                raws = rb.drain(10)
                sizes.append(len(raws))
                for ev in decoder.decode_batch(raws):
                    if isinstance(ev, Exit) and ev.pid in mine:
                        seen.add(ev.pid)
                if seen == mine:
                    break
        finally:
            rb.free()
        assert max(sizes) == 10  # the cap was reached, and held
        assert seen == mine  # every exit arrived, over several drains
        assert probe.lost_count() == 0
    finally:
        probe.close()
