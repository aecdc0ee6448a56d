"""Kernel log parsing (tracer.parse.kmsg) and the /dev/kmsg reader (tracer.sources.kmsg).

The OOM fixtures in ``tests/data/kmsg/`` are raw ``/dev/kmsg`` records, one per line, in the
shape the kernels named in their file names print them (mm/oom_kill.c, mm/memcontrol.c):

* ``memcg_v1_6x.txt``: 6.1, cgroup v1 (docker), with ``memory+swap:``/``kmem:`` lines;
* ``memcg_v2_nested_6x.txt``: 6.8, cgroup v2 (kubernetes), the pod at its limit while the
  victim sits in a container cgroup below it, so oom_memcg != task_memcg;
* ``global_6x.txt``: 6.5 host-wide OOM (``global_oom``, no ``oom_memcg=``), with the kernel's
  ``\\x0a`` escapes in the Mem-Info record;
* ``oom_group_6x.txt``: 6.6 with ``memory.oom.group`` and CONFIG_PRINTK_CALLER: the first
  victim, the ``Tasks in`` line, then every member (the first victim printed again);
* ``memcg_v1_4_9_legacy.txt``: 4.9, no ``oom-kill:`` summary, ``Task in .. killed as a result
  of limit of ..``, ``Kill process .. score`` then a prefix-less ``Killed process`` line.

The reader tests need the real device (a regular file does not behave like ``/dev/kmsg``) and
run as root only; the loop logic around EPIPE/EINVAL is exercised by scripting ``os.read``.
"""

from __future__ import annotations

import errno
import os
import select
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.clock import monotonic_offset_ns
from tracer.errors import KernelUnsupported, PermissionProblem
from tracer.events import KmsgOom
from tracer.parse.kmsg import (
    KilledProcess,
    KmsgRecord,
    OomAssembler,
    parse_killed_process_line,
    parse_oom_kill_line,
    parse_record,
)
from tracer.sources.kmsg import KmsgReader, record_ts_ns

DATA = Path(__file__).parent / "data" / "kmsg"

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="reading /dev/kmsg needs root")


def load_records(name: str) -> list[KmsgRecord]:
    records = []
    for line in (DATA / name).read_text().splitlines():
        if not line:
            continue
        rec = parse_record(line.encode() + b"\n")
        assert rec is not None, f"fixture line does not parse: {line!r}"
        records.append(rec)
    return records


def assemble(records: list[KmsgRecord], asm: OomAssembler | None = None) -> list[KmsgOom]:
    asm = asm or OomAssembler()
    out: list[KmsgOom] = []
    for rec in records:
        out.extend(asm.feed(rec, rec.ts_us * 1000))
    return out


def rec(message: str, seq: int, ts_us: int = 1_000_000, level: int = 6) -> KmsgRecord:
    return KmsgRecord(level=level, facility=0, seq=seq, ts_us=ts_us, message=message)


def feed_lines(
    asm: OomAssembler, lines: list[str], seq0: int = 1, ts0: int = 1_000_000
) -> list[KmsgOom]:
    out: list[KmsgOom] = []
    for i, line in enumerate(lines):
        r = rec(line, seq0 + i, ts0 + 10 * i)
        out.extend(asm.feed(r, r.ts_us * 1000))
    return out


# ---------------------------------------------------------------------------------------------
# parse_record


def test_parse_record_plain() -> None:
    r = parse_record(b"6,1077,5123457938,-;Memory cgroup out of memory: Killed process 1\n")
    assert r == KmsgRecord(
        level=6,
        facility=0,
        seq=1077,
        ts_us=5123457938,
        message="Memory cgroup out of memory: Killed process 1",
    )


def test_parse_record_drops_dictionary_lines() -> None:
    raw = (
        b"6,199,143031,-;acpi PNP0A08:00: _OSC: platform retains control of PCIe features"
        b" (AE_NOT_FOUND)\n SUBSYSTEM=acpi\n DEVICE=+acpi:PNP0A08:00\n"
    )
    r = parse_record(raw)
    assert r is not None
    assert r.seq == 199 and r.ts_us == 143031 and r.level == 6
    assert r.message == (
        "acpi PNP0A08:00: _OSC: platform retains control of PCIe features (AE_NOT_FOUND)"
    )


