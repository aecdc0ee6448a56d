"""A SIGBUS while a tmpfs is full (issue 30, §2): the rule on event streams (tier 1), and the
recorder's reading of a process's tmpfs mounts on a fake /proc (tracer/sources/tmpfs.py,
tracer/pipeline/enrich.py TmpfsAtFault). The real SIGBUS on a real full tmpfs is in
tests/test_tmpfs_full_root.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.streams import MiB, exit_code, killed, one, sent, t, tmpfs_full
from tracer.events import BUS_ADRERR, SI_TKILL, Exec, Exit, Fork, Signal, TmpfsFull
from tracer.pipeline.enrich import TmpfsAtFault
from tracer.sources import tmpfs

BUS_OBJERR = 3


def bus(at: float, pid: int, code: int = BUS_ADRERR) -> Signal:
    """The SIGBUS the kernel raises at ``pid``'s own fault (the sender is the faulting thread)."""
    return sent(at, pid, pid, signal.SIGBUS, comm="python3", code=code)


def test_sigbus_with_a_full_tmpfs_names_it_and_advises_room_not_memory() -> None:
    v = one(
        bus(1.0, 100),
        tmpfs_full(1.01, 100, "/dev/shm", 64 * MiB, 64 * MiB),
        killed(1.0, 100, signal.SIGBUS, comm="python3"),
    )
    assert (v.cause, v.confidence, v.sender_role) == ("app_exit", "high", "self")
    assert "crashed with SIGBUS" in v.summary
    assert "/dev/shm" in v.summary and "64.0 MiB of 64.0 MiB used" in v.summary
    assert "--shm-size" in v.advice and "size=" in v.advice and "delete" in v.advice
    assert "Not a memory limit" in v.advice
    assert any("tmpfs /dev/shm full after the fault" in what for _, what in v.evidence)
    assert [ts for ts, _ in v.evidence] == sorted(ts for ts, _ in v.evidence)


def test_read_through_another_process_says_so() -> None:
    v = one(
        bus(1.0, 100),
        killed(1.0, 100, signal.SIGBUS),
        tmpfs_full(1.02, 100, "/tmp/t", 4 * MiB, 4 * MiB, mapped=False, via=99),
    )
    assert "/tmp/t" in v.summary and "--shm-size" in v.advice
    assert any("read through pid 99, in its mount namespace" in what for _, what in v.evidence)


def test_the_mapped_mount_is_named_before_a_fuller_one() -> None:
    v = one(
        bus(1.0, 100),
        tmpfs_full(1.01, 100, "/run", 10 * MiB, 10 * MiB, mapped=False),
        tmpfs_full(1.01, 100, "/dev/shm", 64 * MiB, 62 * MiB, mapped=True),
        killed(1.0, 100, signal.SIGBUS),
    )
    assert "/dev/shm" in v.summary and "/run" not in v.summary


@pytest.mark.parametrize(
    "events",
    [
        # no measurement: a plain crash
        [bus(1.0, 100)],
        # the measurement is another process's
        [bus(1.0, 100), tmpfs_full(1.01, 101)],
        # more than a second after the fault
        [bus(1.0, 100), tmpfs_full(2.5, 100)],
        # before the fault (an earlier one's)
        [tmpfs_full(0.5, 100), bus(1.0, 100)],
        # a SIGBUS for another reason (a truncated file: BUS_OBJERR is not "no backing")
        [bus(1.0, 100, BUS_OBJERR), tmpfs_full(1.01, 100)],
        # a SIGBUS it raised itself (raise(SIGBUS)): no fault at all
        [bus(1.0, 100, SI_TKILL), tmpfs_full(1.01, 100)],
    ],
)
def test_only_its_own_fault_with_its_own_measurement_counts(events: list[object]) -> None:
    v = one(*events, killed(1.0, 100, signal.SIGBUS))  # type: ignore[arg-type]
    assert v.cause == "app_exit"
    assert "tmpfs" not in v.summary and "--shm-size" not in v.advice


def test_a_measurement_is_no_verdict_on_its_own() -> None:
    v = one(tmpfs_full(1.01, 100), exit_code(1.5, 100, 0))
    assert v.cause == "app_exit" and "tmpfs" not in v.summary


# -- the recorder's side, on a fake /proc ---------------------------------------------------

SHM = "/dev/shm"
MOUNTINFO = (
    "24 1 0:22 / / rw,relatime - overlay overlay rw\n"
    f"30 24 0:30 / {SHM} rw,nosuid,nodev - tmpfs shm rw,size=65536k\n"
    "31 24 0:31 / /run rw,nosuid - tmpfs tmpfs rw,size=10240k\n"
    "32 24 0:32 / /proc/acpi ro,relatime - tmpfs tmpfs ro,size=0k\n"
)


class FakeStat:
    def __init__(self, blocks: int, free: int) -> None:
        self.f_frsize = 4096
        self.f_blocks = blocks
        self.f_bfree = self.f_bavail = free


def fake_proc(root: Path, pid: int, ns: str, maps: str = "") -> None:
    d = root / str(pid)
    (d / "ns").mkdir(parents=True)
    (d / "mountinfo").write_text(MOUNTINFO)
    (d / "maps").write_text(maps)
    os.symlink(ns, d / "ns" / "mnt")


