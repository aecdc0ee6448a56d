"""The hold's pure decisions, without root: whose stop a leftover is, the host's pid namespace,
a capability, one key per library file."""

from __future__ import annotations

import os
from pathlib import Path

from tracer.bpf.gpuhooks import ours_stopped
from tracer.gpu import libcuda
from tracer.sources import system

TCK = os.sysconf("SC_CLK_TCK")


def _proc(tmp_path: Path, pid: int, state: str, start_ticks: int, tracer: int = 0) -> str:
    d = tmp_path / str(pid)
    d.mkdir(parents=True)
    # fields 3.. of /proc/PID/stat: state is the 3rd, starttime the 22nd
    rest = [state] + ["0"] * 18 + [str(start_ticks)] + ["0"] * 30
    (d / "stat").write_text(f"{pid} (we (ird) name) {' '.join(rest)}\n")
    (d / "status").write_text(f"Name:\tx\nState:\t{state}\nTracerPid:\t{tracer}\n")
    return str(tmp_path)


def test_a_leftover_is_ours_only_while_in_the_group_stop_a_hold_of_ours_began(
    tmp_path: Path,
) -> None:
    held_at = 100 * 1_000_000_000  # 100 s after boot
    before = 50 * TCK  # started 50 s after boot
    assert ours_stopped(1, held_at, _proc(tmp_path / "a", 1, "T", before)) is True
    # a ptrace stop, a traced task, a running one, a pid reused after the hold: not ours
    assert ours_stopped(1, held_at, _proc(tmp_path / "b", 1, "t", before)) is False
    assert ours_stopped(1, held_at, _proc(tmp_path / "c", 1, "T", before, tracer=77)) is False
    assert ours_stopped(1, held_at, _proc(tmp_path / "d", 1, "S", before)) is False
    assert ours_stopped(1, held_at, _proc(tmp_path / "e", 1, "T", 150 * TCK)) is False
    assert ours_stopped(2, held_at, str(tmp_path / "a")) is False  # gone


def test_another_pid_namespace_is_named_with_the_fix(tmp_path: Path) -> None:
    other = tmp_path / "pid"
    other.write_text("")  # any inode but the initial namespace's
    problem = system.pid_namespace_problem(str(other))
    assert problem is not None and "pid namespace of its own" in problem
    assert "--pid=host" in system.PID_NS_FIX
    assert system.pid_namespace_problem(str(tmp_path / "absent")) is None


def test_a_capability_is_read_from_the_effective_set(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("CapEff:\t000001fffeffffff\n")  # all but CAP_SYS_RESOURCE (24)
    assert system.has_capability(system.CAP_SYS_RESOURCE, str(status)) is False
    assert system.has_capability(21, str(status)) is True  # CAP_SYS_ADMIN
    status.write_text("CapEff:\t0000000001000000\n")
    assert system.has_capability(system.CAP_SYS_RESOURCE, str(status)) is True


def test_one_library_file_has_one_key_whatever_mount_shows_it(tmp_path: Path) -> None:
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"\x7fELF" + bytes(60))
    st = os.stat(lib)
    # the same file through another overlay mount: another st_dev, the rest the same
    other = os.stat_result(
        (st.st_mode, st.st_ino, st.st_dev + 7, *st[3:10]), {"st_mtime_ns": st.st_mtime_ns}
    )
    assert libcuda.file_key(other) == libcuda.file_key(st)
    lib.write_bytes(b"\x7fELF" + bytes(61))  # another file (rewritten): another key
    assert libcuda.file_key(os.stat(lib)) != libcuda.file_key(st)