def test_parse_record_facility_caller_and_flags() -> None:
    # A userspace write of "<30>..." (daemon.info) with CONFIG_PRINTK_CALLER's extra field and a
    # continuation flag.
    r = parse_record(b"30,12,99,c,caller=T4242;systemd[1]: Started foo.\n")
    assert r is not None
    assert (r.facility, r.level, r.seq, r.ts_us) == (3, 6, 12, 99)
    assert r.message == "systemd[1]: Started foo."


def test_parse_record_keeps_escapes_semicolons_and_empty_message() -> None:
    r = parse_record(b"6,5,6,-;a\\x0a b; c=d\n")
    assert r is not None and r.message == "a\\x0a b; c=d"
    r = parse_record(b"4,7,8,-;\n")
    assert r is not None and r.message == ""
    r = parse_record(b"4,7,8,-;no newline at the end")
    assert r is not None and r.message == "no newline at the end"


def test_parse_record_non_utf8_is_replaced() -> None:
    r = parse_record(b"6,1,2,-;caf\xe9 \xff\xfe ok\n")
    assert r is not None
    assert r.message == "caf\ufffd \ufffd\ufffd ok"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\n",
        b"no header at all\n",
        b"6,1,2,-\n",  # no ';'
        b"6,1,2;message\n",  # no flags field
        b"6,1;message\n",
        b"x,1,2,-;message\n",
        b"6,-1,2,-;message\n",
        b"6,1,2.5,-;message\n",
        b" 6,1,2,-;message\n",
        b"6,1,2,-\n;message\n",  # newline inside the header
        b"6,1,99999999999999999999999999,-;message\n",  # absurd number
        b"\xff\xfe,1,2,-;message\n",
    ],
)
def test_parse_record_malformed(raw: bytes) -> None:
    assert parse_record(raw) is None


@given(st.binary(max_size=300))
def test_parse_record_never_raises(raw: bytes) -> None:
    r = parse_record(raw)
    if r is not None:
        assert 0 <= r.level <= 7 and r.facility >= 0
        assert "\n" not in r.message


@given(
    st.integers(0, 2**10 - 1),
    st.integers(0, 2**63),
    st.integers(0, 2**63),
    st.text(max_size=200).filter(lambda s: "\n" not in s),
)
def test_parse_record_roundtrip(prio: int, seq: int, ts: int, message: str) -> None:
    raw = f"{prio},{seq},{ts},-;{message}\n".encode()
    assert parse_record(raw) == KmsgRecord(prio & 7, prio >> 3, seq, ts, message)


# ---------------------------------------------------------------------------------------------
# Single-line parsers


def test_parse_oom_kill_line_memcg() -> None:
    line = (
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        "oom_memcg=/a/b,task_memcg=/a/b/c,task=python3,pid=1234,uid=0"
    )
    assert parse_oom_kill_line(line) == {
        "constraint": "CONSTRAINT_MEMCG",
        "nodemask": "(null)",
        "cpuset": "/",
        "mems_allowed": "0",
        "oom_memcg": "/a/b",
        "task_memcg": "/a/b/c",
        "task": "python3",
        "pid": "1234",
        "uid": "0",
    }


def test_parse_oom_kill_line_global_with_node_lists_and_odd_comm() -> None:
    # Node lists contain commas; a comm may contain commas and '=' too.
    line = (
        "oom-kill:constraint=CONSTRAINT_MEMORY_POLICY,nodemask=0-1,3,cpuset=/,mems_allowed=0,2-3,"
        "global_oom,task_memcg=/system.slice/x.service,task=a,b=c,pid=77,uid=1000"
    )
    assert parse_oom_kill_line(line) == {
        "constraint": "CONSTRAINT_MEMORY_POLICY",
        "nodemask": "0-1,3",
        "cpuset": "/",
        "mems_allowed": "0,2-3",
        "global_oom": "",
        "task_memcg": "/system.slice/x.service",
        "task": "a,b=c",
        "pid": "77",
        "uid": "1000",
    }