@pytest.fixture
def statvfs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """/dev/shm full (64 MiB, 0 free), /run nearly empty; the paths asked for."""
    asked: list[str] = []

    def fake(path: str) -> FakeStat:
        asked.append(path)
        if path.endswith(SHM):
            return FakeStat(16384, 0)
        if path.endswith("/run"):
            return FakeStat(2560, 2500)
        raise FileNotFoundError(path)

    monkeypatch.setattr(tmpfs.os, "statvfs", fake)
    return asked


def test_is_full() -> None:
    assert tmpfs.is_full(64 * MiB, 64 * MiB, 0)
    assert tmpfs.is_full(1024 * MiB, 980 * MiB, 44 * MiB)  # 95%
    assert tmpfs.is_full(3 * MiB, 2 * MiB, 1 * MiB)  # less than a huge page free
    assert not tmpfs.is_full(64 * MiB, 10 * MiB, 54 * MiB)
    assert not tmpfs.is_full(4096, 0, 4096)  # a tiny placeholder, empty
    assert not tmpfs.is_full(0, 0, 0)  # size=0: unlimited


def test_the_process_itself_is_read_through_its_root(tmp_path: Path, statvfs: list[str]) -> None:
    fake_proc(tmp_path, 100, "mnt:[4026532001]", maps=f"7f00-7f10 rw-s 0 00:1e 5 {SHM}/x\n")
    [full] = tmpfs.full_tmpfs(100, 7, str(tmp_path)) or []
    assert full == TmpfsFull(7, 100, SHM, "tmpfs", 64 * MiB, 64 * MiB, 0, True, 0)
    # through its root; the read-only mask is not even measured
    assert statvfs == [f"{tmp_path}/100/root{SHM}", f"{tmp_path}/100/root/run"]


def test_a_gone_process_is_read_through_one_in_its_namespace_only(
    tmp_path: Path, statvfs: list[str]
) -> None:
    ns = "mnt:[4026532001]"
    fake_proc(tmp_path, 50, ns)  # its shell, still there
    fake_proc(tmp_path, 60, "mnt:[4026531841]")  # the host's namespace
    fake_proc(tmp_path, 100, ns)
    enricher = TmpfsAtFault(str(tmp_path), clock=lambda: t(1.01))
    noted = [
        Exec(ts=t(0.1), pid=50, comm="sh", filename="/bin/sh", cgroup_id=10),
        Exec(ts=t(0.1), pid=60, comm="sh", filename="/bin/sh", cgroup_id=10),
        Fork(ts=t(0.2), parent_pid=50, child_pid=100, comm="sh", cgroup_id=10),
    ]
    assert enricher.enrich(noted) == noted
    (tmp_path / "100" / "mountinfo").unlink()  # it died of the fault
    fault = bus(1.0, 100)
    out = enricher.enrich([fault])
    assert out[0] is fault
    assert out[1:] == [TmpfsFull(t(1.01), 100, SHM, "tmpfs", 64 * MiB, 64 * MiB, 0, False, 50)]
    # once a second per process
    assert enricher.enrich([bus(1.5, 100)]) == [bus(1.5, 100)]
    # its shell gone too: nothing, never the host's view
    enricher = TmpfsAtFault(str(tmp_path), clock=lambda: t(3.0))
    enricher.enrich(noted)
    (tmp_path / "50" / "mountinfo").unlink()
    (tmp_path / "50" / "ns" / "mnt").unlink()
    assert enricher.enrich([bus(3.0, 100)]) == [bus(3.0, 100)]


def test_a_signal_sent_by_another_process_is_not_read(tmp_path: Path, statvfs: list[str]) -> None:
    fake_proc(tmp_path, 100, "mnt:[4026532001]")
    enricher = TmpfsAtFault(str(tmp_path), clock=lambda: t(1.0))
    other = sent(1.0, 7, 100, signal.SIGBUS, code=BUS_ADRERR)  # (kill -BUS with a forged code)
    assert enricher.enrich([other]) == [other]
    gone = Exit(ts=t(1.0), pid=100, ppid=1, comm="x", cgroup_id=10, status=7, start_ns=0)
    assert enricher.enrich([gone]) == [gone] and statvfs == []


def test_notes_are_bounded_per_second(tmp_path: Path) -> None:
    for pid in (1, 2, 3):
        fake_proc(tmp_path, pid, "mnt:[4026532001]")
    enricher = TmpfsAtFault(str(tmp_path))
    enricher.MAX_NOTES = 2
    enricher.enrich(
        [Exec(ts=t(0.1 * p), pid=p, comm="a", filename="/a", cgroup_id=1) for p in (1, 2, 3)]
    )
    enricher.enrich([Exec(ts=t(1.1), pid=3, comm="a", filename="/a", cgroup_id=1)])
    assert sorted(enricher._ns) == [1, 2, 3]  # (3 in the next second)
    enricher = TmpfsAtFault(str(tmp_path))
    enricher.MAX_NOTES = 2
    enricher.enrich(
        [Exec(ts=t(0.1 * p), pid=p, comm="a", filename="/a", cgroup_id=1) for p in (1, 2, 3)]
    )
    assert sorted(enricher._ns) == [1, 2]
