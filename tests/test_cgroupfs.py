# ruff: noqa: E501  (mountinfo fixtures are kept verbatim, long lines and all)
"""Tests for tracer.sources.cgroupfs and its parsers (tracer.parse.cgroup).

Tier 1 runs everywhere: parsers on fixture text copied in the shape of real hosts, and the
resolver on directory trees built in tmp_path (cgroup ids there are the tmp dirs' real st_ino).
The root tier (``@pytest.mark.root``) creates real child memory cgroups on this machine; each
one is limited and holds only ``sleep``, so nothing comes near exhausting memory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracer.errors import KernelUnsupported, UsageError
from tracer.events import CgroupInfo
from tracer.parse import cgpath
from tracer.parse.cgroup import (
    Mount,
    ProcCgroupLine,
    parse_flat_keyed,
    parse_limit,
    parse_mountinfo,
    parse_proc_cgroup,
)
from tracer.sources.cgroupfs import (
    CgroupLayout,
    CgroupResolver,
    ChildCgroup,
    detect_layout,
    own_memory_cgroup,
)

MiB = 1 << 20

# ---------------------------------------------------------------------------------------------
# Fixture text

# This development host (cgroup v1 controllers + an empty v2 at /sys/fs/cgroup/unified),
# verbatim from /proc/self/mountinfo.
MOUNTINFO_HYBRID_THIS_HOST = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334492k,nr_inodes=3083623,mode=755
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684092k
26 24 0:24 / /dev/pts rw,relatime - devpts devpts rw,mode=600,ptmxmode=000
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 23 0:13 / /sys/kernel/tracing rw,relatime - tracefs tracefs rw
"""

# Debian 12 / Ubuntu 22.04: systemd's unified layout, cgroup2 at /sys/fs/cgroup.
MOUNTINFO_V2_SYSTEMD = """\
22 29 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
23 29 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc rw
24 29 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev rw,size=4010876k,nr_inodes=1002719,mode=755,inode64
25 24 0:23 / /dev/pts rw,nosuid,noexec,relatime shared:3 - devpts devpts rw,gid=5,mode=620,ptmxmode=000
26 29 0:24 / /run rw,nosuid,nodev,noexec,relatime shared:5 - tmpfs tmpfs rw,size=805392k,mode=755,inode64
29 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
27 22 0:6 / /sys/kernel/security rw,nosuid,nodev,noexec,relatime shared:8 - securityfs securityfs rw
30 24 0:26 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,inode64
32 22 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
33 22 0:28 / /sys/fs/pstore rw,nosuid,nodev,noexec,relatime shared:10 - pstore pstore rw
34 22 0:29 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:11 - bpf bpf rw,mode=700
"""
V2_ROOT_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc\n"

# CentOS 7 (kernel 3.10, systemd 219): every controller on v1, no cgroup2 anywhere.
MOUNTINFO_V1_CENTOS7 = """\
17 39 0:17 / /sys rw,nosuid,nodev,noexec,relatime shared:6 - sysfs sysfs rw,seclabel
18 39 0:3 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw
19 39 0:5 / /dev rw,nosuid shared:2 - devtmpfs devtmpfs rw,seclabel,size=1928620k,nr_inodes=482155,mode=755
24 17 0:20 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:8 - tmpfs tmpfs ro,seclabel,mode=755
25 24 0:21 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,seclabel,xattr,release_agent=/usr/lib/systemd/systemd-cgroups-agent,name=systemd
27 24 0:23 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,seclabel,cpuacct,cpu
28 24 0:24 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,seclabel,memory
29 24 0:25 / /sys/fs/cgroup/blkio rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,seclabel,blkio
30 24 0:26 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,seclabel,net_prio,net_cls
31 24 0:27 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,seclabel,pids
32 24 0:28 / /sys/fs/cgroup/devices rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,seclabel,devices
33 24 0:29 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,seclabel,cpuset
34 24 0:30 / /sys/fs/cgroup/hugetlb rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,seclabel,hugetlb
35 24 0:31 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,seclabel,freezer
36 24 0:32 / /sys/fs/cgroup/perf_event rw,nosuid,nodev,noexec,relatime shared:19 - cgroup cgroup rw,seclabel,perf_event
39 1 253:0 / / rw,relatime shared:1 - xfs /dev/mapper/centos-root rw,seclabel,attr2,inode64,noquota
"""

# Ubuntu 20.04: systemd's hybrid layout, memory on v1 and the v2 at /sys/fs/cgroup/unified.
MOUNTINFO_HYBRID_UBUNTU2004 = """\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:29 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 33 0:31 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
39 33 0:35 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
40 33 0:36 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,cpu,cpuacct
"""

DOCKER_ID = "3f4e8c1a9b2d" * 5 + "abcd"  # 64 hex digits