def test_parse_oom_kill_line_truncated_and_others() -> None:
    # A record cut short (or a pr_cont piece not yet arrived): the fields that are there.
    assert parse_oom_kill_line("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null)") == {
        "constraint": "CONSTRAINT_MEMCG",
        "nodemask": "(null)",
    }
    assert parse_oom_kill_line("oom-kill:") == {}
    assert parse_oom_kill_line("Out of memory: Killed process 1 (x)") is None
    assert parse_oom_kill_line("something oom-kill:constraint=X") is None


def test_parse_killed_process_line_6x() -> None:
    line = (
        "Memory cgroup out of memory: Killed process 1234 (python3) total-vm:123456kB, "
        "anon-rss:65000kB, file-rss:1234kB, shmem-rss:0kB, UID:0 pgtables:300kB "
        "oom_score_adj:-998"
    )
    assert parse_killed_process_line(line) == KilledProcess(
        prefix="Memory cgroup out of memory",
        pid=1234,
        comm="python3",
        total_vm_kb=123456,
        anon_rss_kb=65000,
        file_rss_kb=1234,
        shmem_rss_kb=0,
        uid=0,
        pgtables_kb=300,
        oom_score_adj=-998,
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # 5.0-5.x: no UID/pgtables/oom_score_adj yet
        (
            "Out of memory: Killed process 9 (java) total-vm:10kB, anon-rss:8kB, "
            "file-rss:2kB, shmem-rss:0kB",
            KilledProcess("Out of memory", 9, "java", 10, 8, 2, 0),
        ),
        # 4.9: no prefix (it was on the "Kill process" line)
        (
            "Killed process 3021 (python) total-vm:568468kB, anon-rss:521044kB, "
            "file-rss:1372kB, shmem-rss:0kB",
            KilledProcess("", 3021, "python", 568468, 521044, 1372, 0),
        ),
        # 3.x/4.4: no shmem-rss
        (
            "Killed process 2188 (mysqld) total-vm:3330016kB, anon-rss:864176kB, file-rss:8072kB",
            KilledProcess("", 2188, "mysqld", 3330016, 864176, 8072, None),
        ),
        # RHEL 6 (2.6.32)
        (
            "Killed process 215701, UID 679, (java) total-vm:11017300kB, anon-rss:7152432kB, "
            "file-rss:1232kB",
            KilledProcess("", 215701, "java", 11017300, 7152432, 1232, None, uid=679),
        ),
        # vm.oom_kill_allocating_task, and a comm with spaces and parentheses
        (
            "Out of memory (oom_kill_allocating_task): Killed process 5 (a (b) c) "
            "total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB "
            "oom_score_adj:0",
            KilledProcess(
                "Out of memory (oom_kill_allocating_task)", 5, "a (b) c", 1, 1, 0, 0, 0, 4, 0
            ),
        ),
        # nothing after the comm
        ("Killed process 12 (x)", KilledProcess("", 12, "x")),
    ],
)
def test_parse_killed_process_line_old_shapes(line: str, expected: KilledProcess) -> None:
    assert parse_killed_process_line(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "Memory cgroup out of memory: Kill process 3021 (python) score 999 or sacrifice child",
        "oom_reaper: reaped process 3021 (python), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
        "Killed process abc (x)",
        "Killed process 12 x",
        "Memory cgroup out of memory: OOM victim 5 (x) is already exiting. Skip killing the task",
        "",
    ],
)
def test_parse_killed_process_line_rejects(line: str) -> None:
    assert parse_killed_process_line(line) is None


# ---------------------------------------------------------------------------------------------
# OomAssembler on full reports

