"""The guard of held processes: resumes them when the recorder cannot.

bpf/gpu.bpf.c stops (SIGSTOP) a watched process that opened a driver library nobody probed yet,
and records it in the map ``gpu_held``; the recorder attaches the probes and resumes it. A
recorder killed with SIGKILL in between would leave it stopped for good, so the recorder starts
this guard first, as a separate process in its own session (a signal to the recorder's process
group does not reach it; it forks once more, so it is not the recorder's child either) that
holds only two descriptors: the ``gpu_held`` map and the read end of a pipe whose write end only
the recorder holds. Nothing else of the recorder's: the probes detach when the recorder dies,
so no new hold can start.

* The pipe reads end of file (the recorder is gone, however it ended): every process still in
  the map is resumed (SIGCONT) and removed, a few times over a second (a program that was
  running when the recorder died may still add one), then the guard exits.
* Every ``CHECK_S`` it resumes the holds older than ``MAX_HOLD_NS`` (a recorder that is alive
  but stuck): a hold is bounded whatever happens to the recorder.

Run as ``python -I -S holdguard.py MAP_FD PIPE_FD [MAX_HOLD_NS]``: standard library only, and
no import of the package, so that it starts in milliseconds. The raw bpf(2) calls below are the
three map commands it needs; linking libbpf for them would cost more than they do.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time

MAX_HOLD_NS = 2_000_000_000
CHECK_S = 0.5
AFTER_EOF_S = (0.0, 0.05, 0.2, 1.0)

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_MAP_LOOKUP_ELEM, _BPF_MAP_DELETE_ELEM, _BPF_MAP_GET_NEXT_KEY = 1, 3, 4


class _Attr(ctypes.Structure):
    """union bpf_attr's map-element commands: map_fd, key, value / next_key, flags."""

    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


class _Hold(ctypes.Structure):
    """struct wr_gpu_hold (bpf/events.h)."""

    _fields_ = [
        ("dev", ctypes.c_uint64),
        ("ino", ctypes.c_uint64),
        ("ts_ns", ctypes.c_uint64),
        ("fd", ctypes.c_int32),
        ("_pad", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(None, use_errno=True)


def _bpf(cmd: int, map_fd: int, key: int, value: int) -> bool:
    attr = _Attr(map_fd=map_fd, key=key, value=value)
    nr = _SYS_BPF[os.uname().machine]
    return int(_libc.syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr))) == 0


def held(map_fd: int) -> dict[int, int]:
    """pid -> when it was stopped (CLOCK_BOOTTIME ns), for every entry of gpu_held."""
    out: dict[int, int] = {}
    prev, nxt = ctypes.c_uint32(0), ctypes.c_uint32(0)
    first = True
    while len(out) < 1 << 16:
        key = 0 if first else ctypes.addressof(prev)
        if not _bpf(_BPF_MAP_GET_NEXT_KEY, map_fd, key, ctypes.addressof(nxt)):
            break
        first = False
        hold = _Hold()
        if _bpf(_BPF_MAP_LOOKUP_ELEM, map_fd, ctypes.addressof(nxt), ctypes.addressof(hold)):
            out[nxt.value] = hold.ts_ns
        prev.value = nxt.value
    return out


def resume(map_fd: int, pid: int) -> None:
    """SIGCONT, then forget: dying between the two leaves an entry, never a stopped process."""
    with contextlib.suppress(OSError):  # gone already
        os.kill(pid, signal.SIGCONT)
    key = ctypes.c_uint32(pid)
    _bpf(_BPF_MAP_DELETE_ELEM, map_fd, ctypes.addressof(key), 0)


def run(map_fd: int, pipe_fd: int, max_hold_ns: int = MAX_HOLD_NS) -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        ready, _, _ = select.select([pipe_fd], [], [], CHECK_S)
        if ready:
            if not os.read(pipe_fd, 64):
                break
            continue
        now = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        for pid, since in held(map_fd).items():
            if now - since >= max_hold_ns:
                resume(map_fd, pid)
    for delay in AFTER_EOF_S:
        time.sleep(delay)
        for pid in held(map_fd):
            resume(map_fd, pid)


if __name__ == "__main__":
    # Not the recorder's child: it would be one more process for whoever looks at the
    # recorder's children, and a zombie the recorder must reap. The parent exits at once.
    if os.fork() != 0:
        os._exit(0)
    run(int(sys.argv[1]), int(sys.argv[2]), *(int(a) for a in sys.argv[3:4]))