# Inside an old-style Docker container on a v1 host (no cgroup namespace): each hierarchy is
# mounted with root /docker/<id>, so the container sees only its own subtree.
MOUNTINFO_DOCKER_V1_NO_CGROUPNS = f"""\
1290 1281 0:307 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
1291 1290 0:308 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
1292 1291 0:30 /docker/{DOCKER_ID} /sys/fs/cgroup/systemd ro,nosuid,nodev,noexec,relatime master:11 - cgroup cgroup rw,xattr,name=systemd
1298 1291 0:35 /docker/{DOCKER_ID} /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime master:17 - cgroup cgroup rw,memory
1299 1291 0:36 /docker/{DOCKER_ID} /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime master:18 - cgroup cgroup rw,cpu,cpuacct
"""

# /proc/PID/cgroup on the same shapes of host.
PROC_CGROUP_V1_CENTOS7 = """\
11:hugetlb:/
10:memory:/system.slice/sshd.service
9:devices:/system.slice/sshd.service
8:cpuset:/
7:perf_event:/
6:freezer:/
5:pids:/system.slice/sshd.service
4:net_prio,net_cls:/
3:blkio:/system.slice/sshd.service
2:cpuacct,cpu:/system.slice/sshd.service
1:name=systemd:/system.slice/sshd.service
"""
PROC_CGROUP_V2 = "0::/user.slice/user-1000.slice/session-3.scope\n"
PROC_CGROUP_HYBRID_THIS_HOST = """\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/323c2656d712219b887e1d1453d3bf0b
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
"""
PROC_CGROUP_HYBRID_UBUNTU = """\
12:memory:/user.slice/user-1000.slice/session-1.scope
11:cpu,cpuacct:/user.slice
1:name=systemd:/user.slice/user-1000.slice/session-1.scope
0::/user.slice/user-1000.slice/session-1.scope
"""
PROC_CGROUP_DOCKER_V1 = f"""\
12:memory:/docker/{DOCKER_ID}
11:cpu,cpuacct:/docker/{DOCKER_ID}
1:name=systemd:/docker/{DOCKER_ID}
0::/system.slice/containerd.service
"""
POD_UID = "9c1a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8"
CONTAINER_ID = "c0ffee" * 10 + "beef"
PROC_CGROUP_K8S_V1 = f"""\
11:memory:/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}
4:cpu,cpuacct:/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}
1:name=systemd:/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}
"""
K8S_V2_PATH = (
    "/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CONTAINER_ID}.scope"
)
PROC_CGROUP_K8S_V2 = f"0::{K8S_V2_PATH}\n"


def no_controllers(_mount_point: str) -> str | None:
    return None


def v2_controllers(_mount_point: str) -> str | None:
    return V2_ROOT_CONTROLLERS


# ---------------------------------------------------------------------------------------------
# parse_mountinfo


def test_parse_mountinfo_keeps_only_cgroup_mounts_of_this_host() -> None:
    mounts = parse_mountinfo(MOUNTINFO_HYBRID_THIS_HOST)
    assert [m.mount_point for m in mounts] == [
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/cpuacct",
        "/sys/fs/cgroup/cpuset",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/devices",
        "/sys/fs/cgroup/freezer",
        "/sys/fs/cgroup/blkio",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/systemd",
        "/sys/fs/cgroup/unified",
    ]
    memory = mounts[3]
    assert memory == Mount(
        mount_id=35,
        parent_id=31,
        root="/",
        mount_point="/sys/fs/cgroup/memory",
        options=("rw", "relatime"),
        fstype="cgroup",
        source="cgroup",
        super_options=("rw", "memory"),
    )
    assert memory.controllers == ("memory",)
    systemd, unified = mounts[8], mounts[9]
    assert systemd.controllers == ()  # a named hierarchy has no controller
    assert unified.fstype == "cgroup2"
    assert unified.controllers == ()


def test_parse_mountinfo_optional_fields_and_controller_lists() -> None:
    mounts = parse_mountinfo(MOUNTINFO_V1_CENTOS7)
    by_point = {m.mount_point: m for m in mounts}
    assert set(by_point) >= {"/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu,cpuacct"}
    assert by_point["/sys/fs/cgroup/cpu,cpuacct"].controllers == ("cpuacct", "cpu")
    assert by_point["/sys/fs/cgroup/memory"].controllers == ("memory",)  # seclabel: a flag
    systemd = by_point["/sys/fs/cgroup/systemd"]
    assert systemd.controllers == ()
    assert "name=systemd" in systemd.super_options


def test_parse_mountinfo_v2_and_all_fstypes() -> None:
    mounts = parse_mountinfo(MOUNTINFO_V2_SYSTEMD)
    assert len(mounts) == 1
    assert mounts[0].fstype == "cgroup2"
    assert mounts[0].super_options == ("rw", "nsdelegate", "memory_recursiveprot")
    everything = parse_mountinfo(MOUNTINFO_V2_SYSTEMD, fstypes=None)
    assert len(everything) == MOUNTINFO_V2_SYSTEMD.count("\n")
    assert everything[0].options == ("rw", "nosuid", "nodev", "noexec", "relatime")