V1_CG = "/docker/3f1c4b9e27d85a0c6e1f2b3a4d5c6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f"
V2_POD = (
    "/kubepods.slice/kubepods-burstable.slice/"
    "kubepods-burstable-pod7c0b5e3a_1f2d_4c6b_9e8a_0d1c2b3a4f5e.slice"
)
V2_CTR = (
    V2_POD
    + "/cri-containerd-9a8f7e6d5c4b3a2910f8e7d6c5b4a39281706f5e4d3c2b1a0918273645546372.scope"
)
GROUP_CG = (
    "/kubepods.slice/kubepods-burstable.slice/"
    "kubepods-burstable-pod3e5d7f9a_2b4c_4d6e_8f0a_1b2c3d4e5f60.slice/"
    "cri-containerd-ab12cd34ef56ab78cd90ef12ab34cd56ef78ab90cd12ef34ab56cd78ef90ab12.scope"
)
LEGACY_CG = "/docker/8c5d2e7f1a3b4c6d8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"


def victim(
    ts: int,
    pid: int,
    comm: str,
    constraint: str,
    oom_memcg: str,
    task_memcg: str,
    kb: tuple[int, int, int, int],
    oom_score_adj: int | None,
    memcg: bool,
) -> KmsgOom:
    """An expected victim; ``kb``: total-vm, anon-rss, file-rss, shmem-rss."""
    vm, anon, file, shmem = kb
    return KmsgOom(
        ts=ts,
        victim_pid=pid,
        victim_comm=comm,
        constraint=constraint,
        oom_memcg=oom_memcg,
        task_memcg=task_memcg,
        total_vm_kb=vm,
        anon_rss_kb=anon,
        file_rss_kb=file,
        shmem_rss_kb=shmem,
        oom_score_adj=oom_score_adj,
        memcg=memcg,
    )


GLOBAL_TASK = (
    "/system.slice/docker-5e0f2a1b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f.scope"
)
MEMCG = "CONSTRAINT_MEMCG"

