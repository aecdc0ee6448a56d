"""Builds tests/mt/mtwork.c (the multi-threaded workload of the exactness tests) with gcc."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def gcc() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def mtwork(out: Path, *, static: bool = False) -> Path:
    """The program; ``static``: linked statically, to run in a container image that has no C
    library (the busybox images of the podman and Docker tests; its gpu modes are not for it)."""
    cc = gcc()
    if cc is None:
        raise RuntimeError("no C compiler")
    path = out / "mtwork"
    src = str(HERE / "mtwork.c")
    flags = ["-static"] if static else []
    args = [cc, "-O1", "-pthread", *flags, "-o", str(path), src, "-ldl"]
    subprocess.run(args, check=True, capture_output=True)
    return path
