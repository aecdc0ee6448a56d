"""Builds the GPU stand-ins of tests/gpu/*.c with gcc into a directory (a test's tmp dir).

``libcuda.so.1`` (fake_cuda.c), ``libnvidia-ml.so.1`` (fake_nvml.c) and the ``workload`` program
(workload.c). Tests that need them skip with the reason when gcc is missing.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def gcc() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def _build(args: list[str]) -> None:
    cc = gcc()
    if cc is None:
        raise RuntimeError("no C compiler")
    subprocess.run([cc, *args], check=True, capture_output=True, text=True)


def libcuda(out: Path, *defines: str) -> Path:
    """The stand-in driver library (``defines``: its variants, see fake_cuda.c). -fno-ipa-icf:
    twins with identical bodies keep their own addresses, as in the real library."""
    path = out / "libcuda.so.1"
    flags = [f"-D{d}" for d in defines]
    src = str(HERE / "fake_cuda.c")
    _build(["-shared", "-fPIC", "-O2", "-fno-ipa-icf", *flags, "-o", str(path), src])
    return path


def nvml(out: Path) -> Path:
    path = out / "libnvidia-ml.so.1"
    _build(["-shared", "-fPIC", "-O2", "-o", str(path), str(HERE / "fake_nvml.c")])
    return path


def workload(out: Path) -> Path:
    path = out / "workload"
    _build(["-O1", "-o", str(path), str(HERE / "workload.c"), "-ldl"])
    return path


def fast(out: Path, libcuda_dir: Path) -> Path:
    """fast.c linked against the stand-in in ``libcuda_dir`` (DT_NEEDED libcuda.so.1): it runs
    with LD_LIBRARY_PATH=libcuda_dir, as a user's program does."""
    path = out / "fast"
    src = str(HERE / "fast.c")
    _build(["-O1", "-o", str(path), src, "-L", str(libcuda_dir), "-l:libcuda.so.1"])
    return path
