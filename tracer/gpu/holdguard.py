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
  the map is resumed (SIGCONT; unless another recorder still holds it, which then resumes it)
  and removed, a few times over a second (a program that was running when the recorder died
  may still add one), then the guard exits.
* Every ``CHECK_S`` it resumes the holds older than ``MAX_HOLD_NS`` (a recorder that is alive
  but stuck): a hold is bounded whatever happens to the recorder.
* It outlives what kills the recorder's whole cgroup but SIGKILL: its oom_score_adj is -1000,
  which memory.oom.group spares (mm/memcontrol.c ``oom_kill_memcg_member``; every container on
  cgroup v2 under Kubernetes >= 1.28) and a single OOM kill never picks; and it ignores
  SIGTERM, SIGINT and SIGHUP (``systemctl stop`` sends SIGTERM to the whole unit; a recorder
  that then hangs past TimeoutStopSec is SIGKILLed and the guard is what resumes its holds;
  systemd's final SIGKILL ends the guard after that). Where both die by SIGKILL, the kernel
  takes no new hold (the heartbeat, bpf/gpu.bpf.c) and the next recorder resumes what was left
  (``tracer.bpf.gpuhooks.GpuHooks.sweep_leftovers``).

Run as ``python -I -S holdguard.py MAP_FD PIPE_FD PEERS_FD HOLDER [MAX_HOLD_NS]`` (PEERS_FD: the
map of every recorder's holds, HOLDER: the recorder's pid): standard library only, and no import
of the package, so that it starts in milliseconds. The raw bpf(2) calls below are the
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
_BPF_MAP_LOOKUP_ELEM, _BPF_MAP_UPDATE_ELEM, _BPF_MAP_DELETE_ELEM, _BPF_MAP_GET_NEXT_KEY = 1, 2, 3, 4
# a share being ended (tracer.bpf.gpuhooks.RESOLVING): the others do not wait for it
RESOLVING = 1 << 63
# OOM_SCORE_ADJ_MIN: never an OOM victim, not even of memory.oom.group
OOM_SCORE_ADJ_MIN = -1000


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


class _PeerKey(ctypes.Structure):
    """struct wr_gpu_peer_key (bpf/events.h)."""

    _fields_ = [("tgid", ctypes.c_uint32), ("holder", ctypes.c_uint32)]


def held_by_others(peers_fd: int, pid: int, holder: int, now: int) -> bool:
    """Another recorder's fresh hold of ``pid`` is in the shared map (that one resumes it)."""
    prev, nxt = _PeerKey(), _PeerKey()
    first = True
    for _ in range(1 << 16):
        key = 0 if first else ctypes.addressof(prev)
        if not _bpf(_BPF_MAP_GET_NEXT_KEY, peers_fd, key, ctypes.addressof(nxt)):
            return False
        first = False
        since = ctypes.c_uint64()
        if (
            nxt.tgid == pid
            and nxt.holder != holder
            and _bpf(_BPF_MAP_LOOKUP_ELEM, peers_fd, ctypes.addressof(nxt), ctypes.addressof(since))
            and not since.value & RESOLVING
            and now - since.value < MAX_HOLD_NS
        ):
            return True
        ctypes.memmove(ctypes.addressof(prev), ctypes.addressof(nxt), ctypes.sizeof(nxt))
    return False


class Guard:
    """The recorder's holds (its private map), its share of the shared one, and who it is."""

    def __init__(self, map_fd: int, peers_fd: int, holder: int) -> None:
        self.map_fd, self.peers_fd, self.holder = map_fd, peers_fd, holder

    def resume(self, pid: int, now: int, force: bool) -> None:
        """The recorder's order (tracer.bpf.gpuhooks.GpuHooks.resume): forget its share, resume
        unless another recorder still holds it (``force``: past the bound, resume anyway),
        then forget the hold."""
        me, since = _PeerKey(tgid=pid, holder=self.holder), ctypes.c_uint64()
        if _bpf(_BPF_MAP_LOOKUP_ELEM, self.peers_fd, ctypes.addressof(me), ctypes.addressof(since)):
            since.value |= RESOLVING
            _bpf(_BPF_MAP_UPDATE_ELEM, self.peers_fd, ctypes.addressof(me), ctypes.addressof(since))
        if force or not held_by_others(self.peers_fd, pid, self.holder, now):
            with contextlib.suppress(OSError):  # gone already
                os.kill(pid, signal.SIGCONT)
        _bpf(_BPF_MAP_DELETE_ELEM, self.peers_fd, ctypes.addressof(me), 0)
        key = ctypes.c_uint32(pid)
        _bpf(_BPF_MAP_DELETE_ELEM, self.map_fd, ctypes.addressof(key), 0)


def _now() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def outlive_the_recorder() -> None:
    """Survive what ends the recorder's cgroup but SIGKILL (see the module docstring)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    # the recorder runs as root (CAP_SYS_RESOURCE); where it cannot be lowered, the guard runs
    # on as it would have before
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(OOM_SCORE_ADJ_MIN))


def run(guard: Guard, pipe_fd: int, max_hold_ns: int = MAX_HOLD_NS) -> None:
    outlive_the_recorder()
    while True:
        ready, _, _ = select.select([pipe_fd], [], [], CHECK_S)
        if ready:
            if not os.read(pipe_fd, 64):
                break
            continue
        now = _now()
        for pid, since in held(guard.map_fd).items():
            if now - since >= max_hold_ns:
                guard.resume(pid, now, force=True)
    for delay in AFTER_EOF_S:
        time.sleep(delay)
        for pid in held(guard.map_fd):
            guard.resume(pid, _now(), force=False)


# The descriptor on which the guard says it is ready (signals ignored, oom_score_adj set), when
# the recorder passes one: it lets the kernel hold only after that.
READY_FD_ENV = "WHYRESTART_GUARD_READY_FD"


if __name__ == "__main__":
    # Not the recorder's child: it would be one more process for whoever looks at the
    # recorder's children, and a zombie the recorder must reap. The parent exits at once.
    if os.fork() != 0:
        os._exit(0)
    map_fd, pipe_fd, peers_fd, holder = (int(a) for a in sys.argv[1:5])
    outlive_the_recorder()
    ready = os.environ.get(READY_FD_ENV)
    if ready:
        with contextlib.suppress(OSError):
            os.write(int(ready), b"1")
            os.close(int(ready))
    run(Guard(map_fd, peers_fd, holder), pipe_fd, *(int(a) for a in sys.argv[5:6]))