# Each fixture report: the victims the assembler must make of it, then what it keeps of the
# report (the memory counter's usage/limit/failcnt, the task that invoked the OOM killer, the
# memory.oom.group path).
REPORTS = [
    pytest.param(
        "memcg_v1_6x.txt",
        [victim(5123457938000, 48211, "python3", MEMCG, V1_CG, V1_CG,
                (1248980, 1043808, 2232, 0), 0, True)],
        # "memory+swap:" and "kmem:" lines must not overwrite the memory counter
        (1048576, 1048576, 2841), "python3", None,
        id="memcg_v1_6x",
    ),
    pytest.param(
        "memcg_v2_nested_6x.txt",
        [victim(914302118604000, 2231904, "python", MEMCG, V2_POD, V2_CTR,
                (38129876, 2079840, 71036, 4), 937, True)],
        (2097152, 2097152, 1843), "pt_main_thread", None,
        id="memcg_v2_nested_6x",
    ),
    pytest.param(
        "global_6x.txt",
        [victim(2210875344136000, 90211, "tritonserver", "CONSTRAINT_NONE", "", GLOBAL_TASK,
                (145675292, 128987740, 125912, 0), 0, False)],
        None, "tritonserver", None,  # a global OOM's report clears the earlier usage
        id="global_6x",
    ),
    pytest.param(
        "oom_group_6x.txt",
        # The first victim has its own summary; the members' cgroups are not printed. 51230 is
        # printed again by the group loop and reported once.
        [
            victim(77120559031000, 51230, "gunicorn", MEMCG, GROUP_CG, GROUP_CG,
                   (302068, 277164, 1440, 0), 992, True),
            victim(77120559063000, 51188, "gunicorn", MEMCG, GROUP_CG, "",
                   (33564, 20672, 1416, 0), 992, True),
            victim(77120559093000, 51231, "gunicorn", MEMCG, GROUP_CG, "",
                   (249748, 215404, 1440, 0), 992, True),
        ],
        (524288, 524288, 96), "gunicorn", GROUP_CG,
        id="oom_group_6x",
    ),
    pytest.param(
        "memcg_v1_4_9_legacy.txt",
        # no constraint before 4.19; oom_memcg from "Task in .. killed as a result of limit of
        # .."; memcg from the "Kill process" line's prefix; no oom_score_adj printed
        [victim(8341868810000, 3021, "python", "", LEGACY_CG, LEGACY_CG,
                (568468, 521044, 1372, 0), None, True)],
        (524288, 524288, 1052), "python", None,
        id="memcg_v1_4_9_legacy",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("fixture", "victims", "usage", "trigger", "group"), REPORTS)
def test_full_report(
    fixture: str,
    victims: list[KmsgOom],
    usage: tuple[int, int, int] | None,
    trigger: str,
    group: str | None,
) -> None:
    asm = OomAssembler()
    asm.last_memcg_usage = (1, 2, 3)  # from an earlier report: a new report sets or clears it
    # The memcg stat dump each victim carries is checked in tests/test_composition.py.
    got = [
        msgspec.structs.replace(e, memcg_stat={}, memcg_stat_path="")
        for e in assemble(load_records(fixture), asm)
    ]
    assert got == victims
    assert asm.last_memcg_usage == usage
    assert asm.last_trigger_comm == trigger
    assert asm.last_oom_group == group


def test_report_escapes_survive_parsing() -> None:
    records = load_records("global_6x.txt")
    mem_info = next(r for r in records if r.message.startswith("active_anon:"))
    assert "\\x0a" in mem_info.message  # the kernel's escape survives parsing


def test_fixtures_back_to_back_stay_separate() -> None:
    # Reports from one stream, each starting with its own "invoked oom-killer" line.
    records: list[KmsgRecord] = []
    seq = 0
    for name in ("memcg_v1_6x.txt", "global_6x.txt", "memcg_v1_4_9_legacy.txt"):
        for r in load_records(name):
            records.append(KmsgRecord(r.level, r.facility, seq, r.ts_us, r.message))
            seq += 1
    events = assemble(records)
    assert [(e.victim_pid, e.constraint, e.memcg) for e in events] == [
        (48211, "CONSTRAINT_MEMCG", True),
        (90211, "CONSTRAINT_NONE", False),
        (3021, "", True),
    ]


# ---------------------------------------------------------------------------------------------
# OomAssembler edge cases

KILLED_MEMCG = (
    "Memory cgroup out of memory: Killed process {pid} (x) total-vm:10kB, anon-rss:8kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0"
)
SUMMARY = (
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    "oom_memcg=/a,task_memcg=/a/b,task=x,pid={pid},uid=0"
)


def test_killed_without_header_uses_prefix() -> None:
    asm = OomAssembler()
    [memcg_kill] = feed_lines(asm, [KILLED_MEMCG.format(pid=5)])
    assert (memcg_kill.constraint, memcg_kill.oom_memcg, memcg_kill.task_memcg) == ("", "", "")
    assert memcg_kill.memcg is True
    [global_kill] = feed_lines(asm, ["Out of memory: Killed process 6 (y)"], seq0=2)
    assert global_kill.memcg is False and global_kill.total_vm_kb is None


def test_rate_limited_kill_does_not_inherit_previous_summary() -> None:
    # The kernel rate-limits the header but not the "Killed process" line: the second kill
    # must not be glued to the first one's summary.
    asm = OomAssembler()
    first, second = feed_lines(
        asm,
        [SUMMARY.format(pid=10), KILLED_MEMCG.format(pid=10), KILLED_MEMCG.format(pid=11)],
    )
    assert (first.constraint, first.oom_memcg, first.task_memcg) == (
        "CONSTRAINT_MEMCG",
        "/a",
        "/a/b",
    )
    assert (second.constraint, second.oom_memcg, second.task_memcg) == ("", "", "")
    assert second.memcg is True


def test_summary_for_other_pid_keeps_report_facts_only() -> None:
    # The summary names the chosen task; a different pid was killed (e.g. a sacrificed child on
    # 4.19-5.x). Constraint and oom_memcg describe the OOM; task_memcg was the other task's.
    asm = OomAssembler()
    [ev] = feed_lines(asm, [SUMMARY.format(pid=10), KILLED_MEMCG.format(pid=12)])
    assert (ev.constraint, ev.oom_memcg, ev.task_memcg) == ("CONSTRAINT_MEMCG", "/a", "")


def test_skip_line_claims_the_summary() -> None:
    asm = OomAssembler()
    events = feed_lines(
        asm,
        [
            SUMMARY.format(pid=10),
            "Memory cgroup out of memory: OOM victim 10 (x) is already exiting. Skip killing "
            "the task",
            KILLED_MEMCG.format(pid=11),  # a later, rate-limited OOM
        ],
    )
    assert [(e.victim_pid, e.constraint) for e in events] == [(11, "")]


def test_summary_split_by_pr_cont_is_reassembled() -> None:
    asm = OomAssembler()
    [ev] = feed_lines(
        asm,
        [
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null)",
            ",cpuset=/,mems_allowed=0",
            ",oom_memcg=/a,task_memcg=/a/b",
            ",task=x,pid=10,uid=0",
            KILLED_MEMCG.format(pid=10),
        ],
    )
    assert (ev.constraint, ev.oom_memcg, ev.task_memcg) == ("CONSTRAINT_MEMCG", "/a", "/a/b")


