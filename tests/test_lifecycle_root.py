"""Tier 3 (root, real processes): one lifecycle policy for the commands the tool starts
(tracer/spawn.py), the same in record, tail and repro.

When the recording ends first, the command gets the signal that ended it (SIGTERM for
--duration), then the grace period, then SIGKILL; the tool exits with the command's status as a
shell reports it (128+N for signal N). Every test runs the real CLI in a subprocess and checks
that the command is gone when the tool has exited. (issue 22, finding 4)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tracer.spawn import STOP_GRACE_S
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.root


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tracer.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _command_of(tool: subprocess.Popen[str], name: str) -> psutil.Process:
    """The started command, once it runs (it is the tool's child)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for kid in psutil.Process(tool.pid).children():
            try:
                if kid.name() == name:
                    return kid
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.02)
    raise AssertionError(f"{name} never started")


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("verb", ["record", "tail"])
def test_a_signal_to_the_tool_is_forwarded_and_passed_through(
    tmp_path: Path, verb: str, sig: signal.Signals
) -> None:
    out = tmp_path / "t.trace"
    args = ["record", "-q", "-o", str(out)] if verb == "record" else ["tail"]
    tool = _start(*args, "--", "sleep", "60")
    sleeper = _command_of(tool, "sleep")
    tool.send_signal(sig)
    _, err = tool.communicate(timeout=30)
    assert tool.returncode == 128 + sig, err
    assert _gone(sleeper)
    assert "Traceback" not in err
    if verb == "record":
        footer = read_trace(str(out)).footer
        assert footer is not None
        assert footer.exit == f"interrupted by {sig.name}; the command was sent {sig.name}"


def test_duration_ends_the_command_with_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "t.trace"
    tool = _start("record", "-q", "-o", str(out), "--duration", "1s", "--", "sleep", "60")
    sleeper = _command_of(tool, "sleep")
    _, err = tool.communicate(timeout=30)
    assert tool.returncode == 128 + signal.SIGTERM, err
    assert _gone(sleeper)
    trace = read_trace(str(out))
    assert trace.footer is not None
    assert trace.footer.exit == "duration reached; the command was sent SIGTERM"
    # the command's end is in the trace: its exit by SIGTERM, judged
    exits = [e for e in trace.events if e.KIND == "exit" and e.pid == sleeper.pid]
    assert len(exits) == 1 and exits[0].wait.signal == signal.SIGTERM


def test_a_command_that_ignores_the_signal_is_killed_after_the_grace_period(
    tmp_path: Path,
) -> None:
    out = tmp_path / "t.trace"
    started = time.monotonic()
    tool = _start(
        "record", "-q", "-o", str(out), "--duration", "0.5",
        "--", "sh", "-c", "trap '' TERM; sleep 60 & wait",
    )  # fmt: skip
    shell = _command_of(tool, "sh")
    _, err = tool.communicate(timeout=30)
    assert tool.returncode == 128 + signal.SIGKILL, err
    assert time.monotonic() - started >= 0.5 + STOP_GRACE_S
    assert _gone(shell)
    footer = read_trace(str(out)).footer
    assert footer is not None
    assert footer.exit == "duration reached; the command was sent SIGTERM, then SIGKILL"


def test_a_second_signal_kills_at_once(tmp_path: Path) -> None:
    tool = _start("record", "-q", "-o", str(tmp_path / "t.trace"), "--", "sh", "-c",
                  "trap '' INT; sleep 60 & wait")  # fmt: skip
    shell = _command_of(tool, "sh")
    tool.send_signal(signal.SIGINT)
    time.sleep(0.3)
    tool.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, err = tool.communicate(timeout=30)
    assert time.monotonic() - started < STOP_GRACE_S, "waited for the grace period"
    assert tool.returncode == 128 + signal.SIGKILL, err
    assert _gone(shell)


@pytest.mark.parametrize("verb", ["record", "tail"])
def test_the_command_status_is_the_tool_status(tmp_path: Path, verb: str) -> None:
    args = ["record", "-q", "-o", str(tmp_path / "t.trace")] if verb == "record" else ["tail"]
    tool = _start(*args, "--", "sh", "-c", "exit 3")
    _, err = tool.communicate(timeout=30)
    assert tool.returncode == 3, err
