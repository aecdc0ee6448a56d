"""Issue 30 §1: what filled the limiting cgroup at the kill.

Pure tests on event streams: the kernel's OOM report's memcg stat dump (parse/kmsg.py), the
composition a verdict states (rules.composition, split_stat) and the words it uses
(wording.composition_text, memory_at_kill)."""

from __future__ import annotations

import signal

import msgspec

from tests.streams import MiB, cgroup, killed, kmsg, one, oom, sample
from tests.test_kmsg import assemble, load_records, rec
from tracer.analysis.quantities import fmt_bytes
from tracer.analysis.wording import memory_at_kill
from tracer.events import KmsgOom

# The records of a real v1 report on kernel 6.18 (a python process writing 1 MiB files into a
# tmpfs from a 32 MiB cgroup), trimmed of the stack dump and the stat keys nothing reads.
V1_TMPFS_REPORT = [
    "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "memory: usage 32768kB, limit 32768kB, failcnt 73",
    "memory+swap: usage 32768kB, limit 9007199254740988kB, failcnt 0",
    "kmem: usage 212kB, limit 9007199254740988kB, failcnt 0",
    "Memory cgroup stats for /compose_probe20624:",
    "cache 25206784",
    "rss 8077312",
    "shmem 25206784",
    "mapped_file 0",
    "swap 0",
    "hierarchical_memory_limit 33554432",
    "total_cache 25206784",
    "total_rss 8077312",
    "total_shmem 25206784",
    "total_mapped_file 0",
    "total_swap 0",
    "Tasks state (memory values in pages):",
    "[  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents"
    " oom_score_adj name",
    "[  23099]     0 23099     4415     3597     1942     1655         0    77824        0"
    "             0 python3",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    "oom_memcg=/compose_probe20624,task_memcg=/compose_probe20624,task=python3,pid=23099,uid=0",
    "Memory cgroup out of memory: Killed process 23099 (python3) total-vm:17660kB, "
    "anon-rss:7768kB, file-rss:6620kB, shmem-rss:0kB, UID:0 pgtables:76kB oom_score_adj:0",
]


def report_oom(lines: list[str]) -> KmsgOom:
    [km] = assemble([rec(m, seq) for seq, m in enumerate(lines)])
    return km


def with_stat(km: KmsgOom, stat: dict[str, int], path: str = "/demo") -> KmsgOom:
    return msgspec.structs.replace(km, memcg_stat=stat, memcg_stat_path=path)


# -- the kernel's report ---------------------------------------------------------------------


def test_the_v1_reports_stat_dump_is_kept_in_v2_names() -> None:
    km = report_oom(V1_TMPFS_REPORT)
    assert km.memcg_stat_path == "/compose_probe20624"
    stat = km.memcg_stat
    assert stat["anon"] == 8077312 and stat["file"] == 25206784 and stat["shmem"] == 25206784
    assert stat["kernel"] == 212 * 1024  # the kmem usage line: v1 prints no kernel key
    assert "rss" not in stat and "cache" not in stat


def test_the_v2_reports_stat_dump_is_kept() -> None:
    [km] = assemble(load_records("memcg_v2_nested_6x.txt"))
    assert km.memcg_stat_path.endswith("pod7c0b5e3a_1f2d_4c6b_9e8a_0d1c2b3a4f5e.slice")
    assert km.memcg_stat["anon"] == 2143289344
    assert km.memcg_stat["pagetables"] == 5767168
    assert km.memcg_stat["swap"] == 0  # from the "swap: usage" line


def test_the_pre_4_19_one_line_stat_dump_is_kept() -> None:
    [km] = assemble(load_records("memcg_v1_4_9_legacy.txt"))
    assert km.memcg_stat_path.startswith("/docker/8c5d2e7f")
    assert km.memcg_stat["anon"] == 521376 * 1024
    assert km.memcg_stat["file"] == 36 * 1024


def test_a_dump_is_not_given_to_the_next_reports_kill() -> None:
    # the next report was rate limited down to its Killed line: it has no dump of its own
    lines = [*V1_TMPFS_REPORT, V1_TMPFS_REPORT[-1].replace("23099", "23100")]
    first, second = assemble([rec(m, seq) for seq, m in enumerate(lines)])
    assert first.memcg_stat and not second.memcg_stat


def test_the_global_report_has_no_dump() -> None:
    [km] = assemble(load_records("global_6x.txt"))
    assert km.memcg_stat == {} and km.memcg_stat_path == ""


# -- the verdict -----------------------------------------------------------------------------


def tmpfs_kill(km: KmsgOom) -> tuple[object, ...]:
    return (
        cgroup(20, "/compose_probe20624", 32 * MiB),
        oom(1.0, 100, limit_cgroup=20, limit=32 * MiB, usage=32 * MiB),
        km,
        killed(1.1, 100, signal.SIGKILL, cg=20),
    )