def test_sequence_gap_drops_partial_report() -> None:
    asm = OomAssembler()
    asm.feed(rec(SUMMARY.format(pid=10), seq=1), 0)
    # Records 2..9 were overwritten before we read them; whatever they said is unknown.
    [ev] = asm.feed(rec(KILLED_MEMCG.format(pid=10), seq=10), 0)
    assert (ev.constraint, ev.task_memcg) == ("", "")


def test_group_members_end_with_the_group() -> None:
    asm = OomAssembler()
    lines = [
        SUMMARY.format(pid=10),
        KILLED_MEMCG.format(pid=10),
        "Tasks in /a/b are going to be killed due to memory.oom.group set",
        KILLED_MEMCG.format(pid=11),
        "Memory cgroup out of memory: OOM victim 12 (x) is already exiting. Skip killing the task",
        KILLED_MEMCG.format(pid=13),
    ]
    events = feed_lines(asm, lines)
    assert [(e.victim_pid, e.constraint, e.oom_memcg, e.task_memcg) for e in events] == [
        (10, "CONSTRAINT_MEMCG", "/a", "/a/b"),
        (11, "CONSTRAINT_MEMCG", "/a", ""),
        (13, "CONSTRAINT_MEMCG", "/a", ""),
    ]
    assert asm.last_oom_group == "/a/b"
    # Long after the group loop, a bare Killed line is a new (rate-limited) OOM, not a member.
    late = rec(KILLED_MEMCG.format(pid=20), seq=len(lines) + 1, ts_us=60_000_000)
    [ev] = asm.feed(late, 0)
    assert (ev.constraint, ev.oom_memcg) == ("", "")


def test_legacy_group_4_19_without_prefixes() -> None:
    # 4.19: "Kill process" carries the prefix; the Killed lines of the group have none.
    asm = OomAssembler()
    events = feed_lines(
        asm,
        [
            "allocate invoked oom-killer: gfp_mask=0x6280ca(GFP_HIGHUSER_MOVABLE|__GFP_ZERO), "
            "nodemask=(null), order=0, oom_score_adj=0",
            "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
            "global_oom,task_memcg=/A1,task=allocate,pid=1221,uid=0",
            "Out of memory: Kill process 1221 (allocate) score 241 or sacrifice child",
            "Killed process 1221 (allocate) total-vm:2257144kB, anon-rss:2009128kB, "
            "file-rss:4kB, shmem-rss:0kB",
            "Tasks in /A1 are going to be killed due to memory.oom.group set",
            "Killed process 1217 (allocate) total-vm:2052344kB, anon-rss:1704036kB, "
            "file-rss:0kB, shmem-rss:0kB",
        ],
    )
    assert [(e.victim_pid, e.constraint, e.task_memcg, e.memcg) for e in events] == [
        (1221, "CONSTRAINT_NONE", "/A1", False),
        (1217, "CONSTRAINT_NONE", "", False),
    ]


