"""Tier 2: every struct in bpf/events.h matches its Python mirror, checked against the BTF of
the compiled object (the way Tetragon's alignment checker does)."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from typing import Any

import pytest

from tracer.bpf import hooks, layout

pytestmark = pytest.mark.bpfobj


@pytest.fixture(scope="module")
def btf_structs() -> dict[str, dict[str, Any]]:
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    out = subprocess.run(
        [bpftool, "-j", "btf", "dump", "file", hooks.object_path()],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    types = json.loads(out)["types"]
    return {t["name"]: t for t in types if t.get("kind") == "STRUCT" and t.get("name")}


@pytest.mark.parametrize("name", sorted(layout.STRUCTS))
def test_struct_matches_btf(name: str, btf_structs: dict[str, dict[str, Any]]) -> None:
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