def test_parse_mountinfo_unescapes_and_skips_garbage() -> None:
    text = (
        "garbage\n"
        "\n"
        "1 2 3\n"
        "x 1 0:1 / /a rw - cgroup cgroup rw,memory\n"  # non-numeric id
        "50 1 0:40 / /mnt/my\\040cgroups rw,relatime - cgroup cgroup rw,memory\n"
        "51 1 0:41 / /mnt/v2 rw - cgroup2 cgroup2\n"  # no super options at all
    )
    mounts = parse_mountinfo(text)
    assert [m.mount_point for m in mounts] == ["/mnt/my cgroups", "/mnt/v2"]
    assert mounts[1].super_options == ()


# ---------------------------------------------------------------------------------------------
# detect_layout / from_system


def test_detect_layout_this_hybrid_host() -> None:
    layout = detect_layout(MOUNTINFO_HYBRID_THIS_HOST, lambda _p: "hugetlb\n")
    assert layout == CgroupLayout(
        mode="hybrid",
        memory_root="/sys/fs/cgroup/memory",
        memory_version=1,
        unified_root="/sys/fs/cgroup/unified",
    )
    assert layout.hierarchy == "memory"


def test_detect_layout_ubuntu_hybrid() -> None:
    layout = detect_layout(MOUNTINFO_HYBRID_UBUNTU2004, lambda _p: "")
    assert (layout.mode, layout.memory_root, layout.memory_version, layout.unified_root) == (
        "hybrid",
        "/sys/fs/cgroup/memory",
        1,
        "/sys/fs/cgroup/unified",
    )


def test_detect_layout_pure_v2() -> None:
    seen: list[str] = []

    def read(mount_point: str) -> str | None:
        seen.append(mount_point)
        return V2_ROOT_CONTROLLERS

    layout = detect_layout(MOUNTINFO_V2_SYSTEMD, read)
    assert layout == CgroupLayout("v2", "/sys/fs/cgroup", 2, "/sys/fs/cgroup")
    assert layout.hierarchy == "unified"
    assert seen == ["/sys/fs/cgroup"]


def test_detect_layout_v2_without_memory_controller() -> None:
    layout = detect_layout(MOUNTINFO_V2_SYSTEMD, lambda _p: "cpu io pids\n")
    assert layout == CgroupLayout("v2", None, None, "/sys/fs/cgroup")
    unreadable = detect_layout(MOUNTINFO_V2_SYSTEMD, no_controllers)
    assert unreadable.memory_root is None
    assert unreadable.hierarchy is None


def test_detect_layout_pure_v1() -> None:
    layout = detect_layout(MOUNTINFO_V1_CENTOS7, no_controllers)
    assert layout == CgroupLayout("v1", "/sys/fs/cgroup/memory", 1, None)


def test_detect_layout_no_cgroups() -> None:
    assert detect_layout("", no_controllers) == CgroupLayout("none", None, None, None)
    no_cgroup_text = "\n".join(
        line for line in MOUNTINFO_V2_SYSTEMD.splitlines() if "cgroup" not in line
    )
    assert detect_layout(no_cgroup_text, v2_controllers).mode == "none"


def test_detect_layout_docker_mount_root() -> None:
    layout = detect_layout(MOUNTINFO_DOCKER_V1_NO_CGROUPNS, no_controllers)
    assert layout.mode == "v1"
    assert layout.memory_root == "/sys/fs/cgroup/memory"
    assert layout.memory_mount_root == f"/docker/{DOCKER_ID}"