def test_legacy_sacrificed_child_and_stale_task_in() -> None:
    asm = OomAssembler()
    events = feed_lines(
        asm,
        [
            "Task in /1037/uid killed as a result of limit of /1037",
            "memory: usage 102400kB, limit 102400kB, failcnt 736",
            "Memory cgroup out of memory: Kill process 2188 (apache2) score 60 or sacrifice child",
            "Killed process 2190 (apache2) total-vm:1kB, anon-rss:1kB, file-rss:0kB",
            # next OOM, header rate limited
            "Memory cgroup out of memory: Kill process 3000 (apache2) score 61 or sacrifice child",
            "Killed process 3000 (apache2) total-vm:1kB, anon-rss:1kB, file-rss:0kB",
        ],
    )
    assert [(e.victim_pid, e.oom_memcg, e.task_memcg, e.memcg) for e in events] == [
        (2190, "/1037", "", True),  # a child of the chosen task: its own cgroup is unknown
        (3000, "", "", True),
    ]
    assert asm.last_memcg_usage == (102400, 102400, 736)


def test_usage_line_variants() -> None:
    asm = OomAssembler()
    feed_lines(
        asm,
        [
            "memory: usage 65536kB, limit 65536kB, failcnt 12",
            "memory+swap: usage 1kB, limit 2kB, failcnt 3",
            "swap: usage 4kB, limit 5kB, failcnt 6",
            "memory: usage garbage",
        ],
    )
    assert asm.last_memcg_usage == (65536, 65536, 12)


OOM_FRAGMENTS = [
    "",
    "oom-kill:",
    "oom-kill:constraint=",
    ",task=",
    ",pid=",
    "Killed process ",
    "Memory cgroup out of memory: Killed process ",
    "Out of memory: Kill process ",
    "Tasks in ",
    "Task in ",
    "memory: usage ",
    " invoked oom-killer: ",
    "OOM victim ",
    " killed as a result of limit of ",
    " are going to be killed due to memory.oom.group set",
    "(",
    ")",
    " total-vm:",
    "kB, ",
    "9" * 5000,
]

oom_ish_text = st.lists(
    st.one_of(st.sampled_from(OOM_FRAGMENTS), st.text(max_size=20), st.integers().map(str)),
    max_size=8,
).map("".join)


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(oom_ish_text, st.integers(-5, 5), st.integers(-(2**40), 2**40)),
        max_size=30,
    )
)
def test_assembler_never_raises(items: list[tuple[str, int, int]]) -> None:
    asm = OomAssembler()
    seq = 0
    for message, seq_step, ts in items:
        seq += seq_step
        for ev in asm.feed(rec(message, seq=seq, ts_us=ts), ts):
            assert isinstance(ev, KmsgOom) and ev.ts == ts


@given(st.text(max_size=300))
def test_line_parsers_never_raise(message: str) -> None:
    parse_oom_kill_line(message)
    parse_killed_process_line(message)
    parse_oom_kill_line("oom-kill:" + message)
    parse_killed_process_line("Killed process 1 (" + message)


# ---------------------------------------------------------------------------------------------
# Clocks


def test_clock_offset_and_record_ts() -> None:
    offset = monotonic_offset_ns()
    # BOOTTIME runs ahead of MONOTONIC by the time spent suspended: never behind it (allow a
    # little sampling noise).
    assert offset < 1_000_000
    r = KmsgRecord(6, 0, 1, 1_500_000, "x")
    assert record_ts_ns(r, offset) == 1_500_000_000 - offset


# ---------------------------------------------------------------------------------------------
# KmsgReader


def test_reader_missing_device_is_kernel_unsupported(tmp_path: Path) -> None:
    with pytest.raises(KernelUnsupported) as info:
        KmsgReader(str(tmp_path / "no-kmsg"))
    assert "no-kmsg" in str(info.value)


