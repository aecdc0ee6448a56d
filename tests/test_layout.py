"""Tier 2: every struct in bpf/events.h matches its Python mirror, checked against the BTF of
the compiled objects (the way Tetragon's alignment checker does): whyrestart.bpf.o, and
gpu.bpf.o for the GPU structs (``layout.GPU_STRUCTS``)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tracer.bpf import gpuhooks, hooks, layout

pytestmark = pytest.mark.bpfobj


def _btf_types(path: str) -> list[dict[str, Any]]:
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    out = subprocess.run(
        [bpftool, "-j", "btf", "dump", "file", path],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    types: list[dict[str, Any]] = json.loads(out)["types"]
    return types


def _dump_structs(path: str) -> dict[str, dict[str, Any]]:
    types = _btf_types(path)
    return {t["name"]: t for t in types if t.get("kind") == "STRUCT" and t.get("name")}


def _dump_enums(path: str) -> dict[str, dict[str, int]]:
    return {
        t["name"]: {v["name"]: v["val"] for v in t["values"]}
        for t in _btf_types(path)
        if t.get("kind") == "ENUM" and t.get("name")
    }


@pytest.fixture(scope="module")
def main_structs() -> dict[str, dict[str, Any]]:
    return _dump_structs(hooks.object_path())


GPU_MISSING = f"GPU BPF object not built ({gpuhooks.object_path()}): make -C bpf"


@pytest.fixture(scope="module")
def gpu_structs() -> dict[str, dict[str, Any]] | None:
    if not os.path.exists(gpuhooks.object_path()):
        return None
    return _dump_structs(gpuhooks.object_path())


@pytest.fixture(scope="module")
def btf_structs(
    main_structs: dict[str, dict[str, Any]], gpu_structs: dict[str, dict[str, Any]] | None
) -> dict[str, dict[str, Any]]:
    """Each struct from the object that defines it (wr_hdr, in both, must agree too)."""
    if gpu_structs is None:
        return main_structs

    def shape(t: dict[str, Any]) -> tuple[int, list[tuple[str, int]]]:
        return t["size"], [(m["name"], m["bits_offset"]) for m in t["members"]]

    assert shape(main_structs["wr_hdr"]) == shape(gpu_structs["wr_hdr"])
    out = dict(main_structs)
    out.update({name: gpu_structs[name] for name in layout.GPU_STRUCTS if name in gpu_structs})
    return out


@pytest.mark.parametrize("name", sorted(layout.STRUCTS))
def test_struct_matches_btf(name: str, btf_structs: dict[str, dict[str, Any]]) -> None:
    if name not in btf_structs and name in layout.GPU_STRUCTS:
        assert not os.path.exists(gpuhooks.object_path()), f"{name} is not in gpu.bpf.o"
        pytest.skip(GPU_MISSING)
    assert name in btf_structs, f"struct {name} is not in the object's BTF"
    btf = btf_structs[name]
    mirror = layout.STRUCTS[name]
    assert btf["size"] == ctypes.sizeof(mirror), f"{name}: size"
    c_members = [(m["name"], m["bits_offset"] // 8) for m in btf["members"]]
    py_members = [(f[0], getattr(mirror, f[0]).offset) for f in mirror._fields_]
    assert c_members == py_members


def test_decoder_formats_cover_whole_structs() -> None:
    for cls in layout.STRUCTS.values():
        assert layout.struct_of(cls).size == ctypes.sizeof(cls)


def test_every_ladder_program_exists_in_the_object() -> None:
    from tracer.bpf.libbpf import BpfObject

    obj = BpfObject(hooks.object_path())
    try:
        names = {p.name for p in obj.programs()}
    finally:
        obj.close()
    wanted = {p for ladder in hooks.LADDERS.values() for _, progs in ladder for p in progs}
    assert wanted <= names, wanted - names


def test_every_gpu_program_exists_in_the_gpu_object(
    gpu_structs: dict[str, dict[str, Any]] | None,
) -> None:
    from tracer.bpf.libbpf import BpfObject

    if gpu_structs is None:
        pytest.skip(GPU_MISSING)

    obj = BpfObject(gpuhooks.object_path())
    try:
        names = {p.name: p.section for p in obj.programs()}
    finally:
        obj.close()
    for entry, ret in gpuhooks.PROGRAMS.values():
        assert entry is not None or ret is not None
        if entry is not None:
            assert names.get(entry) == "uprobe", entry
        if ret is not None:
            assert names.get(ret) == "uretprobe", ret
    for name in gpuhooks.HOLD_PROGRAMS:
        assert names.get(name) == "tracepoint/syscalls/sys_enter_mmap", name
    # the type numbers the decoder registers are the ones the C enum has
    enums = _dump_enums(gpuhooks.object_path())
    assert enums["wr_gpu_event_type"] == {
        "WR_EV_GPU_ALLOC_FAIL": layout.EV_GPU_ALLOC_FAIL,
        "WR_EV_GPU_ALLOC_RECOVERED": layout.EV_GPU_ALLOC_RECOVERED,
        "WR_EV_GPU_CALL_FAIL": layout.EV_GPU_CALL_FAIL,
    }
    funcs = enums["wr_gpu_func"]
    assert {v: k for k, v in funcs.items()}.keys() == layout.GPU_FUNCS.keys()


def test_main_object_enums_match_the_python_numbers() -> None:
    """Event types, stall kinds and rungs: the numbers the decoder reads are the C enums'."""
    enums = _dump_enums(hooks.object_path())
    assert enums["wr_event_type"] == {
        "WR_EV_EXIT": layout.EV_EXIT,
        "WR_EV_SIGNAL": layout.EV_SIGNAL,
        "WR_EV_OOM": layout.EV_OOM,
        "WR_EV_FORK": layout.EV_FORK,
        "WR_EV_EXEC": layout.EV_EXEC,
        "WR_EV_STALL": layout.EV_STALL,
        "WR_EV_CGROUP_MKDIR": layout.EV_CGROUP_MKDIR,
    }
    assert enums["wr_stall_kind"] == {
        f"WR_STALL_{name.upper()}": n for n, name in layout.STALL_KINDS.items()
    }
    assert enums["wr_rung"] == {
        f"WR_RUNG_{name.upper()}": n
        for n, name in layout.RUNG_NAMES.items()
        if n != layout.RUNG_UPROBE  # (a #define beside the enum: gpu.bpf.o's rung)
    }


