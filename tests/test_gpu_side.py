"""Tier 1: the recorder's GPU side (tracer/gpu/side.py) without root: which processes it looks
at, when it looks again, and what it says when uprobes are unavailable. The BPF object is
pointed at a path that does not exist and /proc at a fixture tree, so nothing here needs the
kernel; the root tier (test_gpu_root.py) runs the same object for real."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.streams import S, execd, exit_code, forked, t
from tracer.events import GpuLibrary
from tracer.gpu.side import GpuSide

LIB = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"


def maps_line(path: str, inode: int = 4242) -> str:
    return f"7f0000000000-7f0000100000 r-xp 00000000 fd:01 {inode} {path}\n"


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    for pid, text in {
        100: maps_line("/usr/bin/python3.11", 1) + maps_line(LIB),
        200: maps_line("/usr/bin/sleep", 2),
    }.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "maps").write_text(text)
    return root


class Clock:
    def __init__(self) -> None:
        self.now = t(100)

    def __call__(self) -> int:
        return self.now


@contextmanager
def gpu_side(proc: Path, filter_all: bool, rescan_max_gap_ns: int = S) -> Iterator[GpuSide]:
    """A GpuSide over the fixture /proc, without its BPF object (no uprobes), closed after."""
    s = GpuSide(
        filter_all=filter_all,
        memcg_v1=True,
        object_path="/nonexistent/gpu.bpf.o",
        attach_host=False,
        proc=str(proc),
        clock=Clock(),
        rescan_max_gap_ns=rescan_max_gap_ns,
    )
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def side(proc: Path) -> Iterator[GpuSide]:
    with gpu_side(proc, filter_all=False) as s:
        yield s


def libs(events: list[object]) -> list[GpuLibrary]:
    return [e for e in events if isinstance(e, GpuLibrary)]


def test_without_the_object_it_says_so_and_still_names_gpu_processes(side: GpuSide) -> None:
    assert side.rung is None
    assert side.describe()["uprobes"].startswith("unavailable: opening BPF object")
    assert any("GPU allocation failures cannot be caught" in w for w in side.warnings)
    side.watch([100, 200])
    [lib] = libs(side.poll(t(100)))
    assert (lib.pid, lib.path, lib.probed, lib.missing) == (100, LIB, "", "")
    assert lib.error.startswith("uprobes unavailable: opening BPF object /nonexistent")
    # once known, a process is not looked at again
    assert libs(side.poll(t(102))) == []


def test_a_process_that_maps_the_library_later_is_found_on_the_next_round(
    side: GpuSide, proc: Path
) -> None:
    side.watch([200])
    assert libs(side.poll(t(100))) == []
    (proc / "200" / "maps").write_text(maps_line("/usr/bin/sleep", 2) + maps_line(LIB))
    assert libs(side.poll(t(100.5))) == []  # not yet a second round
    [lib] = libs(side.poll(t(101.5)))
    assert lib.pid == 200


def test_forks_and_execs_are_followed_and_exits_forgotten(side: GpuSide, proc: Path) -> None:
    side.watch([1])
    side.track([forked(100.0, 1, 100, cg=10)])
    [lib] = libs(side.poll(t(100.1)))
    assert lib.pid == 100
    # an exec the scan already saw (the event arrived late) is no reason to look again ...
    side.track([execd(100.05, 100, cg=10)])
    assert libs(side.poll(t(100.2))) == []
    # ... a later exec is: a new program maps anew
    side.track([execd(100.3, 100, cg=10)])
    [again] = libs(side.poll(t(100.4)))
    assert again.pid == 100
    side.track([exit_code(100.5, 100, 0)])
    assert libs(side.poll(t(105))) == []


def test_under_all_every_process_of_proc_is_looked_at_once(proc: Path) -> None:
    with gpu_side(proc, filter_all=True) as s:
        assert [lib.pid for lib in libs(s.poll(t(100)))] == [100]
        assert libs(s.poll(t(105))) == []


def test_second_looks_are_bounded_and_take_turns(
    side: GpuSide, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracer.gpu import libcuda
    from tracer.gpu import side as side_mod

    looked: list[int] = []

    def fake_maps(pid: int, proc: str = "/proc") -> list[libcuda.Mapping]:
        looked.append(pid)
        return []

    monkeypatch.setattr(side_mod.libcuda, "mappings_of", fake_maps)
    pids = list(range(10_000, 10_600))
    side.watch(pids)

    def drain(at: float) -> list[int]:
        looked.clear()
        for _ in range(100):
            side.poll(t(at))
        return sorted(looked)

    assert drain(100) == pids  # every new process is looked at once, 16 per call
    cap = side_mod.MAX_RESCANS_PER_ROUND
    first = drain(101.5)
    second = drain(103)
    third = drain(104.5)
    assert first == pids[:cap] and second == pids[cap : 2 * cap]
    assert third == sorted(pids[2 * cap :] + pids[: cap - (len(pids) - 2 * cap)])
    # an exit takes a process out of the turns
    side.track([exit_code(105, 10_000, 0)])
    assert 10_000 not in drain(106) + drain(107.5) + drain(109)


@pytest.mark.parametrize(
    ("max_gap_s", "expected"),
    [
        (1, list(range(100, 141))),  # the recorder: every round
        (8, [100, 101, 102, 104, 108, 116, 124, 132, 140]),  # the agent's way, capped at 8 s
    ],
)
def test_second_looks_back_off_up_to_the_longest_gap(
    proc: Path, monkeypatch: pytest.MonkeyPatch, max_gap_s: int, expected: list[int]
) -> None:
    from tracer.gpu import libcuda
    from tracer.gpu import side as side_mod

    looked: list[int] = []
    now = [t(100)]

    def fake_maps(pid: int, proc: str = "/proc") -> list[libcuda.Mapping]:
        looked.append(now[0])
        return []

    monkeypatch.setattr(side_mod.libcuda, "mappings_of", fake_maps)
    with gpu_side(proc, filter_all=False, rescan_max_gap_ns=max_gap_s * S) as side:
        side.watch([200])
        for second in range(100, 141):
            now[0] = t(second)
            side.poll(now[0])
    assert [round((x - t(0)) / S) for x in looked] == expected
