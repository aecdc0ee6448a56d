"""Tests for tracer.parse.memory and tracer.sources.samplers.

Tier 1 runs everywhere: the parsers on text from real hosts (and hypothesis: they never raise),
and the samplers on fixture trees in the shape of real hosts, copied into tmp_path so that a
test can rewrite a file or remove a cgroup between samples:

* ``cgroupfs/v2_debian12_6_1``: systemd's unified layout with a docker container
  (``/system.slice/docker-<id>.scope``, 512 MiB limit), kernel 6.1 files;
* ``cgroupfs/v2_debian11_5_10``: a kubelet pod on Linux 5.10: no memory.peak (5.19), no
  ``oom_group_kill`` (5.17), no ``kernel`` stat key (5.18); the pod and its container share a
  256 MiB limit and the container sits at 97% of it;
* ``cgroupfs/v1_6_18``: this development machine's v1 memory hierarchy, copied verbatim;
* ``cgroupfs/hybrid_ubuntu2004_5_4``: Ubuntu 20.04's hybrid layout: memory on v1
  (``memory/``), PSI in the controller-less unified hierarchy (``unified/``);
* ``proc/host_6_18``: this machine's meminfo and PSI, a python3 process's status (4242), a
  zombie (4243), kthreadd (2); ``proc/host_3_13``: a kernel without MemAvailable or PSI.

Fixture files are regular files, which stay readable through open descriptors after an
unlink; the samplers' removal checks cover that case too (the root tier covers kernfs).

The root tier (``@pytest.mark.root``) samples a real child memory cgroup with a 64 MiB limit
holding a process that allocates 32 MiB, then removes both.
"""

from __future__ import annotations

import math
import os
import posixpath
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TypeVar

import msgspec
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracer.errors import UsageError
from tracer.events import (
    CgroupSample,
    EffectiveLimit,
    Event,
    HostSample,
    ProcessSample,
    SampleError,
    from_record,
)
from tracer.parse.cgroup import parse_flat_keyed
from tracer.parse.memory import (
    STAT_KEYS,
    Pressure,
    normalize_stat,
    parse_meminfo,
    parse_oom_control,
    parse_pressure,
    parse_proc_status,
    parse_stat,
    parse_uint,
    proc_status_state,
)
from tracer.sources.cgroupfs import (
    CgroupLayout,
    CgroupResolver,
    ChildCgroup,
)
from tracer.sources.samplers import (
    CgroupSampler,
    HostSampler,
    ProblemLog,
    ProcessSampler,
    SamplerSet,
)

DATA = Path(__file__).parent / "data"
KiB = 1024
MiB = 1 << 20
MS = 1_000_000  # ns

D12_SCOPE = (
    "/system.slice/docker-9b1e3f5a7c2d4e6f8a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f.scope"
)
D11_POD = (
    "/kubepods.slice/kubepods-burstable.slice"
    "/kubepods-burstable-pod3f6c1b1e_8a2d_4f0e_9c55_6a8f1d2e7b10.slice"
)
D11_CTR = (
    D11_POD
    + "/cri-containerd-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.scope"
)
V1_CHILD = "/process_api/7d5551b5f84c69edbe9e10f968ac98da"
HY_SCOPE = (
    "/system.slice/docker-4c0d3b8a1f2e9d7c6b5a49382716f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4.scope"
)


def text(rel: str) -> str:
    return (DATA / rel).read_text()


def copy_tree(tmp_path: Path, rel: str) -> Path:
    dest = tmp_path / posixpath.basename(rel)
    shutil.copytree(DATA / rel, dest)
    return dest


def v2_tree(tmp_path: Path, name: str) -> tuple[Path, CgroupLayout]:
    root = copy_tree(tmp_path, f"cgroupfs/{name}")
    return root, CgroupLayout("v2", str(root), 2, str(root))


def v1_tree(tmp_path: Path) -> tuple[Path, CgroupLayout]:
    root = copy_tree(tmp_path, "cgroupfs/v1_6_18")
    return root, CgroupLayout("v1", str(root), 1, None)


def hybrid_tree(tmp_path: Path) -> tuple[Path, CgroupLayout]:
    root = copy_tree(tmp_path, "cgroupfs/hybrid_ubuntu2004_5_4")
    layout = CgroupLayout("hybrid", str(root / "memory"), 1, str(root / "unified"))
    return root / "memory", layout


def ino(root: Path, rel: str) -> int:
    return (root / rel.lstrip("/")).stat().st_ino


def write(root: Path, rel: str, name: str, content: str) -> None:
    """Rewrite a fixture file in place (same inode, as cgroupfs values change)."""
    (root / rel.lstrip("/") / name).write_text(content)


def errors(events: list[Event]) -> list[tuple[str, str, str]]:
    return [(e.source, e.target, e.message) for e in events if isinstance(e, SampleError)]


E = TypeVar("E", bound=Event)


def of_type(events: list[Event], cls: type[E]) -> list[E]:
    return [e for e in events if isinstance(e, cls)]


def by_path(events: list[Event]) -> dict[str, CgroupSample]:
    return {e.path: e for e in of_type(events, CgroupSample)}


def round_trips(events: list[Event]) -> bool:
    return all(from_record(orjson.loads(orjson.dumps(e.to_record()))) == e for e in events)


# ---------------------------------------------------------------------------------------------
# Parsers: meminfo


def test_parse_meminfo_this_host() -> None:
    info = parse_meminfo(text("proc/host_6_18/meminfo"))
    assert info["MemTotal"] == 24684092 * KiB
    assert info["MemFree"] == 22982372 * KiB
    assert info["MemAvailable"] == 24144008 * KiB
    assert info["Cached"] == 1302924 * KiB
    assert info["SwapFree"] == 0
    assert info["Active(anon)"] > 0  # the kernel's spelling is kept
    assert info["HugePages_Total"] == 0  # unit-less: a count, kept as is
    assert info["VmallocTotal"] == 34359738367 * KiB
    assert len(info) == 54  # every line of the file


def test_parse_meminfo_3_13_has_no_memavailable() -> None:
    info = parse_meminfo(text("proc/host_3_13/meminfo"))
    assert "MemAvailable" not in info  # Linux 3.14+
    assert (info["MemTotal"], info["MemFree"], info["Cached"], info["SwapFree"]) == (
        2048092 * KiB,
        151236 * KiB,
        1164988 * KiB,
        2061440 * KiB,
    )