def test_kernel_function_is_found_in_btf_names_then_in_kallsyms(tmp_path: Any) -> None:
    btf = tmp_path / "vmlinux"
    btf.write_bytes(b"\x9f\xeb\x01\x00...\0int\0__mem_cgroup_handle_over_high\0nr_pages\0")
    syms = tmp_path / "kallsyms"
    syms.write_text("ffffffff81000000 T mem_cgroup_handle_over_high\nffffffff81000100 t other_fn\n")
    names = hooks.HIGH_HANDLERS
    assert hooks.kernel_function(names, str(btf), str(syms)) == "__mem_cgroup_handle_over_high"
    # no BTF: kallsyms answers (only whole names: "nr_pages" is no function there)
    missing = str(tmp_path / "none")
    assert hooks.kernel_function(names, missing, str(syms)) == "mem_cgroup_handle_over_high"
    assert hooks.kernel_function(("other_fn",), missing, str(syms)) == "other_fn"
    assert hooks.kernel_function(("handle_over_high",), str(btf), str(syms)) is None
    assert hooks.kernel_function(names, missing, missing) is None


def test_signal_count_slots_match_events_h() -> None:
    header = (Path(__file__).resolve().parent.parent / "bpf" / "events.h").read_text()
    m = re.search(r"#define WR_SIG_SLOTS (\d+)", header)
    assert m is not None and int(m.group(1)) == layout.SIG_SLOTS
