"""Builds the GPU stand-ins of tests/gpu/*.c with gcc into a directory (a test's tmp dir).

``libcuda.so.1`` (fake_cuda.c), ``libnvidia-ml.so.1`` (fake_nvml.c) and the ``workload`` program
(workload.c). Tests that need them skip with the reason when gcc is missing.
"""

from __future__ import annotations

import os
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


# -- the real libraries ---------------------------------------------------------------------------

ROOT = HERE.parent.parent
CUDA_CACHE = ROOT / ".cache" / "cuda"  # scripts/fetch-cuda (run by scripts/setup)


def real_libcuda_dir() -> Path | None:
    """The directory of Debian's real libcuda.so.1 that scripts/fetch-cuda unpacked, if any."""
    found = sorted(CUDA_CACHE.glob("libcuda1/usr/lib/*/nvidia/current/libcuda.so.1"))
    return found[0].parent if found else None


def why_no_real_libcuda() -> str:
    why = CUDA_CACHE / "why"
    reason = why.read_text().strip() if why.exists() else "scripts/fetch-cuda was not run"
    return f"the real libcuda.so.1 is not here ({reason}): run scripts/setup"


def cudart_dir() -> Path | None:
    """lib/ of PyPI's nvidia-cuda-runtime-cu12 (the dev extra), holding libcudart.so.12."""
    try:
        import nvidia.cuda_runtime  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    for base in nvidia.cuda_runtime.__path__:
        lib = Path(base) / "lib"
        if (lib / "libcudart.so.12").exists():
            return lib
    return None


def driver_api(out: Path, libcuda_dir: Path) -> Path:
    path = out / "driver_api"
    src = str(HERE / "driver_api.c")
    _build(["-O1", "-o", str(path), src, "-L", str(libcuda_dir), "-l:libcuda.so.1"])
    return path


def runtime_api(out: Path, cudart: Path) -> Path:
    path = out / "runtime_api"
    src = str(HERE / "runtime_api.c")
    _build(["-O1", "-o", str(path), src, "-L", str(cudart), "-l:libcudart.so.12"])
    return path


def cuda_rootfs(root: Path, tmp: Path, program_name: str) -> None:
    """A container rootfs with the stand-in in /cuda and ``fast`` (linked against it) as
    /``program_name``, with the C library it needs copied from the host (no registry is
    reachable from here)."""
    lib = root / "cuda"
    lib.mkdir(parents=True)
    libcuda(lib)
    program = fast(tmp, lib)
    shutil.copy(program, root / program_name)
    ldd = subprocess.run(
        ["ldd", str(program)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LD_LIBRARY_PATH": str(lib)},
    )
    for line in ldd.stdout.splitlines():
        path = line.split("=>")[-1].split("(")[0].strip()
        if path.startswith("/") and "libcuda" not in path:
            dest = root / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dest)