def test_detect_layout_prefers_whole_hierarchy_under_sys_fs_cgroup() -> None:
    text = (
        "90 1 0:32 /some/sub /mnt/sub rw - cgroup cgroup rw,memory\n"
        "91 1 0:32 / /mnt/elsewhere rw - cgroup cgroup rw,memory\n"
        "92 1 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    )
    layout = detect_layout(text, no_controllers)
    assert layout.memory_root == "/sys/fs/cgroup/memory"
    assert layout.memory_mount_root == "/"


def test_from_system_reads_fixture_proc_root(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup"
    cg.mkdir()
    (cg / "cgroup.controllers").write_text(V2_ROOT_CONTROLLERS)
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "mountinfo").write_text(
        f"32 22 0:27 / {cg} rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    layout = CgroupLayout.from_system(str(tmp_path / "proc"))
    assert layout == CgroupLayout("v2", str(cg), 2, str(cg))
    # An explicit mountinfo path wins over proc_root.
    other = tmp_path / "mountinfo-v1"
    other.write_text(MOUNTINFO_V1_CENTOS7)
    assert CgroupLayout.from_system("/nonexistent", mountinfo_path=str(other)).mode == "v1"


def test_from_system_missing_mountinfo_is_none(tmp_path: Path) -> None:
    assert CgroupLayout.from_system(str(tmp_path)).mode == "none"


# ---------------------------------------------------------------------------------------------
# parse_proc_cgroup


def test_parse_proc_cgroup_v1_centos7() -> None:
    lines = parse_proc_cgroup(PROC_CGROUP_V1_CENTOS7)
    assert len(lines) == 11
    assert lines[1] == ProcCgroupLine(10, ("memory",), "/system.slice/sshd.service")
    assert lines[-2].controllers == ("cpuacct", "cpu")
    assert lines[-1].controllers == ("name=systemd",)


def test_parse_proc_cgroup_v2_and_deleted() -> None:
    assert parse_proc_cgroup(PROC_CGROUP_V2) == [
        ProcCgroupLine(0, (), "/user.slice/user-1000.slice/session-3.scope")
    ]
    (line,) = parse_proc_cgroup("0::/system.slice/gone.service (deleted)\n")
    assert line.path == "/system.slice/gone.service"
    assert line.deleted


def test_parse_proc_cgroup_hybrid_docker_kubernetes() -> None:
    hybrid = parse_proc_cgroup(PROC_CGROUP_HYBRID_THIS_HOST)
    assert [ln.hierarchy_id for ln in hybrid] == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
    assert hybrid[5].path == "/process_api/323c2656d712219b887e1d1453d3bf0b"
    docker = parse_proc_cgroup(PROC_CGROUP_DOCKER_V1)
    assert docker[0].path == f"/docker/{DOCKER_ID}"
    assert docker[-1] == ProcCgroupLine(0, (), "/system.slice/containerd.service")
    k8s = parse_proc_cgroup(PROC_CGROUP_K8S_V1)
    assert k8s[0].path == f"/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}"
    (k8s2,) = parse_proc_cgroup(PROC_CGROUP_K8S_V2)
    assert k8s2.path == K8S_V2_PATH


def test_parse_proc_cgroup_tolerates_garbage_and_colons() -> None:
    text = "junk\n\nx:memory:/a\n4:memory:relative\n5:memory:/odd:name\n6:memory:/ok\n"
    lines = parse_proc_cgroup(text)
    assert [ln.path for ln in lines] == ["/odd:name", "/ok"]


# ---------------------------------------------------------------------------------------------
# parse_limit / parse_flat_keyed


@pytest.mark.parametrize(
    ("text", "version", "expected"),
    [
        ("9223372036854771712\n", 1, None),  # v1 "unlimited", 4 KiB pages
        ("9223372036854710272\n", 1, None),  # v1 "unlimited", 64 KiB pages
        ("9223372036854775807\n", 1, None),  # LONG_MAX itself
        ("67108864\n", 1, 64 * MiB),
        ("0\n", 1, 0),
        ("-1\n", 1, None),
        ("max\n", 2, None),
        ("536870912\n", 2, 512 * MiB),
        ("max", 1, None),  # lenient: either spelling in either version
        ("", 1, None),
        ("garbage\n", 2, None),
        ("12 34\n", 1, None),
        ("4096\n", 3, None),  # unknown version: no claim
    ],
)
def test_parse_limit(text: str, version: int, expected: int | None) -> None:
    assert parse_limit(text, version) == expected


def test_parse_flat_keyed_memory_stat_and_events() -> None:
    stat = "cache 1234\nrss 5678\nhierarchical_memory_limit 9223372036854771712\n"
    assert parse_flat_keyed(stat) == {
        "cache": 1234,
        "rss": 5678,
        "hierarchical_memory_limit": 9223372036854771712,
    }
    events = "low 0\nhigh 3\nmax 17\noom 2\noom_kill 2\noom_group_kill 0\n"
    assert parse_flat_keyed(events)["oom_kill"] == 2
    garbage = "nonsense\nkey notanumber\na 1 2\n\n  spaced   7  \nneg -5\n"
    assert parse_flat_keyed(garbage) == {"spaced": 7, "neg": -5}


@given(st.text())
def test_parsers_never_raise(text: str) -> None:
    parse_mountinfo(text)
    parse_proc_cgroup(text)
    parse_flat_keyed(text)
    parse_limit(text, 1)
    parse_limit(text, 2)
    detect_layout(text, lambda _p: text)


@given(
    st.dictionaries(
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=20),
        st.integers(min_value=-(2**63), max_value=2**64),
        max_size=30,
    )
)
def test_parse_flat_keyed_round_trip(values: dict[str, int]) -> None:
    text = "".join(f"{k} {v}\n" for k, v in values.items())
    assert parse_flat_keyed(text) == values


# ---------------------------------------------------------------------------------------------
# Resolver on a tmp tree


def v1_layout(root: Path) -> CgroupLayout:
    return CgroupLayout("v1", str(root), 1, None)


def v2_layout(root: Path) -> CgroupLayout:
    return CgroupLayout("v2", str(root), 2, str(root))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A v1-shaped memory hierarchy: /docker/abc and /kubepods/burstable/pod1/c1."""
    root = tmp_path / "memory"
    for rel in ("docker/abc", "kubepods/burstable/pod1/c1"):
        (root / rel).mkdir(parents=True)
    (root / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (root / "docker" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (root / "docker" / "abc" / "memory.limit_in_bytes").write_text(f"{256 * MiB}\n")
    (root / "kubepods" / "burstable" / "pod1" / "memory.limit_in_bytes").write_text(f"{64 * MiB}\n")
    (root / "kubepods" / "burstable" / "pod1" / "c1" / "memory.limit_in_bytes").write_text(
        f"{128 * MiB}\n"
    )
    (root / "docker" / "abc" / "cgroup.procs").write_text("123\n456\n0\n")
    return root


def ino(path: Path) -> int:
    return os.stat(path).st_ino


def test_path_of_maps_real_inodes(tree: Path) -> None:
    r = CgroupResolver(v1_layout(tree))
    assert r.path_of(ino(tree)) == "/"
    assert r.path_of(ino(tree / "docker" / "abc")) == "/docker/abc"
    assert r.path_of(ino(tree / "kubepods/burstable/pod1/c1")) == "/kubepods/burstable/pod1/c1"
    assert r.scan_count == 1  # one walk cached everything


def test_path_of_miss_rescans_once_per_call(tree: Path) -> None:
    r = CgroupResolver(v1_layout(tree))
    r.path_of(ino(tree))
    (tree / "docker" / "new").mkdir()
    assert r.path_of(ino(tree / "docker" / "new")) == "/docker/new"
    assert r.scan_count == 2
    assert r.path_of(2**62 + 12345) is None  # unknown id: one more walk, then None
    assert r.scan_count == 3


def test_path_of_survives_removal(tree: Path) -> None:
    gone = tree / "docker" / "short-lived"
    gone.mkdir()
    gone_id = ino(gone)
    r = CgroupResolver(v1_layout(tree))
    assert r.path_of(gone_id) == "/docker/short-lived"
    gone.rmdir()
    r.rescan()  # later walks must not forget it
    assert r.path_of(gone_id) == "/docker/short-lived"


def test_a_path_the_kernel_reported_is_known_after_the_cgroup_is_gone(tree: Path) -> None:
    """A crash-looping container's cgroup can be made and removed before anything looks it
    up: the path cgroup_mkdir reported names it, with no walk (a walk would find nothing)."""
    r = CgroupResolver(v1_layout(tree))
    r.learn(2**62 + 7, "/libpod_parent/libpod-abc/")
    assert r.path_of(2**62 + 7) == "/libpod_parent/libpod-abc"
    info = r.info(2**62 + 7, ts=5)
    assert info is not None and (info.path, info.limit_bytes) == ("/libpod_parent/libpod-abc", None)
    assert r.scan_count == 0
    # a path as long as the record holds may have been cut: not learnt
    r.learn(2**62 + 8, "/" + "x" * 254)
    assert r.path_of(2**62 + 8) is None
    # what a walk found stays
    r.learn(ino(tree / "docker" / "abc"), "/elsewhere")
    assert r.path_of(ino(tree / "docker" / "abc")) == "/docker/abc"


def test_path_of_cache_is_bounded(tree: Path) -> None:
    r = CgroupResolver(v1_layout(tree), max_entries=3)
    r.rescan()  # 8 dirs seen, only the 3 seen last are kept
    assert len(r._paths) == 3


def test_path_of_without_memory_hierarchy() -> None:
    r = CgroupResolver(CgroupLayout("v2", None, None, "/sys/fs/cgroup"))
    assert r.path_of(1) is None
    assert r.limit_of("/") is None
    assert r.procs("/") == []
    assert r.info(1, ts=5) is None
    with pytest.raises(UsageError, match="memory controller"):
        r.id_of("/x")


def test_id_of(tree: Path) -> None:
    r = CgroupResolver(v1_layout(tree))
    assert r.id_of("/docker/abc") == ino(tree / "docker" / "abc")
    assert r.id_of("docker/abc/") == ino(tree / "docker" / "abc")
    assert r.id_of("/") == ino(tree)
    assert r.id_of(str(tree / "docker")) == ino(tree / "docker")  # mount point prefix accepted
    assert r.id_of("/../../docker") == ino(tree / "docker")  # cannot climb out of the root
    assert r.scan_count == 0  # id_of stats, it does not walk
    assert r.path_of(ino(tree / "docker" / "abc")) == "/docker/abc"
    assert r.scan_count == 0  # ...and what it stat'ed is cached


def test_id_of_missing_names_path_and_fix(tree: Path) -> None:
    r = CgroupResolver(v1_layout(tree))
    with pytest.raises(UsageError) as info:
        r.id_of("/docker/nope")
    assert "/docker/nope" in str(info.value)
    assert info.value.fix == f"does it exist? list with ls {tree}"
    with pytest.raises(UsageError):
        r.id_of("/docker/abc/memory.limit_in_bytes")  # a file, not a cgroup


def test_exists_and_children(tree: Path) -> None:
    r = CgroupResolver(v1_layout(tree))
    assert r.exists("/docker/abc") and r.exists(str(tree / "docker")) and r.exists("/")
    assert not r.exists("/docker/nope")
    assert not r.exists("/docker/abc/memory.limit_in_bytes")  # a file, not a cgroup
    assert "/docker/abc" in r.children("/docker")
    assert all(r.exists(c) for c in r.children("/docker"))
    assert r.children("/docker/nope") == []
    assert not CgroupResolver(CgroupLayout("v2", None, None, "/sys/fs/cgroup")).exists("/")


def test_limits_v1(tree: Path) -> None:
    r = CgroupResolver(v1_layout(tree))
    assert r.limit_of("/") is None
    assert r.limit_of("/docker/abc") == 256 * MiB
    assert r.limit_of("/kubepods") is None  # no file: nothing raised
    assert r.limit_of("/does/not/exist") is None


def test_effective_limit_picks_parent(tree: Path) -> None:
    r = CgroupResolver(v1_layout(tree))
    pod = "/kubepods/burstable/pod1"
    assert r.effective_limit(f"{pod}/c1") == (64 * MiB, pod)
    assert r.effective_limit("/docker/abc") == (256 * MiB, "/docker/abc")
    assert r.effective_limit("/docker") == (None, None)
    # Equal limits: the deepest one is named.
    (tree / "kubepods/burstable/pod1/c1/memory.limit_in_bytes").write_text(f"{64 * MiB}\n")
    assert r.effective_limit(f"{pod}/c1") == (64 * MiB, f"{pod}/c1")


def test_limits_v2(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "memory.max").write_text(f"{32 * MiB}\n")
    (tmp_path / "a" / "b" / "memory.max").write_text("max\n")
    (tmp_path / "a" / "b" / "memory.limit_in_bytes").write_text("1\n")  # ignored on v2
    r = CgroupResolver(v2_layout(tmp_path))
    assert r.limit_of("/a/b") is None
    assert r.effective_limit("/a/b") == (32 * MiB, "/a")
    info = r.info(r.id_of("/a"), ts=99)
    assert info == CgroupInfo(
        ts=99, cgroup_id=ino(tmp_path / "a"), path="/a", hierarchy="unified", limit_bytes=32 * MiB
    )


def test_ancestors() -> None:
    anc = cgpath.ancestors
    assert anc("/a/b/c") == ["/a/b/c", "/a/b", "/a", "/"]
    assert anc("/") == ["/"]
    assert anc("") == ["/"]
    assert anc("a/b/") == ["/a/b", "/a", "/"]
    assert anc("//a//b") == ["/a/b", "/a", "/"]


def test_info_v1_and_vanished(tree: Path) -> None:
    r = CgroupResolver(v1_layout(tree))
    abc = ino(tree / "docker" / "abc")
    assert r.info(abc, ts=7) == CgroupInfo(
        ts=7, cgroup_id=abc, path="/docker/abc", hierarchy="memory", limit_bytes=256 * MiB
    )
    assert r.info(2**62 + 1, ts=7) is None
    gone = tree / "docker" / "gone"
    gone.mkdir()
    gone_id = ino(gone)
    r.rescan()
    gone.rmdir()
    info = r.info(gone_id, ts=8)
    assert info is not None
    assert (info.path, info.limit_bytes) == ("/docker/gone", None)


def test_procs(tree: Path) -> None:
    r = CgroupResolver(v1_layout(tree))
    assert r.procs("/docker/abc") == [123, 456]  # 0 (other pid namespace) dropped
    assert r.procs("/docker") == []


# ---------------------------------------------------------------------------------------------
# cgroup_of_pid / own_memory_cgroup on a fixture /proc


def fake_proc(tmp_path: Path, entries: dict[str, str]) -> str:
    proc = tmp_path / "proc"
    for pid, text in entries.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cgroup").write_text(text)
    return str(proc)


@pytest.mark.parametrize(
    ("layout", "text", "expected"),
    [
        (
            CgroupLayout("v1", "/m", 1, None),
            PROC_CGROUP_V1_CENTOS7,
            "/system.slice/sshd.service",
        ),
        (
            CgroupLayout("v2", "/u", 2, "/u"),
            PROC_CGROUP_V2,
            "/user.slice/user-1000.slice/session-3.scope",
        ),
        (
            CgroupLayout("hybrid", "/m", 1, "/u"),
            PROC_CGROUP_HYBRID_THIS_HOST,
            "/process_api/323c2656d712219b887e1d1453d3bf0b",
        ),
        (
            CgroupLayout("hybrid", "/m", 1, "/u"),
            PROC_CGROUP_HYBRID_UBUNTU,
            "/user.slice/user-1000.slice/session-1.scope",
        ),
        # Hybrid host, container seen from the host: the memory line, not the 0:: line.
        (CgroupLayout("hybrid", "/m", 1, "/u"), PROC_CGROUP_DOCKER_V1, f"/docker/{DOCKER_ID}"),
        (
            CgroupLayout("v1", "/m", 1, None),
            PROC_CGROUP_K8S_V1,
            f"/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}",
        ),
        (CgroupLayout("v2", "/u", 2, "/u"), PROC_CGROUP_K8S_V2, K8S_V2_PATH),
        # Inside the container without a cgroup namespace: its mount shows /docker/<id> as "/".
        (
            CgroupLayout("v1", "/m", 1, None, f"/docker/{DOCKER_ID}"),
            PROC_CGROUP_DOCKER_V1,
            "/",
        ),
        (
            CgroupLayout("v1", "/m", 1, None, f"/docker/{DOCKER_ID}"),
            f"4:memory:/docker/{DOCKER_ID}/child\n",
            "/child",
        ),
        (CgroupLayout("v1", "/m", 1, None, "/docker/x"), "4:memory:/elsewhere\n", None),
        # Outside our cgroup namespace.
        (CgroupLayout("v2", "/u", 2, "/u"), "0::/../../system.slice\n", None),
        # v1 layout but no memory line (e.g. a process seen from the wrong namespace).
        (CgroupLayout("v1", "/m", 1, None), PROC_CGROUP_V2, None),
        (CgroupLayout("v2", None, None, "/u"), PROC_CGROUP_V2, None),
    ],
)
def test_cgroup_of_pid(
    tmp_path: Path, layout: CgroupLayout, text: str, expected: str | None
) -> None:
    proc = fake_proc(tmp_path, {"42": text})
    assert CgroupResolver(layout, proc_root=proc).cgroup_of_pid(42) == expected


def test_cgroup_of_pid_gone(tmp_path: Path) -> None:
    r = CgroupResolver(CgroupLayout("v1", "/m", 1, None), proc_root=str(tmp_path))
    assert r.cgroup_of_pid(999999) is None


def test_own_memory_cgroup_fixture(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {"self": PROC_CGROUP_HYBRID_THIS_HOST})
    (tmp_path / "proc" / "self" / "mountinfo").write_text(MOUNTINFO_HYBRID_THIS_HOST)
    assert own_memory_cgroup(proc) == "/process_api/323c2656d712219b887e1d1453d3bf0b"
    v2 = CgroupLayout("v2", "/u", 2, "/u")
    assert own_memory_cgroup(proc, layout=v2) == "/"


def test_own_memory_cgroup_errors(tmp_path: Path) -> None:
    with pytest.raises(KernelUnsupported):
        own_memory_cgroup(str(tmp_path))  # no mountinfo: no memory hierarchy
    with pytest.raises(UsageError):
        own_memory_cgroup(str(tmp_path), layout=CgroupLayout("v1", "/m", 1, None))


# ---------------------------------------------------------------------------------------------
# ChildCgroup argument checks (no root needed)


@pytest.mark.parametrize("name", ["", "a/b", ".", "..", "x\0y"])
def test_child_cgroup_rejects_bad_names(name: str) -> None:
    with pytest.raises(UsageError, match="bad cgroup name"):
        ChildCgroup("/", name)


def test_child_cgroup_needs_memory_hierarchy() -> None:
    child = ChildCgroup("/", "x", layout=CgroupLayout("v2", None, None, "/u"))
    with pytest.raises(KernelUnsupported), child:
        pass
    with pytest.raises(RuntimeError):
        _ = child.cgroup_id


def test_child_cgroup_missing_parent(tmp_path: Path) -> None:
    child = ChildCgroup("/nope", "x", layout=v1_layout(tmp_path))
    with pytest.raises(UsageError, match="/nope"), child:
        pass
    assert not (tmp_path / "nope").exists()


def test_child_cgroup_existing_child_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with (
        pytest.raises(UsageError, match="already exists"),
        ChildCgroup("/", "taken", layout=v1_layout(tmp_path)),
    ):
        pass
    assert (tmp_path / "taken").is_dir()


# ---------------------------------------------------------------------------------------------
# Root tier: real child cgroups on this machine


def unique(tag: str) -> str:
    return f"whyrestart-test-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@pytest.mark.root
def test_root_child_with_limit(system: tuple[CgroupLayout, str]) -> None:
    layout, parent = system
    r = CgroupResolver(layout)
    with ChildCgroup(parent, unique("limit"), 64 * MiB, layout=layout) as child:
        abs_path = os.path.join(layout.memory_root or "", child.path.lstrip("/"))
        assert child.abs_path == abs_path
        assert os.path.isdir(abs_path)
        assert child.cgroup_id == os.stat(abs_path).st_ino
        assert r.id_of(child.path) == child.cgroup_id
        assert r.limit_of(child.path) == 64 * MiB
        assert r.path_of(child.cgroup_id) == child.path
        info = r.info(child.cgroup_id, ts=1)
        assert info is not None
        assert (info.path, info.hierarchy, info.limit_bytes) == (
            child.path,
            layout.hierarchy,
            64 * MiB,
        )
        assert child.procs() == []
    assert not os.path.exists(abs_path)
    # Removed, but still named.
    assert r.path_of(child.cgroup_id) == child.path


@pytest.mark.root
def test_root_nested_children(system: tuple[CgroupLayout, str]) -> None:
    layout, parent = system
    r = CgroupResolver(layout)
    with (
        ChildCgroup(parent, unique("outer"), 64 * MiB, layout=layout) as outer,
        ChildCgroup(outer.path, "inner", 128 * MiB, layout=layout) as inner,
    ):
        assert inner.path == f"{outer.path}/inner"
        assert r.limit_of(inner.path) == 128 * MiB
        assert r.limit_of(outer.path) == 64 * MiB
        assert r.effective_limit(inner.path) == (64 * MiB, outer.path)
        assert cgpath.ancestors(inner.path)[:2] == [inner.path, outer.path]
        assert r.id_of(inner.path) == inner.cgroup_id  # seen while it existed...
    assert r.path_of(inner.cgroup_id) == inner.path  # ...so still named once removed
    with pytest.raises(UsageError):
        r.id_of(outer.path)


@pytest.mark.root
def test_root_process_killed_and_cgroup_removed(
    system: tuple[CgroupLayout, str], sleeper: subprocess.Popen[bytes]
) -> None:
    layout, parent = system
    r = CgroupResolver(layout)
    with ChildCgroup(parent, unique("procs"), 64 * MiB, layout=layout) as child:
        child.add_pid(sleeper.pid)
        assert r.procs(child.path) == [sleeper.pid]
        assert child.procs() == [sleeper.pid]
        assert r.cgroup_of_pid(sleeper.pid) == child.path
        path = child.abs_path
    assert sleeper.wait(timeout=5) == -9  # SIGKILL
    assert not os.path.exists(path)


@pytest.mark.root
def test_root_outer_exit_removes_leftover_grandchild(
    system: tuple[CgroupLayout, str], sleeper: subprocess.Popen[bytes]
) -> None:
    layout, parent = system
    with ChildCgroup(parent, unique("tree"), 64 * MiB, layout=layout) as outer:
        inner = ChildCgroup(outer.path, "inner", layout=layout).__enter__()  # never exited
        inner.add_pid(sleeper.pid)
        path = outer.abs_path
    assert sleeper.wait(timeout=5) == -9
    assert not os.path.exists(path)


@pytest.mark.root
def test_root_own_cgroup_matches_proc(system: tuple[CgroupLayout, str]) -> None:
    layout, _parent = system
    r = CgroupResolver(layout)
    own = own_memory_cgroup(layout=layout)
    assert r.cgroup_of_pid(os.getpid()) == own
    assert r.path_of(r.id_of(own)) == own
    start = time.monotonic()
    r.rescan()
    assert time.monotonic() - start < 5  # a full walk of the real hierarchy stays cheap


@pytest.mark.root
def test_root_self_is_moved_home_not_killed(system: tuple[CgroupLayout, str]) -> None:
    layout, parent = system
    own = own_memory_cgroup(layout=layout)
    # No limit: this test process's own allocations must never meet one.
    with ChildCgroup(parent, unique("self"), layout=layout) as child:
        child.add_pid(os.getpid())
        assert own_memory_cgroup(layout=layout) == child.path
        path = child.abs_path
    assert own_memory_cgroup(layout=layout) == own
    assert not os.path.exists(path)


def _cached_bytes(path: Path) -> int:
    """How much of the file is in the page cache (util-linux's fincore: mincore(2))."""
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return int(out.split()[0])


@pytest.mark.root
@pytest.mark.parametrize("drop", [False, True])
def test_root_child_drops_the_page_cache_it_read(
    system: tuple[CgroupLayout, str], tmp_path: Path, drop: bool
) -> None:
    """A page stays charged to the cgroup that read it, even once that cgroup is gone: a file
    read in one repro run would be found cached, charged to nobody new, by the next. With
    ``drop_cache`` the child reclaims it before it is removed."""
    layout, parent = system
    if not shutil.which("fincore"):
        pytest.skip("fincore (util-linux) is not installed")
    data = tmp_path / "data"
    data.write_bytes(os.urandom(16 * MiB))
    fd = os.open(data, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert _cached_bytes(data) < MiB
    child = ChildCgroup(parent, unique("drop"), 64 * MiB, layout=layout, drop_cache=drop)
    with child:
        subprocess.run(
            ["sh", "-c", f'echo $$ > {child.procs_file} && exec cat "$1" > /dev/null', "sh", data],
            check=True,
        )
        assert _cached_bytes(data) == 16 * MiB  # read in the child, cached
    assert child.drop_error is None
    left = _cached_bytes(data)
    assert (left < MiB) if drop else (left == 16 * MiB), left