def test_reader_not_a_kmsg_device(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # A FIFO opened non-blocking cannot seek: refused with a message, fd not leaked.
    with pytest.raises(KernelUnsupported):
        KmsgReader(str(fifo))


Scripted = tuple[KmsgReader, list[bytes | int]]


@pytest.fixture
def scripted_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[KmsgReader, list[bytes | int]]]:
    """A reader whose os.read replays a script: bytes are records, ints are errnos.

    The descriptor is /dev/null's; only the read loop's handling of the kernel's answers is
    under test here.
    """
    script: list[bytes | int] = []
    reader = KmsgReader("/dev/null")
    real_read = os.read

    def fake_read(fd: int, n: int) -> bytes:
        if fd != reader.fileno():  # anyone else reading meanwhile gets the real thing
            return real_read(fd, n)
        item = script.pop(0) if script else errno.EAGAIN
        if isinstance(item, int):
            raise OSError(item, os.strerror(item))
        return item

    monkeypatch.setattr(os, "read", fake_read)
    yield reader, script
    reader.close()


def test_reader_counts_overwritten_records(scripted_reader: Scripted) -> None:
    reader, script = scripted_reader
    script += [b"6,10,1,-;a\n", errno.EPIPE, b"6,15,2,-;b\n", b"6,16,3,-;c\n", errno.EAGAIN]
    assert [r.message for r in reader.read_available()] == ["a", "b", "c"]
    assert reader.overwritten == 4
    # EPIPE before any record was seen: at least one lost, the count is unknown.
    script += [errno.EPIPE, b"6,30,4,-;d\n"]
    assert [r.seq for r in reader.read_available()] == [30]
    assert reader.overwritten == 4 + 13


def test_reader_epipe_first_counts_one(scripted_reader: Scripted) -> None:
    reader, script = scripted_reader
    script += [errno.EPIPE, b"6,100,1,-;a\n"]
    assert len(reader.read_available()) == 1
    assert reader.overwritten == 1


def test_reader_skips_oversized_and_malformed(scripted_reader: Scripted) -> None:
    reader, script = scripted_reader
    script += [b"garbage", errno.EINVAL, b"6,1,1,-;big\n", errno.EINVAL, errno.EINVAL]
    assert [r.message for r in reader.read_available()] == ["big"]
    assert reader.malformed == 1
    assert reader.skipped == 1


def test_reader_other_errors_raise(scripted_reader: Scripted) -> None:
    reader, script = scripted_reader
    script.append(errno.EIO)
    with pytest.raises(Exception, match="kernel log"):
        reader.read_available()


@pytest.mark.root
@needs_root
def test_reader_real_device_reads_injected_line() -> None:
    marker = f"whyrestart-test-{uuid.uuid4().hex}"
    with KmsgReader() as reader:
        assert isinstance(reader.read_available(), list)
        with open("/dev/kmsg", "w") as kmsg:  # root may inject a record
            kmsg.write(f"<6>{marker}\n")
        ready, _, _ = select.select([reader], [], [], 5.0)
        assert ready, "/dev/kmsg did not become readable after the write"
        found: list[KmsgRecord] = []
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            found += [r for r in reader.read_available() if marker in r.message]
            if found:
                break
            time.sleep(0.01)
        assert len(found) == 1
        (r,) = found
        assert r.message.endswith(marker) and r.level == 6
        # A userspace write has the "user" facility (1) unless it names another.
        assert r.facility == 1
        # Each record is handed over once.
        assert all(marker not in x.message for x in reader.read_available())
    assert reader.closed


@pytest.mark.root
@needs_root
def test_reader_skips_old_messages() -> None:
    marker = f"whyrestart-old-{uuid.uuid4().hex}"
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<6>{marker}\n")
    with KmsgReader() as reader:
        assert all(marker not in r.message for r in reader.read_available())
    with KmsgReader(from_end=False) as reader:
        seen = []
        while batch := reader.read_available():
            seen += batch
        assert any(marker in r.message for r in seen)


@pytest.mark.root
@needs_root
def test_reader_unprivileged_open_is_permission_problem() -> None:
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        pytest.skip("kernel.dmesg_restrict=0: unprivileged users may read /dev/kmsg")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            KmsgReader()
            code = 0
        except PermissionProblem as exc:
            code = 3 if "dmesg_restrict" in str(exc) else 2
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3
