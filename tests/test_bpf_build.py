"""`make -C bpf` builds on a host older than the newest kernel type it reads (issue 31 item 5).

bpf/Makefile generates vmlinux.h from the build host's BTF, so a type that only newer kernels
declare breaks the build on older hosts: `trace_event_raw_sched_process_exit` exists only since
3e816361e94a (6.16), which made sched_process_exit a TRACE_EVENT of its own (before it, a
DEFINE_EVENT of sched_process_template, which declares no struct of that name), and the build
failed on Debian 12, Ubuntu 22.04/24.04 and RHEL 9. This test builds a copy of bpf/ against this
host's BTF with the 6.16-only types taken out, as a pre-6.16 host's vmlinux.h reads. (The lab's
bookworm run builds against a real 6.1 BTF, inside the VM: tests/lab/test_lab.py.)
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

BPF_DIR = Path(__file__).resolve().parent.parent / "bpf"
BTF = Path("/sys/kernel/btf/vmlinux")
# the types a pre-6.16 kernel does not declare, that the sources once used
NEWER_TYPES = ("trace_event_raw_sched_process_exit",)


def _tools() -> tuple[str, str]:
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    clang = shutil.which("clang")
    if clang is None or not Path(bpftool).exists() or shutil.which("make") is None:
        pytest.skip("needs clang, make and bpftool (scripts/setup installs them)")
    if not BTF.exists():
        pytest.skip("this kernel has no BTF (/sys/kernel/btf/vmlinux) to generate vmlinux.h from")
    return bpftool, clang


def without_type(header: str, name: str) -> str:
    """header with `struct NAME { ... };` removed (bpftool's format c: one definition, the
    closing brace alone at the start of a line)."""
    return re.sub(rf"^struct {name} \{{\n.*?^\}};\n", "", header, flags=re.S | re.M)


def test_without_type_removes_only_that_struct() -> None:
    header = "struct a {\n\tint x;\n};\n\nstruct a_b {\n\tint y;\n};\n"
    assert without_type(header, "a") == "\nstruct a_b {\n\tint y;\n};\n"


def test_objects_build_against_a_pre_616_vmlinux_h(tmp_path: Path) -> None:
    bpftool, clang = _tools()
    dumped = subprocess.run(
        [bpftool, "btf", "dump", "file", str(BTF), "format", "c"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    old = dumped
    for name in NEWER_TYPES:
        old = without_type(old, name)
        assert f"struct {name} {{" not in old
    build = tmp_path / "bpf"
    build.mkdir()
    # a copy: an in-place build would include bpf/vmlinux.h (a quoted include's own directory
    # is searched first)
    for f in [BPF_DIR / "Makefile", *BPF_DIR.glob("*.c"), *BPF_DIR.glob("*.h")]:
        if f.name != "vmlinux.h":
            shutil.copy(f, build / f.name)
    (build / "vmlinux.h").write_text(old)
    res = subprocess.run(
        ["make", "-s", "-C", str(build), f"CLANG={clang}", f"BPFTOOL={bpftool}"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    for obj in ("whyrestart.bpf.o", "gpu.bpf.o"):
        assert (build / obj).stat().st_size > 0
