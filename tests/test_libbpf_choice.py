"""Tier 1 (no root): which libbpf the loader takes and where the CO-RE objects are looked for.

The wheel bundles a libbpf (tracer/bpf/_bundled/libbpf.so.1, scripts/build); a checkout uses the
system's. Loading a shared library with ctypes needs no privilege, so this runs anywhere the
system libbpf (scripts/setup installs it) is.
"""

from __future__ import annotations

import ctypes.util
import os
from pathlib import Path

import pytest

from tracer.bpf import libbpf, objects
from tracer.errors import KernelUnsupported


def _system_libbpf() -> str:
    found = ctypes.util.find_library("bpf")
    if found is None:
        pytest.skip("no system libbpf (scripts/setup installs libbpf1)")
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu"):
        if os.path.exists(os.path.join(d, found)):
            return os.path.realpath(os.path.join(d, found))
    pytest.skip(f"{found} found by ldconfig but not in a known directory")


def test_a_bundled_libbpf_is_taken_by_its_path() -> None:
    path = _system_libbpf()  # any real libbpf file serves as "the bundled one"
    lib = libbpf._Lib(bundled=path)
    assert (lib.origin, lib.path) == ("bundled", path)
    assert lib.version.startswith("1.")
    assert lib.describe() == f"{lib.version}, bundled ({path})"


def test_without_a_bundled_libbpf_the_system_one_is_used(tmp_path: Path) -> None:
    _system_libbpf()
    lib = libbpf._Lib(bundled=str(tmp_path / "libbpf.so.1"))
    assert lib.origin == "system"
    assert lib.describe().startswith(f"{lib.version}, system (")


def test_a_bundled_libbpf_that_does_not_load_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    broken = tmp_path / "libbpf.so.1"
    broken.write_bytes(b"not an ELF file")
    with pytest.raises(KernelUnsupported, match="the bundled libbpf does not load") as err:
        libbpf._Lib(bundled=str(broken))
    assert "reinstall the whyrestart wheel" in str(err.value)


def test_objects_checkout_first_then_bundled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout, bundled = tmp_path / "bpf", tmp_path / "_bundled"
    checkout.mkdir()
    bundled.mkdir()
    monkeypatch.setattr(objects, "CHECKOUT_DIR", str(checkout))
    monkeypatch.setattr(objects, "BUNDLED_DIR", str(bundled))
    # neither: the checkout's path, which doctor reports missing
    assert objects.default_object("x.bpf.o") == str(checkout / "x.bpf.o")
    (bundled / "x.bpf.o").write_bytes(b"")
    assert objects.default_object("x.bpf.o") == str(bundled / "x.bpf.o")  # an installed wheel
    (checkout / "x.bpf.o").write_bytes(b"")
    assert objects.default_object("x.bpf.o") == str(checkout / "x.bpf.o")  # a fresh build wins


def test_a_second_libbpf_handle_that_is_collected_leaves_libbpf_working() -> None:
    """libbpf's print hook is process-wide: a _Lib over the same file (as the tests above make)
    that is garbage-collected must not leave libbpf calling freed memory at its next message
    (this segfaulted the next bpf_object__open_file of the test run)."""
    import gc

    from tracer.bpf import hooks

    if not os.path.exists(hooks.object_path()):
        pytest.skip(f"BPF object not built ({hooks.object_path()}): run scripts/setup")
    libbpf.lib()
    other = libbpf._Lib(bundled=_system_libbpf())
    del other
    gc.collect()
    obj = libbpf.BpfObject(hooks.object_path())  # libbpf logs while it opens
    obj.close()
    assert isinstance(libbpf.lib().take_log(), list)
