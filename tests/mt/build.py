"""Builds tests/mt/mtwork.c (the multi-threaded workload of the exactness tests) with gcc."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def gcc() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def mtwork(out: Path) -> Path:
    cc = gcc()
    if cc is None:
        raise RuntimeError("no C compiler")
    path = out / "mtwork"
    src = str(HERE / "mtwork.c")
    subprocess.run([cc, "-O1", "-pthread", "-o", str(path), src], check=True, capture_output=True)
    return path
