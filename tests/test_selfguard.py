"""The recorder's self-guard (tracer/selfguard.py) without root: applied and restored, or off,
and off for the recordings the tests run in their own process (tests/recording.py), so that
nothing a test starts beside one inherits the recorder's data limit and OOM score."""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

import pytest

from tests import recording
from tracer import selfguard
from tracer.pipeline import record as record_mod
from tracer.pipeline.record import Recorder, RecordResult, Targets

PROBE = ["sh", "-c", "cat /proc/self/oom_score_adj; grep 'Max data' /proc/self/limits"]


def _proc(tmp_path: Path) -> str:
    """A /proc of this test's own, whose oom_score_adj any user may write."""
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "oom_score_adj").write_text("0\n")
    return str(tmp_path)


def _limits() -> str:
    """What a program started now inherits: its oom_score_adj and its data limit."""
    return subprocess.run(PROBE, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def unlimited_data() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    if soft != resource.RLIM_INFINITY and soft <= selfguard.DATA_LIMIT_BYTES:
        pytest.skip(f"RLIMIT_DATA is {soft} here: the guard's 1 GiB would change nothing")


@pytest.mark.usefixtures("unlimited_data")
def test_the_guard_applies_both_limits_and_gives_them_back(tmp_path: Path) -> None:
    proc = _proc(tmp_path)
    before = resource.getrlimit(resource.RLIMIT_DATA)
    with selfguard.guarded(proc) as guard:
        assert resource.getrlimit(resource.RLIMIT_DATA)[0] == selfguard.DATA_LIMIT_BYTES
        assert (tmp_path / "self" / "oom_score_adj").read_text() == "-900"
        assert guard.applied == {"oom_score_adj": -900, "data_limit_bytes": 1 << 30}
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert (tmp_path / "self" / "oom_score_adj").read_text() == "0"


@pytest.mark.usefixtures("unlimited_data")
def test_a_guard_turned_off_changes_nothing_and_says_so(tmp_path: Path) -> None:
    proc = _proc(tmp_path)
    before = resource.getrlimit(resource.RLIMIT_DATA)
    with selfguard.guarded(proc, apply=False) as guard:
        assert resource.getrlimit(resource.RLIMIT_DATA) == before
        guard.reset_in_child()  # (a recorded command's child: nothing to give back)
        assert (tmp_path / "self" / "oom_score_adj").read_text() == "0\n"
        assert guard.applied == {"off": selfguard.OFF}
    assert resource.getrlimit(resource.RLIMIT_DATA) == before


@pytest.mark.usefixtures("unlimited_data")
def test_a_program_started_beside_a_tests_recording_keeps_the_tests_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorder run as tests/recording.py runs it (the recording itself, which needs root
    and BPF, stood in for by what a test does meanwhile: it starts a program): that program
    sees the test's own data limit and oom_score_adj, not the recorder's guard."""
    before = _limits()
    seen: list[str] = []

    def while_recording(self: Recorder) -> RecordResult:
        seen.append(_limits())
        raise _Done

    monkeypatch.setattr(record_mod, "preflight", lambda: None)
    monkeypatch.setattr(Recorder, "_run_guarded", while_recording)
    with pytest.raises(_Done):
        recording.record_while(tmp_path, "", lambda: None, pids=[1])
    with pytest.raises(_Done):
        recording.record(tmp_path, ["true"])
    assert seen == [before, before]
    assert _limits() == before
    # (the recorder's own default keeps its guard: what the tests turn off is theirs alone)
    assert Recorder(None, Targets(pids=[1])).profile.self_guard is True


class _Done(Exception):
    """The stand-in recording's end."""