def test_parse_meminfo_skips_garbage() -> None:
    assert parse_meminfo(
        "MemTotal: 10 kB\nMemFree 5 kB\n:3 kB\nCached: x kB\nBuffers: 1 MB\n"
        "SwapFree: -1 kB\n Lead: 1 kB\nHuge: 3\nDigits: \u0661\u0662 kB\nLong: "
        + "9" * 30
        + " kB\n"
    ) == {"MemTotal": 10 * KiB, "Huge": 3}


# ---------------------------------------------------------------------------------------------
# Parsers: PSI


def test_parse_pressure_this_host() -> None:
    assert parse_pressure(text("proc/host_6_18/pressure/memory")) == Pressure(
        0.0, 0.0, 38121, 0.0, 0.0, 21260
    )


def test_parse_pressure_values() -> None:
    p = parse_pressure(
        "some avg10=1.27 avg60=0.43 avg300=0.10 total=2874521\n"
        "full avg10=0.91 avg60=0.30 avg300=0.07 total=2011342\n"
    )
    assert p == Pressure(1.27, 0.43, 2874521, 0.91, 0.30, 2011342)


def test_parse_pressure_without_full_line() -> None:
    # System-wide CPU PSI before Linux 5.13 printed only "some".
    p = parse_pressure("some avg10=0.86 avg60=2.14 avg300=12.09 total=107822200\n")
    assert p == Pressure(0.86, 2.14, 107822200)
    assert (p.full_avg10, p.full_avg60, p.full_total_us) == (None, None, None)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", None),
        ("full avg10=1.00 avg60=1.00 avg300=1.00 total=1\n", None),  # no "some"
        ("some avg10=x avg60=0.00 avg300=0.00 total=1\n", None),
        ("some avg10=nan avg60=0.00 avg300=0.00 total=1\n", None),
        ("some avg10=inf avg60=0.00 avg300=0.00 total=1\n", None),
        ("some avg10=-1.0 avg60=0.00 avg300=0.00 total=1\n", None),
        ("some avg10=0.00 avg60=0.00 avg300=0.00 total=-5\n", None),
        ("some avg10=0.00 avg60=0.00\n", None),  # no total
        ("some avg10=0.5 avg60=0.25 total=7\nfull garbage\n", Pressure(0.5, 0.25, 7)),
        ("junk\nsome avg60=2 avg10=1 avg300=0 total=9 extra=1\n", Pressure(1.0, 2.0, 9)),
    ],
)
def test_parse_pressure_defensive(content: str, expected: Pressure | None) -> None:
    assert parse_pressure(content) == expected


# ---------------------------------------------------------------------------------------------
# Parsers: /proc/PID/status, oom_control, memory.stat


def test_parse_proc_status_python() -> None:
    status = text("proc/host_6_18/4242/status")
    fields = parse_proc_status(status)
    assert (fields["RssAnon"], fields["RssFile"], fields["RssShmem"], fields["VmSwap"]) == (
        56024 * KiB,
        6664 * KiB,
        0,
        0,
    )
    assert fields["VmRSS"] == 62688 * KiB == fields["RssAnon"] + fields["RssFile"]
    assert "Threads" not in fields and "Tgid" not in fields  # not kB fields
    assert proc_status_state(status) == "R"


def test_parse_proc_status_kernel_thread_and_zombie() -> None:
    kthread = text("proc/host_6_18/2/status")
    zombie = text("proc/host_6_18/4243/status")
    assert parse_proc_status(kthread) == {}
    assert parse_proc_status(zombie) == {}
    assert proc_status_state(kthread) == "S"
    assert proc_status_state(zombie) == "Z"
    assert proc_status_state("Name: x\n") is None
    assert proc_status_state("State:\tsleeping\n") is None


def test_parse_oom_control() -> None:
    assert parse_oom_control("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == {
        "oom_kill_disable": 0,
        "under_oom": 0,
        "oom_kill": 3,
    }
    # Before Linux 4.13 there is no oom_kill line.
    assert parse_oom_control("oom_kill_disable 1\nunder_oom 1\n") == {
        "oom_kill_disable": 1,
        "under_oom": 1,
    }
    assert parse_oom_control("oom_kill x\nunder_oom -1\n\n1 2 3\n") == {}


def test_parse_uint() -> None:
    assert parse_uint(" 42\n") == 42
    assert parse_uint("18446744073709551615") == 2**64 - 1
    for bad in ("", "max", "-1", "1.5", "1_0", "\u0661", "9" * 21, "1 2"):
        assert parse_uint(bad) is None, bad


def test_normalize_stat_v2_debian12() -> None:
    raw = parse_flat_keyed(text(f"cgroupfs/v2_debian12_6_1{D12_SCOPE}/memory.stat"))
    assert normalize_stat(raw, 2) == {
        "anon": 251658240,
        "file": 52428800,
        "file_mapped": 31457280,
        "shmem": 4194304,
        "kernel": 10485760,
        "kernel_stack": 606208,
        "slab": 7946240,
        "sock": 12288,
        "pagetables": 1830912,
        "anon_thp": 138412032,
        "active_anon": 8388608,
        "inactive_anon": 247463936,
        "active_file": 14680064,
        "inactive_file": 33554432,
        "file_dirty": 135168,
        "file_writeback": 0,
        "swapcached": 0,
        "pgmajfault": 321,
        "workingset_refault_anon": 0,
        "workingset_refault_file": 1283,
    }


def test_normalize_stat_v2_old_kernel_keeps_what_exists() -> None:
    raw = parse_flat_keyed(text(f"cgroupfs/v2_debian11_5_10{D11_CTR}/memory.stat"))
    out = normalize_stat(raw, 2)
    assert set(STAT_KEYS) - set(out) == {"kernel", "pagetables", "swapcached"}
    assert (out["anon"], out["file"], out["slab"]) == (243269632, 8388608, 1572864)


def test_normalize_stat_v1_uses_hierarchical_totals() -> None:
    raw = parse_flat_keyed(text(f"cgroupfs/v1_6_18{V1_CHILD}/memory.stat"))
    assert normalize_stat(raw, 1) == {
        "anon": 10223616,  # total_rss
        "file": 2424832,  # total_cache
        "file_mapped": 0,
        "anon_thp": 0,
        "file_dirty": 462848,
        "file_writeback": 0,
        "active_anon": 12288,
        "active_file": 520192,
        "inactive_anon": 10211328,
        "inactive_file": 1896448,
        "pgmajfault": 1,
        "shmem": 0,
        "swap": 0,
        "swapcached": 0,
        "workingset_refault_anon": 0,
        "workingset_refault_file": 0,
    }
    root = normalize_stat(parse_flat_keyed(text("cgroupfs/v1_6_18/memory.stat")), 1)
    # The root's own pages (rss 4780032) are a sliver; the subtree's are what usage counts.
    assert (root["anon"], root["file"], root["shmem"], root["file_mapped"]) == (
        134549504,
        1358274560,
        9084928,
        29929472,
    )


