"""Tier 1: raw ring-buffer records (built from the ctypes mirror) decode to the right events."""

from __future__ import annotations

import ctypes

from hypothesis import given
from hypothesis import strategies as st

from tracer.analysis import wording as say
from tracer.bpf import layout
from tracer.bpf.decode import Decoder
from tracer.events import Exec, Exit, Fork, OomKill, Signal, decode_wait_status


def hdr(kind: int, cls: type[ctypes.Structure], rung: int = 3) -> layout.WrHdr:
    return layout.WrHdr(
        type=kind,
        size=ctypes.sizeof(cls),
        rung=rung,
        ts_ns=123456789,
        pid=41,
        tgid=40,
        cgroup_id=777,
        comm=b"python3",
    )


def test_exit() -> None:
    rec = layout.WrExit(
        h=hdr(layout.EV_EXIT, layout.WrExit), exit_code=23 << 8, ppid=1, start_ns=1000
    )
    ev = Decoder().decode(bytes(rec))
    assert ev == Exit(
        ts=123456789,
        pid=40,
        ppid=1,
        comm="python3",
        cgroup_id=777,
        status=23 << 8,
        start_ns=1000,
        rung="tp_btf",
    )
    assert isinstance(ev, Exit) and ev.wait.code == 23


def test_signal() -> None:
    rec = layout.WrSignal(
        h=hdr(layout.EV_SIGNAL, layout.WrSignal),
        target_pid=99,
        sig=15,
        si_code=0,
        result=0,
        group=1,
        target_comm=b"sleep",
    )
    ev = Decoder().decode(bytes(rec))
    assert isinstance(ev, Signal)
    assert (ev.sender_pid, ev.sender_tid, ev.sender_comm) == (40, 41, "python3")
    assert (ev.target_pid, ev.target_comm, ev.sig, ev.group) == (99, "sleep", 15, True)


def test_oom_converts_pages_to_bytes() -> None:
    rec = layout.WrOom(
        h=hdr(layout.EV_OOM, layout.WrOom, rung=4),
        victim_pid=50,
        memcg=1,
        victim_cgroup_id=5,
        limit_cgroup_id=6,
        limit_pages=16384,
        usage_pages=16380,
        victim_comm=b"hog",
    )
    ev = Decoder(page_size=4096).decode(bytes(rec))
    assert isinstance(ev, OomKill)
    assert ev.limit_bytes == 64 * 1024 * 1024 and ev.usage_bytes == 16380 * 4096
    assert (ev.victim_pid, ev.victim_comm, ev.memcg, ev.rung) == (50, "hog", True, "tracepoint")
    assert (ev.trigger_pid, ev.limit_cgroup_id) == (40, 6)


def test_oom_carries_oom_controls_constraint_and_the_exiting_mark() -> None:
    # enum wr_oom_constraint: 2 = CONSTRAINT_CPUSET; flags WR_OOM_EXITING
    rec = layout.WrOom(
        h=hdr(layout.EV_OOM, layout.WrOom, rung=1), victim_pid=50, constraint=2, flags=1
    )
    ev = Decoder().decode(bytes(rec))
    assert isinstance(ev, OomKill)
    assert (ev.constraint, ev.exiting, ev.memcg, ev.rung) == ("cpuset", True, False, "fentry")
    # a guessing rung reads no oom_control: no constraint
    rec = layout.WrOom(h=hdr(layout.EV_OOM, layout.WrOom, rung=3), victim_pid=50)
    ev = Decoder().decode(bytes(rec))
    assert isinstance(ev, OomKill) and (ev.constraint, ev.exiting) == ("", False)


def test_an_oom_at_the_memory_plus_swap_limit_says_so() -> None:
    # flags WR_OOM_MEMSW: cgroup v1's memsw counter was the one at its limit
    rec = layout.WrOom(
        h=hdr(layout.EV_OOM, layout.WrOom, rung=1),
        victim_pid=50,
        memcg=1,
        limit_pages=512,
        usage_pages=512,
        flags=2,
    )
    ev = Decoder(page_size=4096).decode(bytes(rec))
    assert isinstance(ev, OomKill) and (ev.memsw, ev.exiting) == (True, False)
    assert "memory+swap limit" in say.bpf_oom(ev, "/docker/web")


def test_fork_and_exec() -> None:
    f = layout.WrFork(h=hdr(layout.EV_FORK, layout.WrFork), child_pid=60)
    e = layout.WrExec(h=hdr(layout.EV_EXEC, layout.WrExec), filename=b"/usr/bin/sleep")
    d = Decoder()
    assert d.decode(bytes(f)) == Fork(
        ts=123456789, parent_pid=40, child_pid=60, comm="python3", cgroup_id=777
    )
    assert d.decode(bytes(e)) == Exec(
        ts=123456789, pid=40, comm="python3", filename="/usr/bin/sleep", cgroup_id=777
    )


def test_unknown_and_short_records_are_counted_not_fatal() -> None:
    d = Decoder()
    unknown = bytes(layout.WrHdr(type=99, size=48))
    short = bytes(layout.WrExit(h=hdr(layout.EV_EXIT, layout.WrExit)))[:50]
    assert d.decode_batch([unknown, short, b"", b"\x01"]) == []
    assert (d.unknown, d.malformed) == (1, 3)


@given(st.binary(max_size=300))
def test_any_bytes_decode_or_are_counted(raw: bytes) -> None:
    d = Decoder()
    d.decode(raw)
    assert d.unknown + d.malformed <= 1


def test_wait_status() -> None:
    assert decode_wait_status(0).code == 0
    assert decode_wait_status(3 << 8).code == 3
    ws = decode_wait_status(9)
    assert (ws.code, ws.signal, ws.core_dumped) == (None, 9, False)
    ws = decode_wait_status(11 | 0x80)
    assert (ws.signal, ws.core_dumped) == (11, True)
