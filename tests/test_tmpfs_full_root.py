"""Tier 3 (root, real kernel): a real SIGBUS on a real full tmpfs, recorded and judged.

Each test mounts a 4 MiB tmpfs in a mount namespace of its own (``unshare -m``, propagation
private: the host never sees it, and it goes with the namespace), and a program there maps a
file on it larger than the filesystem and writes it: the kernel's shmem_fault() cannot
allocate the page (-ENOSPC) and raises SIGBUS BUS_ADRERR at the write (mm/shmem.c). The verdict
must name the mount, its size and use, and advise room on it, not memory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import podmanimg
from tests.mt import build as mt_build
from tests.recording import record, record_while, wait_for
from tracer.events import BUS_ADRERR, Signal, TmpfsFull
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.root

MiB = 1024 * 1024

# maps 16 MiB of a file on the 4 MiB tmpfs and writes every page of it
WRITER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 16 << 20)
m = mmap.mmap(fd, 16 << 20)
for off in range(0, 16 << 20, 4096):
    m[off] = 1
print("no SIGBUS", flush=True)
"""

# The same in C. With a delay argument, a SIGBUS handler that waits that many ms before it dies
# of the signal (as a crash reporter writing its report does): the recorder reads the process
# itself, its maps too.
SLOW_CRASH = r"""
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static long delay_ms;

static void on_bus(int sig)
{
	struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000 * 1000};
	nanosleep(&ts, NULL);
	signal(sig, SIG_DFL);
	raise(sig);
}

int main(int argc, char **argv)
{
	size_t len = 16 << 20;
	int fd = open(argv[1], O_RDWR | O_CREAT, 0600);
	if (fd < 0 || ftruncate(fd, len) != 0)
		return 2;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return 3;
	delay_ms = argc > 2 ? atol(argv[2]) : 0;
	if (delay_ms)
		signal(SIGBUS, on_bus);
	memset(p, 1, len);
	return 0;
}
"""


def _in_own_tmpfs(mnt: Path, then: str) -> list[str]:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a tmpfs in a mount namespace of the test's own")
    mnt.mkdir()
    return [
        "unshare",
        "-m",
        "sh",
        "-c",
        f"mount --make-rprivate / && mount -t tmpfs -o size=4m tmpfs {mnt} && {then}",
    ]


def test_a_crash_on_a_full_tmpfs_names_it_through_its_shell(tmp_path: Path) -> None:
    # the writer is gone by the time its fault is decoded: its shell, still there in the same
    # mount namespace, is read instead
    writer = tmp_path / "writer.py"
    writer.write_text(WRITER)
    mnt = tmp_path / "mnt"
    argv = _in_own_tmpfs(mnt, f"python3 {writer} {mnt}/f; rc=$?; sleep 0.5; exit $rc")
    res = record(tmp_path, argv)
    events = list(read_trace(res.path).events)
    [fault] = [e for e in events if isinstance(e, Signal) and e.sig == signal.SIGBUS]
    assert fault.si_code == BUS_ADRERR and fault.sender_pid == fault.target_pid
    [full] = [e for e in events if isinstance(e, TmpfsFull)]
    assert (full.pid, full.mount_point, full.size_bytes, full.used_bytes, full.avail_bytes) == (
        fault.sender_pid,
        str(mnt),
        4 * MiB,
        4 * MiB,
        0,
    )
    assert full.via_pid not in (0, full.pid)
    [v] = [v for v in res.verdicts if v.pid == fault.sender_pid]
    assert (v.cause, v.confidence) == ("app_exit", "high")
    assert f"the tmpfs {mnt} was full (4.0 MiB of 4.0 MiB used)" in v.summary
    assert "--shm-size" in v.advice and "Not a memory limit" in v.advice
    assert res.command_status == 128 + signal.SIGBUS


def _build(tmp: Path, *static: str) -> Path:
    cc = mt_build.gcc()
    if cc is None:
        pytest.skip("no C compiler (gcc) to build the crashing writer")
    src = tmp / "slow_crash.c"
    src.write_text(SLOW_CRASH)
    exe = tmp / "slow_crash"
    subprocess.run([cc, "-O1", *static, "-o", str(exe), str(src)], check=True, capture_output=True)
    return exe


def test_a_crash_that_lingers_is_read_itself(tmp_path: Path) -> None:
    exe = _build(tmp_path)
    mnt = tmp_path / "mnt"
    res = record(tmp_path, _in_own_tmpfs(mnt, f"exec {exe} {mnt}/f 300"))
    [full] = [e for e in read_trace(res.path).events if isinstance(e, TmpfsFull)]
    assert (full.mount_point, full.size_bytes, full.used_bytes) == (str(mnt), 4 * MiB, 4 * MiB)
    assert (full.via_pid, full.mapped) == (0, True)  # itself, and it maps a file there
    [v] = [v for v in res.verdicts if v.pid == full.pid]
    assert (v.cause, v.confidence) == ("app_exit", "high")
    assert f"the tmpfs {mnt} was full (4.0 MiB of 4.0 MiB used)" in v.summary
    assert "--shm-size" in v.advice


def test_a_worker_writing_to_a_containers_full_dev_shm_is_told_shm_size(tmp_path: Path) -> None:
    # podman run --shm-size 4m: the worker dies of the fault, the container's shell lives on
    # (a DataLoader's main process after its worker's "bus error"), and the container's own
    # /dev/shm is the one measured, not the host's. The worker runs a moment before it writes
    # (as workers do): one that dies within milliseconds of its fork, before the recorder has
    # decoded the fork, has no mount namespace noted, and nothing is measured for it.
    exe = _build(tmp_path, "-static")
    root = tmp_path / "rootfs"
    root.mkdir()
    image = f"wr-test-shm-{os.getpid()}"
    name = f"wr-test-shm-{os.getpid()}-{time.monotonic_ns() % 100000}"

    def prepare() -> None:
        shutil.copy(exe, root / "bin" / "shmwriter")

    with podmanimg.busybox_image(root, image, ("sh", "sleep"), prepare):
        podman = podmanimg.podman
        script = "(sleep 0.3; exec /bin/shmwriter /dev/shm/f); sleep 1"
        podman(
            "create",
            "--name",
            name,
            "--network=none",
            "--shm-size",
            "4m",
            image,
            "sh",
            "-c",
            script,
        )

        def exited() -> bool:
            return podman("inspect", "-f", "{{.State.Status}}", name).stdout.strip() == "exited"

        def run() -> None:
            podman("start", name)
            wait_for(exited)

        try:
            res = record_while(tmp_path, name, run)
        finally:
            podman("rm", "-f", "-t", "0", name, check=False)
    [full] = [e for e in read_trace(res.path).events if isinstance(e, TmpfsFull)]
    assert (full.mount_point, full.size_bytes, full.used_bytes) == ("/dev/shm", 4 * MiB, 4 * MiB)
    [v] = [v for v in res.verdicts if v.pid == full.pid]
    assert (v.cause, v.confidence, v.unit) == ("app_exit", "high", f"podman {name}")
    assert "the tmpfs /dev/shm was full (4.0 MiB of 4.0 MiB used)" in v.summary
    assert "--shm-size" in v.advice and "Not a memory limit" in v.advice