@pytest.mark.parametrize(
    "rel",
    sorted(
        str(p.relative_to(DATA)) for p in (DATA / "cgroupfs").rglob("memory.stat") if p.is_file()
    ),
)
def test_parse_stat_agrees_with_normalize_stat(rel: str) -> None:
    content = text(rel)
    version = 1 if "v1_" in rel or "hybrid" in rel else 2
    assert parse_stat(content, version) == normalize_stat(parse_flat_keyed(content), version)
    assert parse_stat(content, version)  # not trivially empty
    assert parse_stat(content, 3) == {}


def test_selected_keys_agree_with_the_whole_parse() -> None:
    meminfo = text("proc/host_6_18/meminfo")
    keys = ("MemTotal", "MemFree", "MemAvailable", "Cached", "SwapFree", "HugePages_Total", "No")
    whole = parse_meminfo(meminfo)
    assert parse_meminfo(meminfo, keys) == {k: whole[k] for k in keys if k in whole}
    status = text("proc/host_6_18/4242/status")
    keys = ("RssAnon", "RssFile", "RssShmem", "VmSwap", "Threads")
    whole = parse_proc_status(status)
    assert parse_proc_status(status, keys) == {k: whole[k] for k in keys if k in whole}
    assert parse_meminfo("MemTotal: 1 kB", ["MemTotal"]) == {"MemTotal": 1024}  # no newline


def test_normalize_stat_v1_without_totals_and_other_versions() -> None:
    raw = {"rss": 1, "cache": 2, "mapped_file": 3, "shmem": 4, "swap": 5, "pgpgin": 6}
    assert normalize_stat(raw, 1) == {
        "anon": 1,
        "file": 2,
        "file_mapped": 3,
        "shmem": 4,
        "swap": 5,
    }
    assert normalize_stat(raw, 3) == {}
    assert normalize_stat({"anon": 1, "rss": 2}, 2) == {"anon": 1}


# Property: nothing raises on arbitrary text.

_kb_like = st.lists(
    st.tuples(
        st.text(max_size=12),
        st.sampled_from([":", " ", "=", ""]),
        st.text(alphabet="0123456789 -.kBx\t\u0661", max_size=25),
    ).map(lambda t: "".join(t)),
    max_size=12,
).map("\n".join)
_psi_like = st.lists(
    st.tuples(
        st.sampled_from(["some", "full", "", "x"]),
        st.lists(
            st.tuples(
                st.sampled_from(["avg10", "avg60", "avg300", "total", ""]),
                st.sampled_from(["=", ""]),
                st.text(alphabet="0123456789.-naif_e+", max_size=12),
            ).map(lambda t: "".join(t)),
            max_size=5,
        ).map(" ".join),
    ).map(" ".join),
    max_size=4,
).map("\n".join)


@given(st.one_of(st.text(max_size=400), _kb_like, _psi_like))
def test_parsers_never_raise(data: str) -> None:
    assert isinstance(parse_meminfo(data), dict)
    assert isinstance(parse_proc_status(data), dict)
    assert isinstance(parse_oom_control(data), dict)
    proc_status_state(data)
    parse_uint(data)
    p = parse_pressure(data)
    if p is not None:
        assert math.isfinite(p.some_avg10) and p.some_total_us >= 0
    assert isinstance(parse_meminfo(data, ["MemTotal", "", ":"]), dict)
    assert isinstance(parse_proc_status(data, ["RssAnon", "\n"]), dict)
    for version in (1, 2, 0):
        out = normalize_stat(parse_flat_keyed(data), version)
        assert all(isinstance(v, int) for v in out.values())
        assert all(isinstance(v, int) for v in parse_stat(data, version).values())


_stat_files = st.dictionaries(
    st.sampled_from(
        [
            *STAT_KEYS,
            *("rss", "cache", "mapped_file", "swap", "dirty", "pgpgin", "file_thp", "rss_huge"),
            *("total_rss", "total_cache", "total_shmem", "total_swap"),
        ]
    ),
    st.integers(0, 2**64 - 1),
)


@given(_stat_files, st.sampled_from([1, 2]))
def test_parse_stat_matches_the_slow_path(values: dict[str, int], version: int) -> None:
    content = "".join(f"{k} {v}\n" for k, v in values.items())
    assert parse_stat(content, version) == normalize_stat(values, version)


@given(st.dictionaries(st.text(max_size=20), st.integers(), max_size=20), st.integers(-1, 3))
def test_normalize_stat_never_raises(raw: dict[str, int], version: int) -> None:
    out = normalize_stat(raw, version)
    assert set(out) <= {*STAT_KEYS, "swap"}


# ---------------------------------------------------------------------------------------------
# CgroupSampler on fixture trees


