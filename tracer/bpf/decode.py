"""Ring-buffer records → events: pure, no kernel access, tested without root.

A record starts with ``struct wr_hdr``; its ``type`` picks the decoder from a registry. Unknown
types and short records are counted in ``Decoder.unknown`` / ``Decoder.malformed``, never fatal
(an object newer than this Python could send types it does not know yet).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from sys import intern
from typing import Any, Literal

from tracer.bpf import layout
from tracer.events import (
    CgroupMkdir,
    Event,
    Exec,
    Exit,
    Fork,
    GpuAllocFailure,
    GpuCallFailure,
    GpuOomRecovered,
    OomKill,
    ReclaimStall,
    Signal,
)


def _str(raw: bytes) -> str:
    # comm and paths are NUL-padded: cut at the first NUL (find is cheaper than split). Interned:
    # a few distinct names repeat in thousands of kept processes and verdicts.
    end = raw.find(b"\0")
    return intern((raw if end < 0 else raw[:end]).decode(errors="replace"))


_EXIT = layout.struct_of(layout.WrExit)
_SIGNAL = layout.struct_of(layout.WrSignal)
_OOM = layout.struct_of(layout.WrOom)
_FORK = layout.struct_of(layout.WrFork)
_EXEC = layout.struct_of(layout.WrExec)
_STALL = layout.struct_of(layout.WrStall)
_RUNGS = layout.RUNG_NAMES
_MKDIR = layout.struct_of(layout.WrCgroupMkdir)
_GPU_ALLOC = layout.struct_of(layout.WrGpuAlloc)

# Header fields, in order: type size rung _pad ts_ns pid tgid cgroup_id comm
_BYTEORDER: Literal["little", "big"] = "little" if sys.byteorder == "little" else "big"


class Decoder:
    """Decodes raw records; ``page_size`` converts the kernel's page counts to bytes."""

    def __init__(self, page_size: int = 4096) -> None:
        self.page_size = page_size
        self.unknown = 0
        self.malformed = 0
        self._by_type: dict[int, tuple[int, Callable[[bytes], Event]]] = {
            layout.EV_EXIT: (_EXIT.size, self._exit),
            layout.EV_SIGNAL: (_SIGNAL.size, self._signal),
            layout.EV_OOM: (_OOM.size, self._oom),
            layout.EV_FORK: (_FORK.size, self._fork),
            layout.EV_EXEC: (_EXEC.size, self._exec),
            layout.EV_STALL: (_STALL.size, self._stall),
            layout.EV_CGROUP_MKDIR: (_MKDIR.size, self._mkdir),
            layout.EV_GPU_ALLOC_FAIL: (_GPU_ALLOC.size, self._gpu_alloc_fail),
            layout.EV_GPU_ALLOC_RECOVERED: (_GPU_ALLOC.size, self._gpu_alloc_recovered),
            layout.EV_GPU_CALL_FAIL: (_GPU_ALLOC.size, self._gpu_call_fail),
        }

    def decode(self, raw: bytes) -> Event | None:
        out = self.decode_batch((raw,))
        return out[0] if out else None

    def decode_batch(self, raws: Iterable[bytes]) -> list[Event]:
        # One loop with everything local: this runs for every record of an event storm. (The
        # events are msgspec Structs with gc=False, so building a batch of them never wakes the
        # cyclic collector: no need to pause it.)
        out: list[Event] = []
        append = out.append
        by_type = self._by_type
        little = _BYTEORDER == "little"
        for raw in raws:
            n = len(raw)
            if n < 2:
                self.malformed += 1
                continue
            entry = by_type.get(raw[0] | raw[1] << 8 if little else raw[1] | raw[0] << 8)
            if entry is None:
                self.unknown += 1
            elif n < entry[0]:
                self.malformed += 1
            else:
                append(entry[1](raw))
        return out

    @staticmethod
    def _exit(raw: bytes) -> Event:
        # the hottest record under exit storms: built positionally (Exit's field order)
        (_, _, rung, _, ts, _pid, tgid, cg, comm, code, ppid, start) = _EXIT.unpack_from(raw)
        return Exit(ts, tgid, ppid, _str(comm), cg, code, start, _RUNGS.get(rung) or str(rung))

    @staticmethod
    def _signal(raw: bytes) -> Event:
        (_, _, _, _, ts, pid, tgid, cg, comm, target, sig, code, result, group, flags, tcomm) = (
            _SIGNAL.unpack_from(raw)
        )
        return Signal(
            ts=ts,
            sender_pid=tgid,
            sender_tid=pid,
            sender_comm=_str(comm),
            sender_cgroup_id=cg,
            target_pid=target,
            target_comm=_str(tcomm),
            sig=sig,
            si_code=code,
            result=result,
            group=bool(group),
            sender_exiting=bool(flags & layout.SIGF_SENDER_EXITING),
        )

    def _oom(self, raw: bytes) -> Event:
        (_, _, rung, _, ts, _pid, tgid, _cg, comm, victim, memcg, vcg, lcg, limit, usage, vcomm) = (
            fields := _OOM.unpack_from(raw)
        )[:16]
        constraint, flags = fields[16:]
        return OomKill(
            ts=ts,
            victim_pid=victim,
            victim_comm=_str(vcomm),
            victim_cgroup_id=vcg,
            trigger_pid=tgid,
            trigger_comm=_str(comm),
            memcg=bool(memcg),
            limit_cgroup_id=lcg,
            limit_bytes=limit * self.page_size,
            usage_bytes=usage * self.page_size,
            rung=layout.RUNG_NAMES.get(rung, str(rung)),
            constraint=layout.OOM_CONSTRAINTS.get(constraint, ""),
            exiting=bool(flags & layout.OOM_EXITING),
            memsw=bool(flags & layout.OOM_MEMSW),
        )

    @staticmethod
    def _fork(raw: bytes) -> Event:
        (_, _, _, _, ts, _pid, tgid, cg, comm, child, _p) = _FORK.unpack_from(raw)
        return Fork(ts=ts, parent_pid=tgid, child_pid=child, comm=_str(comm), cgroup_id=cg)

    @staticmethod
    def _exec(raw: bytes) -> Event:
        (_, _, _, _, ts, _pid, tgid, cg, comm, filename) = _EXEC.unpack_from(raw)
        return Exec(ts=ts, pid=tgid, comm=_str(comm), filename=_str(filename), cgroup_id=cg)

    def _stall(self, raw: bytes) -> Event:
        (_, _, rung, _, ts, _pid, tgid, cg, comm, memcg, dur, pages, kind, _p) = _STALL.unpack_from(
            raw
        )
        return ReclaimStall(
            ts=ts,
            pid=tgid,
            comm=_str(comm),
            cgroup_id=memcg,
            task_cgroup_id=cg,
            kind=layout.STALL_KINDS.get(kind, str(kind)),
            duration_ns=dur,
            reclaimed_bytes=pages * self.page_size,
            rung=layout.RUNG_NAMES.get(rung, str(rung)),
        )

    @staticmethod
    def _gpu_alloc_fail(raw: bytes) -> Event:
        fields, result = _gpu_alloc_fields(raw)
        return GpuAllocFailure(**fields, result=result)

    @staticmethod
    def _gpu_alloc_recovered(raw: bytes) -> Event:
        fields, _result = _gpu_alloc_fields(raw)
        return GpuOomRecovered(**fields)

    @staticmethod
    def _gpu_call_fail(raw: bytes) -> Event:
        fields, result = _gpu_alloc_fields(raw)
        del fields["held_bytes"], fields["peak_bytes"]
        return GpuCallFailure(**fields, result=result)

    @staticmethod
    def _mkdir(raw: bytes) -> Event:
        (_, _, _, _, ts, _pid, _tgid, _cg, _comm, cid, level, _hid, path) = _MKDIR.unpack_from(raw)
        return CgroupMkdir(ts=ts, cgroup_id=cid, path=_str(path), level=level)


def _gpu_alloc_fields(raw: bytes) -> tuple[dict[str, Any], int]:
    """A struct wr_gpu_alloc's fields shared by a failure and a recovery, and its CUresult."""
    (_, _, _, _, ts, tid, tgid, cg, comm, req, held, peak, fails, func, result) = (
        _GPU_ALLOC.unpack_from(raw)
    )
    fields = {
        "ts": ts,
        "pid": tgid,
        "tid": tid,
        "comm": _str(comm),
        "cgroup_id": cg,
        "function": layout.GPU_FUNCS.get(func, f"func{func}"),
        "requested_bytes": req,
        "held_bytes": held,
        "peak_bytes": peak,
        "failures": fails,
    }
    return fields, result