def test_tmpfs_that_filled_the_cgroup_is_named_in_summary_and_advice() -> None:
    km = msgspec.structs.replace(report_oom(V1_TMPFS_REPORT), ts=1_000_000_000, victim_pid=100)
    v = one(*tmpfs_kill(km))  # type: ignore[arg-type]
    assert v.cause == "cgroup_oom"
    assert "24.0 MiB of the 32.0 MiB were tmpfs/shared memory" in v.summary
    assert "stay charged to the cgroup after the process dies" in v.advice
    assert "--shm-size" in v.advice
    parts = dict(v.breakdown)
    assert parts["shmem"] == 25206784 and parts["anon"] == 8077312
    assert parts["file_mapped"] == 0 and parts["file_unmapped"] == 0
    # the victim's own RSS stays, under its own names
    assert parts["anon_rss"] == 7768 * 1024 and parts["file_rss"] == 6620 * 1024
    [said] = [w for _, w in v.evidence if w.startswith("kernel OOM report")]
    assert "tmpfs/shared memory 24.0 MiB" in said


def test_the_kernels_dump_wins_over_samples() -> None:
    km = with_stat(kmsg(1.0, 100, oom_memcg="/app"), {"anon": 60 * MiB, "file": 2 * MiB})
    v = one(
        cgroup(20, "/app", 64 * MiB),
        sample(0.9, 20, "/app", usage=63 * MiB, stat={"anon": MiB, "file": 60 * MiB}),
        sample(1.05, 20, "/app", usage=63 * MiB, stat={"anon": MiB, "file": 60 * MiB}),
        oom(1.0, 100, limit_cgroup=20, limit=64 * MiB),
        km,
        killed(1.1, 100, signal.SIGKILL, cg=20),
    )
    assert dict(v.breakdown)["anon"] == 60 * MiB
    assert "60.0 MiB of the 64.0 MiB was anon memory" in v.summary


def test_without_a_dump_the_read_after_the_kill_is_used_not_the_last_periodic_one() -> None:
    v = one(
        cgroup(20, "/app", 128 * MiB),
        cgroup(30, "/app/worker"),
        # the last periodic read, before the tmpfs filled
        sample(0.5, 20, "/app", usage=20 * MiB, stat={"anon": 20 * MiB, "file": 0, "shmem": 0}),
        oom(1.0, 100, limit_cgroup=20, limit=128 * MiB, victim_cg=30),
        # the read the kill triggered: the victim's anon is already freed, the tmpfs is not
        sample(
            1.02,
            20,
            "/app",
            usage=126 * MiB,
            stat={"anon": 2 * MiB, "file": 124 * MiB, "shmem": 124 * MiB},
        ),
        killed(1.1, 100, signal.SIGKILL, cg=30),
    )
    assert "124.0 MiB of the 128.0 MiB were tmpfs/shared memory" in v.summary
    [said] = [w for _, w in v.evidence if w.startswith("memory.stat of /app")]
    assert "read 20 ms after the kill" in said


def test_a_mapped_model_file_is_reclaimable_and_the_anon_spike_did_not_fit() -> None:
    km = with_stat(
        kmsg(1.0, 100, oom_memcg="/llm"),
        {"anon": 300 * MiB, "file": 480 * MiB, "file_mapped": 480 * MiB, "shmem": 0},
    )
    v = one(
        cgroup(20, "/llm", 800 * MiB),
        oom(1.0, 100, limit_cgroup=20, limit=800 * MiB, usage=800 * MiB),
        km,
        killed(1.1, 100, signal.SIGKILL, cg=20),
    )
    assert "480.0 MiB of the 800.0 MiB was page cache (mapped files 480.0 MiB), reclaimable" in (
        v.summary
    )
    assert "the anon 300.0 MiB" in v.advice and "did not fit" in v.advice
    assert "480.0 MiB reclaimable page cache, 300.0 MiB not reclaimable" in memory_at_kill(
        v.breakdown, fmt_bytes
    )


def test_kernel_memory_is_named_with_its_parts() -> None:
    km = with_stat(
        kmsg(1.0, 100, oom_memcg="/proxy"),
        {"anon": 10 * MiB, "file": 2 * MiB, "shmem": 0, "kernel": 8 * MiB, "slab": 6 * MiB,
         "sock": 30 * MiB},
    )  # fmt: skip
    v = one(
        cgroup(20, "/proxy", 64 * MiB),
        oom(1.0, 100, limit_cgroup=20, limit=64 * MiB),
        km,
        killed(1.1, 100, signal.SIGKILL, cg=20),
    )
    assert "kernel memory was 59% of the 64.0 MiB (slab 6.0 MiB, sockets 30.0 MiB)" in v.summary
    assert "socket" in v.advice


def test_the_victims_rss_alone_is_labelled_as_the_victims() -> None:
    v = one(
        cgroup(20, "/demo", 64 * MiB),
        oom(1.0, 100, limit_cgroup=20),
        kmsg(1.0, 100),
        killed(1.1, 100, signal.SIGKILL, cg=20),
    )
    assert memory_at_kill(v.breakdown, fmt_bytes).startswith(
        "the victim's RSS at the kill (kernel log): anon-rss"
    )
    assert "of the 64.0 MiB" not in v.summary  # no composition read: none claimed