def test_cgroup_sampler_v2_container(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    s = CgroupSampler(layout, D12_SCOPE)
    events = s.sample(5 * MS, ino(root, D12_SCOPE))
    assert events == [
        CgroupSample(
            ts=5 * MS,
            cgroup_id=ino(root, D12_SCOPE),
            path=D12_SCOPE,
            usage_bytes=314572800,
            limit_bytes=512 * MiB,
            high_bytes=None,  # "max"
            peak_bytes=498073600,
            failcnt=None,
            events={"low": 0, "high": 0, "max": 17, "oom": 0, "oom_kill": 0, "oom_group_kill": 0},
            stat=normalize_stat(
                parse_flat_keyed((root / D12_SCOPE.lstrip("/") / "memory.stat").read_text()), 2
            ),
            psi_some_avg10=1.27,
            psi_full_avg10=0.91,
            psi_some_total_us=2874521,
            psi_full_total_us=2011342,
        )
    ]
    assert s.last == events[0]
    assert round_trips(events)
    s.close()


def test_cgroup_sampler_v2_root_lacks_files_silently(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    s = CgroupSampler(layout, "/")
    [sample] = s.sample(1, ino(root, "/"))
    assert isinstance(sample, CgroupSample)
    assert (sample.usage_bytes, sample.limit_bytes, sample.peak_bytes, sample.events) == (
        None,
        None,
        None,
        {},
    )
    assert sample.stat["anon"] == 2 * 805306368
    assert (sample.psi_some_avg10, sample.psi_full_total_us) == (0.52, 25100877)
    assert s.sample(2, ino(root, "/")) == [msgspec.structs.replace(sample, ts=2)]


def test_cgroup_sampler_v1_this_host(tmp_path: Path) -> None:
    root, layout = v1_tree(tmp_path)
    s = CgroupSampler(layout, str(root) + V1_CHILD)  # the mount point prefix is accepted
    assert s.path == V1_CHILD
    [sample] = s.sample(7, ino(root, V1_CHILD))
    assert isinstance(sample, CgroupSample)
    assert (
        sample.usage_bytes,
        sample.limit_bytes,
        sample.high_bytes,
        sample.peak_bytes,
        sample.failcnt,
        sample.events,
    ) == (13631488, None, None, 185868288, 0, {"under_oom": 0, "oom_kill": 0})
    assert (sample.stat["anon"], sample.stat["file"]) == (10223616, 2424832)
    assert sample.psi_some_avg10 is None  # pure v1: no unified hierarchy
    [top] = CgroupSampler(layout, "/").sample(8, ino(root, "/"))
    assert isinstance(top, CgroupSample)
    assert (top.usage_bytes, top.limit_bytes, top.peak_bytes) == (1492713472, None, 2687983616)


def test_cgroup_sampler_hybrid_reads_psi_from_the_unified_hierarchy(tmp_path: Path) -> None:
    root, layout = hybrid_tree(tmp_path)
    [sample] = CgroupSampler(layout, HY_SCOPE).sample(1, ino(root, HY_SCOPE))
    assert isinstance(sample, CgroupSample)
    assert (sample.usage_bytes, sample.limit_bytes, sample.peak_bytes, sample.failcnt) == (
        734003200,
        1 << 30,
        1 << 30,
        1532,
    )
    assert sample.events == {"under_oom": 0, "oom_kill": 2}
    assert (sample.stat["anon"], sample.stat["file"], sample.stat["anon_thp"]) == (
        562036736,
        167772160,
        264241152,
    )
    assert "workingset_refault_anon" not in sample.stat  # not in 5.4's v1 memory.stat
    assert (
        sample.psi_some_avg10,
        sample.psi_full_avg10,
        sample.psi_some_total_us,
        sample.psi_full_total_us,
    ) == (4.71, 3.92, 15011876, 7780116)
    # A v1 cgroup with no twin in the unified hierarchy: no PSI, and nothing failed.
    (root / "lonely").mkdir()
    for name in ("memory.usage_in_bytes", "memory.limit_in_bytes", "cgroup.procs"):
        (root / "lonely" / name).write_text("0\n")
    s = CgroupSampler(layout, "/lonely")
    for ts in (1, 2):
        events = s.sample(ts, ino(root, "/lonely"))
        assert errors(events) == (
            [
                ("cgroup", "/lonely", "memory.max_usage_in_bytes missing"),
                ("cgroup", "/lonely", "memory.failcnt missing"),
                ("cgroup", "/lonely", "memory.oom_control missing"),
                ("cgroup", "/lonely", "memory.stat missing"),
            ]
            if ts == 1
            else []
        )
        sample = events[-1]
        assert isinstance(sample, CgroupSample)
        assert (sample.usage_bytes, sample.limit_bytes, sample.psi_some_avg10) == (0, 0, None)


def test_cgroup_sampler_old_kernel_reports_missing_file_once(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian11_5_10")
    problems = ProblemLog()
    ctr = CgroupSampler(layout, D11_CTR, problems=problems)
    pod = CgroupSampler(layout, D11_POD, problems=problems)
    first = ctr.sample(1, ino(root, D11_CTR))
    assert errors(first) == [("cgroup", "memory.peak", "memory.peak missing: added in Linux 5.19")]
    sample = first[-1]
    assert isinstance(sample, CgroupSample)
    assert sample.peak_bytes is None
    assert sample.events == {"low": 0, "high": 0, "max": 1893, "oom": 1, "oom_kill": 1}
    assert "kernel" not in sample.stat
    # Said once for the whole host, not once per cgroup or per sample.
    assert errors(ctr.sample(2, ino(root, D11_CTR))) == []
    assert errors(pod.sample(2, ino(root, D11_POD))) == []
    assert len(problems) == 1


def test_cgroup_sampler_without_psi(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    (root / D12_SCOPE.lstrip("/") / "memory.pressure").unlink()
    s = CgroupSampler(layout, D12_SCOPE)
    first = s.sample(1, ino(root, D12_SCOPE))
    assert errors(first) == [
        (
            "psi",
            "memory.pressure",
            "memory.pressure missing: PSI needs Linux 4.20+ built with CONFIG_PSI=y, "
            "not booted with psi=0",
        )
    ]
    assert first[-1] == s.last and s.last is not None
    assert (s.last.psi_some_avg10, s.last.psi_full_total_us, s.last.usage_bytes) == (
        None,
        None,
        314572800,
    )
    assert errors(s.sample(2, ino(root, D12_SCOPE))) == []


def test_cgroup_sampler_v2_without_the_memory_controller(tmp_path: Path) -> None:
    # A v2 cgroup whose parent does not delegate memory has only the core files (and PSI).
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    bare = root / "system.slice" / "bare.service"
    bare.mkdir()
    (bare / "cgroup.procs").write_text("")
    (bare / "memory.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    s = CgroupSampler(layout, "/system.slice/bare.service")
    events = s.sample(1, bare.stat().st_ino)
    hint = "missing: is memory enabled in the parent's cgroup.subtree_control?"
    # memory.peak too: here its absence says nothing about the kernel.
    assert errors(events) == [
        ("cgroup", "/system.slice/bare.service", f"{name} {hint}")
        for name in (
            "memory.current",
            "memory.max",
            "memory.high",
            "memory.peak",
            "memory.events",
            "memory.stat",
        )
    ]
    sample = events[-1]
    assert isinstance(sample, CgroupSample)
    assert (sample.usage_bytes, sample.stat, sample.psi_some_total_us) == (None, {}, 0)


def test_cgroup_sampler_read_error_and_bad_content(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    d = root / D12_SCOPE.lstrip("/")
    (d / "memory.stat").unlink()
    (d / "memory.stat").mkdir()  # opens, but read(2) fails with EISDIR
    (d / "memory.current").write_text("lots\n")
    (d / "memory.max").write_text("\n")
    s = CgroupSampler(layout, D12_SCOPE)
    for ts in (1, 2):
        events = s.sample(ts, ino(root, D12_SCOPE))
        assert errors(events) == (
            [
                ("cgroup", D12_SCOPE, "memory.stat: Is a directory"),
                ("cgroup", D12_SCOPE, "memory.current: unexpected content 'lots\\n'"),
                ("cgroup", D12_SCOPE, "memory.max: unexpected content '\\n'"),
            ]
            if ts == 1
            else []
        )
        sample = events[-1]
        assert isinstance(sample, CgroupSample)
        assert (sample.usage_bytes, sample.limit_bytes, sample.stat) == (None, None, {})
        assert sample.peak_bytes == 498073600  # the rest was read


def test_cgroup_sampler_removed_mid_run(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    cid = ino(root, D12_SCOPE)
    s = CgroupSampler(layout, D12_SCOPE)
    assert isinstance(s.sample(1, cid)[-1], CgroupSample)
    shutil.rmtree(root / D12_SCOPE.lstrip("/"))
    assert errors(s.sample(2, cid)) == [("cgroup", D12_SCOPE, "cgroup removed")]
    assert s.gone
    assert s.sample(3, cid) == []
    # A namesake created later is another cgroup: never sampled under the old id.
    (root / D12_SCOPE.lstrip("/")).mkdir()
    assert s.sample(4, cid) == []


def test_cgroup_sampler_namesake_at_first_sample(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    s = CgroupSampler(layout, D12_SCOPE)
    events = s.sample(1, ino(root, D12_SCOPE) + 1)  # the id we were told is not this directory
    assert errors(events) == [("cgroup", D12_SCOPE, "cgroup removed")]
    assert CgroupSampler(layout, "/nope").sample(1, 0) == [
        SampleError(ts=1, source="cgroup", target="/nope", message="cgroup removed")
    ]


def test_cgroup_sampler_needs_a_memory_hierarchy() -> None:
    with pytest.raises(UsageError, match="no cgroup hierarchy with the memory controller"):
        CgroupSampler(CgroupLayout("v2", None, None, "/sys/fs/cgroup"), "/")


# ---------------------------------------------------------------------------------------------
# HostSampler and ProcessSampler on fixture /proc trees


def test_host_sampler_this_host(tmp_path: Path) -> None:
    proc = copy_tree(tmp_path, "proc/host_6_18")
    s = HostSampler(str(proc))
    for ts in (1, 2):
        assert s.sample(ts) == [
            HostSample(
                ts=ts,
                mem_total=24684092 * KiB,
                mem_available=24144008 * KiB,
                mem_free=22982372 * KiB,
                cached=1302924 * KiB,
                swap_free=0,
                psi_some_avg10=0.0,
                psi_full_avg10=0.0,
                psi_some_total_us=38121,
                psi_full_total_us=21260,
            )
        ]
    # Values are re-read through the open descriptors.
    (proc / "pressure" / "memory").write_text(
        "some avg10=12.50 avg60=3.00 avg300=1.00 total=99\nfull avg10=7.25 avg60=2.00 "
        "avg300=0.50 total=42\n"
    )
    [sample] = s.sample(3)
    assert isinstance(sample, HostSample)
    assert (sample.psi_some_avg10, sample.psi_full_avg10, sample.psi_full_total_us) == (
        12.5,
        7.25,
        42,
    )
    s.close()


def test_host_sampler_without_psi(tmp_path: Path) -> None:
    proc = copy_tree(tmp_path, "proc/host_3_13")
    s = HostSampler(str(proc))
    first = s.sample(1)
    assert errors(first) == [
        (
            "psi",
            str(proc / "pressure" / "memory"),
            "missing: PSI needs Linux 4.20+ built with CONFIG_PSI=y, not booted with psi=0",
        )
    ]
    sample = first[-1]
    assert sample == HostSample(
        ts=1,
        mem_total=2048092 * KiB,
        mem_available=None,
        mem_free=151236 * KiB,
        cached=1164988 * KiB,
        swap_free=2061440 * KiB,
        psi_some_avg10=None,
        psi_full_avg10=None,
        psi_some_total_us=None,
        psi_full_total_us=None,
    )
    assert errors(s.sample(2)) == []
    assert round_trips(first)


def test_host_sampler_broken_meminfo(tmp_path: Path) -> None:
    proc = copy_tree(tmp_path, "proc/host_6_18")
    (proc / "meminfo").write_text("MemFree: 1 kB\n")
    s = HostSampler(str(proc))
    assert errors(s.sample(1)) == [("host", str(proc / "meminfo"), "no MemTotal or MemFree line")]
    assert s.sample(2) == []  # said once; no sample without the totals
    (proc / "meminfo").unlink()
    nothing = HostSampler(str(proc))
    assert errors(nothing.sample(1)) == [
        ("host", str(proc / "meminfo"), "cannot read: No such file or directory")
    ]


def test_process_sampler_fixture(tmp_path: Path) -> None:
    proc = copy_tree(tmp_path, "proc/host_6_18")
    s = ProcessSampler(4242, str(proc))
    assert s.sample(9) == [
        ProcessSample(
            ts=9, pid=4242, rss_anon=56024 * KiB, rss_file=6664 * KiB, rss_shmem=0, vm_swap=0
        )
    ]
    kthread = ProcessSampler(2, str(proc)).sample(9)
    assert kthread == [
        ProcessSample(ts=9, pid=2, rss_anon=None, rss_file=None, rss_shmem=None, vm_swap=None)
    ]
    # The process exits: /proc shows a zombie until its parent reaps it.
    shutil.copy(proc / "4243" / "status", proc / "4242" / "status")
    assert errors(s.sample(10)) == [("process", "4242", "process exited")]
    assert s.gone and s.sample(11) == []


def test_process_sampler_pid_that_never_existed(tmp_path: Path) -> None:
    proc = copy_tree(tmp_path, "proc/host_6_18")
    s = ProcessSampler(999999, str(proc))
    assert errors(s.sample(1)) == [("process", "999999", "process exited")]
    assert s.sample(2) == []


def test_process_sampler_real_exit(sleeper: subprocess.Popen[bytes]) -> None:
    # Real /proc, no root needed: a reaped process's status fails with ESRCH.
    s = ProcessSampler(sleeper.pid)
    [sample] = s.sample(1)
    assert isinstance(sample, ProcessSample)
    assert sample.pid == sleeper.pid
    # (Values vary: the child may still be between fork and exec.)
    assert None not in (sample.rss_anon, sample.rss_file, sample.rss_shmem, sample.vm_swap)
    sleeper.kill()
    sleeper.wait(timeout=10)
    assert errors(s.sample(2)) == [("process", str(sleeper.pid), "process exited")]
    assert s.sample(3) == []


# ---------------------------------------------------------------------------------------------
# SamplerSet


def make_set(layout: CgroupLayout, proc: str | None = None, **kwargs: int) -> SamplerSet:
    """A set on a fixture tree; the host is sampled only when given a fixture /proc."""
    return SamplerSet(
        layout, CgroupResolver(layout), proc or "/nonexistent", host=proc is not None, **kwargs
    )


def test_set_watches_ancestors_once(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    sibling = "/system.slice/cron.service"
    (root / sibling.lstrip("/")).mkdir()
    with make_set(layout) as ss:
        assert ss.watch_cgroup(D12_SCOPE)
        assert ss.watch_cgroup(str(root) + sibling)  # mount point prefix accepted
        assert ss.watch_cgroup(D12_SCOPE)  # again: nothing new
        assert ss.watched_cgroups == [D12_SCOPE, sibling]
        assert ss.sampled_cgroups == ["/", "/system.slice", sibling, D12_SCOPE]
        ss.unwatch_cgroup(sibling)
        assert ss.sampled_cgroups == ["/", "/system.slice", D12_SCOPE]
        with pytest.raises(UsageError, match="not found"):
            ss.watch_cgroup("/system.slice/nope/deeper")
        assert ss.sampled_cgroups == ["/", "/system.slice", D12_SCOPE]  # unchanged


def test_set_first_due_order_and_effective_limit(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    proc = copy_tree(tmp_path, "proc/host_6_18")
    resolver = CgroupResolver(layout)
    ss = SamplerSet(layout, resolver, str(proc))
    ss.watch_cgroup(D12_SCOPE)
    ss.watch_pid(4242)
    events = ss.due(1000 * MS)
    assert [type(e).__name__ for e in events] == [
        "HostSample",
        "CgroupSample",
        "CgroupSample",
        "CgroupSample",
        "EffectiveLimit",
        "ProcessSample",
    ]
    assert [e.path for e in of_type(events, CgroupSample)] == ["/", "/system.slice", D12_SCOPE]
    assert all(e.ts == 1000 * MS for e in events)
    [eff] = of_type(events, EffectiveLimit)
    assert eff == EffectiveLimit(
        ts=1000 * MS,
        cgroup_id=ino(root, D12_SCOPE),
        path=D12_SCOPE,
        limit_bytes=512 * MiB,
        set_by=D12_SCOPE,
    )
    assert (eff.limit_bytes, eff.set_by) == resolver.effective_limit(D12_SCOPE)
    assert round_trips(events)
    # Unchanged: not said again.
    assert of_type(ss.due(1100 * MS), EffectiveLimit) == []
    # The parent slice gets a smaller limit: it is now the effective one.
    write(root, "/system.slice", "memory.max", f"{256 * MiB}\n")
    [eff2] = of_type(ss.due(1200 * MS), EffectiveLimit)
    assert (eff2.limit_bytes, eff2.set_by, eff2.path) == (256 * MiB, "/system.slice", D12_SCOPE)
    assert (eff2.limit_bytes, eff2.set_by) == resolver.effective_limit(D12_SCOPE)
    assert of_type(ss.due(1300 * MS), EffectiveLimit) == []
    # Both limits lifted: no limit anywhere up to the root.
    write(root, "/system.slice", "memory.max", "max\n")
    write(root, D12_SCOPE, "memory.max", "max\n")
    [eff3] = of_type(ss.due(1400 * MS), EffectiveLimit)
    assert (eff3.limit_bytes, eff3.set_by) == (None, None) == resolver.effective_limit(D12_SCOPE)
    assert errors(ss.due(1500 * MS)) == []
    ss.close()


def test_set_effective_limit_tie_names_the_deepest(tmp_path: Path) -> None:
    _, layout = v2_tree(tmp_path, "v2_debian11_5_10")
    resolver = CgroupResolver(layout)
    ss = SamplerSet(layout, resolver, host=False)
    ss.watch_cgroup(D11_CTR)
    ss.watch_cgroup(D11_POD)
    events = ss.due(1)
    assert [(e.path, e.limit_bytes, e.set_by) for e in of_type(events, EffectiveLimit)] == [
        (D11_CTR, 256 * MiB, D11_CTR),
        (D11_POD, 256 * MiB, D11_POD),
    ]
    assert resolver.effective_limit(D11_CTR) == (256 * MiB, D11_CTR)
    assert len(of_type(events, CgroupSample)) == 5  # 4 levels + the root, each once
    assert errors(events) == [("cgroup", "memory.peak", "memory.peak missing: added in Linux 5.19")]


def test_set_fast_interval_near_the_limit(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    ss = make_set(layout, interval_ns=100 * MS, fast_interval_ns=20 * MS)
    ss.watch_cgroup(D12_SCOPE)

    def sampled(t: int) -> bool:
        return bool(of_type(ss.due(t * MS), CgroupSample))

    assert sampled(0)  # 300 MiB of 512: normal pace
    assert not sampled(20) and not sampled(99)
    write(root, D12_SCOPE, "memory.current", f"{470 * MiB}\n")  # 91.8% of 512 MiB
    assert sampled(100)
    assert ss.fast_cgroups == [D12_SCOPE]
    assert sampled(120) and not sampled(130) and sampled(140)  # every 20 ms now
    write(root, D12_SCOPE, "memory.current", f"{200 * MiB}\n")
    assert sampled(160)  # sees the drop, back to 100 ms
    assert ss.fast_cgroups == []
    assert not sampled(180) and not sampled(259) and sampled(260)
    # From 90% on (rounded up to a byte) counts as near; a byte less does not.
    at_90 = -(-512 * MiB * 9 // 10)
    write(root, D12_SCOPE, "memory.current", f"{at_90}\n")
    assert sampled(360) and sampled(380)
    write(root, D12_SCOPE, "memory.current", f"{at_90 - 1}\n")
    assert sampled(400) and not sampled(420)


def test_set_samples_soon_after_an_oom_kill_in_a_watched_cgroup(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    ss = make_set(layout, interval_ns=1000 * MS, fast_interval_ns=50 * MS)
    ss.watch_cgroup(D12_SCOPE)
    assert of_type(ss.due(0), CgroupSample)  # 300 MiB of 512: once a second
    assert not of_type(ss.due(10 * MS), CgroupSample)
    ss.sample_soon(ino(root, "/system.slice"))  # (an ancestor of the watched scope)
    assert [e.path for e in of_type(ss.due(20 * MS), CgroupSample)] == [
        "/",
        "/system.slice",
        D12_SCOPE,
    ]
    assert not of_type(ss.due(30 * MS), CgroupSample)  # then its pace again
    ss.sample_soon(12345)  # not sampled here: nothing changes
    assert not of_type(ss.due(40 * MS), CgroupSample)


def test_set_quiet_interval_skips_full_samples_of_a_cgroup_that_did_not_move(
    tmp_path: Path,
) -> None:
    """The agent's quiet interval: a cgroup whose usage stays within 1 MiB, far from its
    limits and not under pressure, is sampled in full once per quiet interval; anything that
    moves, nears a limit, shows pressure or is asked for (sample_soon) is sampled at once."""
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    calm = "".join(f"{k} avg10=0.00 avg60=0.00 avg300=0.00 total=0\n" for k in ("some", "full"))
    for rel in ("/system.slice", D12_SCOPE):
        write(root, rel, "memory.pressure", calm)
    ss = make_set(
        layout, interval_ns=1000 * MS, fast_interval_ns=50 * MS, quiet_interval_ns=10_000 * MS
    )
    ss.watch_cgroup(D12_SCOPE)

    def full(t_ms: int) -> list[str]:
        return [e.path for e in of_type(ss.due(t_ms * MS), CgroupSample)]

    # (the v2 root has no memory.current here: never known to be quiet, sampled every time)
    assert full(0) == ["/", "/system.slice", D12_SCOPE]  # the first: in full
    assert full(1000) == ["/"]  # nothing moved: one read of memory.current each
    write(root, D12_SCOPE, "memory.current", f"{300 * MiB + 512 * KiB}\n")  # under 1 MiB
    assert full(2000) == ["/"]
    write(root, D12_SCOPE, "memory.current", f"{302 * MiB}\n")  # it moved
    assert full(3000) == ["/", D12_SCOPE]
    assert full(4000) == ["/"]
    assert full(10_000) == ["/", "/system.slice"]  # 10 s since its last full sample
    assert full(13_000) == ["/", D12_SCOPE]  # and this one's, taken at 3 s
    ss.sample_soon(ino(root, D12_SCOPE))  # an OOM kill there: in full at once
    assert full(13_100) == ["/", "/system.slice", D12_SCOPE]
    write(root, D12_SCOPE, "memory.pressure", "some avg10=2.50 avg60=0.00 avg300=0.00 total=9\n")
    write(root, D12_SCOPE, "memory.current", f"{304 * MiB}\n")
    assert full(14_100) == ["/", D12_SCOPE]  # moved, and now under pressure ...
    write(root, D12_SCOPE, "memory.current", f"{304 * MiB}\n")
    assert full(15_100) == ["/", D12_SCOPE]  # ... so not quiet while the pressure lasts
    write(root, D12_SCOPE, "memory.pressure", calm)
    write(root, D12_SCOPE, "memory.high", f"{320 * MiB}\n")  # 95% of memory.high
    assert full(16_100) == ["/", D12_SCOPE]
    assert full(17_100) == ["/", D12_SCOPE]  # near memory.high: never quiet
    ss.close()


def test_set_fast_interval_when_an_ancestor_is_near_its_limit(tmp_path: Path) -> None:
    # The pod kubelet sized for one container sits at 97% of its 256 MiB: the watched
    # container is sampled fast from the start, its ancestors with it.
    root, layout = v2_tree(tmp_path, "v2_debian11_5_10")
    write(root, D11_CTR, "memory.max", "max\n")
    write(root, D11_CTR, "memory.current", f"{10 * MiB}\n")
    ss = make_set(layout)
    ss.watch_cgroup(D11_CTR)
    assert len(of_type(ss.due(0), CgroupSample)) == 5
    assert len(of_type(ss.due(20 * MS), CgroupSample)) == 5


def test_set_schedules_host_and_processes(tmp_path: Path) -> None:
    _, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    proc = copy_tree(tmp_path, "proc/host_6_18")
    ss = make_set(layout, str(proc), interval_ns=50 * MS)
    ss.watch_pid(4242)
    ss.watch_pid(2)
    ss.watch_pid(4242)
    assert ss.watched_pids == [2, 4242]
    kinds = [type(e).__name__ for e in ss.due(0)]
    assert kinds == ["HostSample", "ProcessSample", "ProcessSample"]
    assert [e.pid for e in of_type(ss.due(50 * MS), ProcessSample)] == [2, 4242]
    assert ss.due(60 * MS) == []
    # Late calls skip missed ticks rather than bunching up.
    assert len(ss.due(260 * MS)) == 3
    assert ss.due(300 * MS) == []
    assert len(ss.due(310 * MS)) == 3
    ss.unwatch_pid(2)
    ss.unwatch_pid(12345)  # not watched: nothing to do
    assert [e.pid for e in of_type(ss.due(400 * MS), ProcessSample)] == [4242]
    stats = ss.stats
    assert (stats["host"].calls, stats["process"].calls, stats["cgroup"].calls) == (5, 9, 0)
    assert stats["host"].total_ns > 0 and stats["host"].mean_us > 0
    assert stats["cgroup"].mean_us == 0.0


def test_set_removed_cgroup_is_dropped_after_one_error(tmp_path: Path) -> None:
    root, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    sibling = "/system.slice/cron.service"
    shutil.copytree(root / D12_SCOPE.lstrip("/"), root / sibling.lstrip("/"))
    ss = make_set(layout)
    ss.watch_cgroup(D12_SCOPE)
    ss.watch_cgroup(sibling)
    assert len(of_type(ss.due(0), CgroupSample)) == 4
    shutil.rmtree(root / D12_SCOPE.lstrip("/"))
    events = ss.due(100 * MS)
    assert errors(events) == [("cgroup", D12_SCOPE, "cgroup removed")]
    assert [e.path for e in of_type(events, CgroupSample)] == ["/", "/system.slice", sibling]
    assert ss.watched_cgroups == [sibling]
    assert ss.sampled_cgroups == ["/", "/system.slice", sibling]
    later = ss.due(200 * MS)
    assert errors(later) == []
    assert [e.path for e in of_type(later, CgroupSample)] == ["/", "/system.slice", sibling]
    # A new cgroup of the same name (a restarted container) is watched afresh: a new id, and
    # its own removal is reported again.
    shutil.copytree(root / sibling.lstrip("/"), root / D12_SCOPE.lstrip("/"))
    ss.watch_cgroup(D12_SCOPE)
    events = ss.due(300 * MS)
    [eff] = [e for e in of_type(events, EffectiveLimit) if e.path == D12_SCOPE]
    assert eff.cgroup_id == ino(root, D12_SCOPE)
    shutil.rmtree(root / D12_SCOPE.lstrip("/"))
    assert errors(ss.due(400 * MS)) == [("cgroup", D12_SCOPE, "cgroup removed")]
    # Removing the last watched cgroup drops its ancestors too.
    shutil.rmtree(root / sibling.lstrip("/"))
    assert errors(ss.due(500 * MS)) == [("cgroup", sibling, "cgroup removed")]
    assert (ss.watched_cgroups, ss.sampled_cgroups) == ([], [])
    assert ss.due(600 * MS) == []


def test_set_exited_pid_is_dropped_after_one_error(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    nothing = CgroupLayout("none", None, None, None)
    ss = SamplerSet(nothing, CgroupResolver(nothing), host=False)
    ss.watch_pid(sleeper.pid)
    assert len(of_type(ss.due(0), ProcessSample)) == 1
    sleeper.kill()
    sleeper.wait(timeout=10)
    assert errors(ss.due(100 * MS)) == [("process", str(sleeper.pid), "process exited")]
    assert ss.watched_pids == []
    assert ss.due(200 * MS) == []
    stats = ss.stats["process"]
    assert (stats.calls, stats.errors) == (2, 1)
    with pytest.raises(UsageError, match="no cgroup hierarchy"):
        ss.watch_cgroup("/")


def test_set_cap_on_sampled_cgroups(tmp_path: Path) -> None:
    _, layout = v2_tree(tmp_path, "v2_debian11_5_10")
    ss = make_set(layout, max_cgroups=4)
    assert ss.watch_cgroup(D11_POD)  # "/" + 3 levels = 4
    assert not ss.watch_cgroup(D11_CTR)  # one more would pass the cap
    assert not ss.watch_cgroup(D11_CTR)
    assert ss.watch_cgroup("/kubepods.slice")  # already sampled: costs nothing
    events = ss.due(0)
    assert errors(events)[0] == (
        "cgroup",
        D11_CTR,
        "not sampled: more than 4 cgroups to sample (this and later refusals are reported "
        "only once)",
    )
    assert ss.sampled_cgroups == [
        "/",
        "/kubepods.slice",
        "/kubepods.slice/kubepods-burstable.slice",
        D11_POD,
    ]
    assert not ss.watch_cgroup(D11_CTR + "/../../other")
    assert [e for e in errors(ss.due(100 * MS)) if "not sampled" in e[2]] == []


def test_set_rejects_bad_intervals(tmp_path: Path) -> None:
    _, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    with pytest.raises(UsageError, match="must be positive"):
        make_set(layout, interval_ns=0)


def test_set_close_releases_descriptors(tmp_path: Path) -> None:
    _, layout = v2_tree(tmp_path, "v2_debian12_6_1")
    proc = copy_tree(tmp_path, "proc/host_6_18")
    before = len(os.listdir("/proc/self/fd"))
    ss = make_set(layout, str(proc))
    ss.watch_cgroup(D12_SCOPE)
    ss.watch_pid(4242)
    ss.due(0)
    # 3 cgroups: a directory and up to 7 files each; meminfo, PSI, one status
    assert len(os.listdir("/proc/self/fd")) > before + 10
    ss.close()
    assert len(os.listdir("/proc/self/fd")) == before
    assert ss.due(1 << 40) == []


def test_set_hybrid_this_machines_shape(tmp_path: Path) -> None:
    _, layout = hybrid_tree(tmp_path)
    ss = make_set(layout)
    ss.watch_cgroup(HY_SCOPE)
    events = ss.due(0)
    assert errors(events) == []
    samples = by_path(events)
    assert [s.psi_some_avg10 for s in samples.values()] == [0.31, 0.29, 4.71]
    assert samples["/"].limit_bytes is None  # v1's "no limit" is a huge number
    [eff] = of_type(events, EffectiveLimit)
    assert (eff.limit_bytes, eff.set_by) == (1 << 30, HY_SCOPE)


# ---------------------------------------------------------------------------------------------
# Root tier: a real child memory cgroup

GATED_HOG = (
    "import sys, time\n"
    "sys.stdin.readline()\n"  # wait until moved into the cgroup: charges follow the allocator
    "b = b'x' * (32 << 20)\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)


@pytest.mark.root
def test_root_samples_a_real_child_cgroup(system: tuple[CgroupLayout, str]) -> None:
    layout, parent = system
    resolver = CgroupResolver(layout)
    name = f"whyrestart-test-samplers-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ss = SamplerSet(layout, resolver)
    hog = subprocess.Popen(
        [sys.executable, "-c", GATED_HOG], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        with ChildCgroup(parent, name, 64 * MiB, layout=layout) as cg:
            cg.add_pid(hog.pid)
            assert hog.stdin is not None and hog.stdout is not None
            hog.stdin.write(b"go\n")
            hog.stdin.flush()
            assert hog.stdout.readline() == b"ready\n"
            assert ss.watch_cgroup(cg.path)
            ss.watch_pid(hog.pid)
            now = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
            events = ss.due(now)
            assert [e for e in errors(events) if e[1] in (cg.path, str(hog.pid))] == []
            sample = by_path(events)[cg.path]
            assert sample.cgroup_id == cg.cgroup_id
            assert sample.usage_bytes is not None and sample.usage_bytes >= 30 * MiB
            assert sample.limit_bytes == 64 * MiB
            assert sample.stat["anon"] >= 30 * MiB
            [eff] = of_type(events, EffectiveLimit)
            assert (eff.limit_bytes, eff.set_by) == resolver.effective_limit(cg.path)
            assert eff.limit_bytes is not None and eff.limit_bytes <= 64 * MiB
            [proc] = of_type(events, ProcessSample)
            assert proc.rss_anon is not None and proc.rss_anon >= 30 * MiB
            assert round_trips(events)
            hog.kill()
            hog.wait(timeout=10)
        # The cgroup is gone and so is the process: one error each, then nothing.
        later = ss.due(now + 1_000 * MS)
        assert sorted(e for e in errors(later) if e[1] in (cg.path, str(hog.pid))) == [
            ("cgroup", cg.path, "cgroup removed"),
            ("process", str(hog.pid), "process exited"),
        ]
        assert ss.watched_cgroups == [] and ss.watched_pids == []
        last = ss.due(now + 2_000 * MS)
        assert [type(e) for e in last] == [HostSample]
    finally:
        if hog.poll() is None:
            hog.send_signal(signal.SIGKILL)
        hog.wait(timeout=10)
        for pipe in (hog.stdin, hog.stdout):
            if pipe is not None:
                pipe.close()
        ss.close()
