"""whyrestart as an unprivileged user runs it, from any checkout.

The tests that run whyrestart as ``nobody`` cannot use the checkout's virtualenv when the
checkout sits below a directory only root can enter (root's 0700 home, ``mktemp -d``): nobody
cannot even start its interpreter. So they get what an installed copy would be: the ``tracer``
package and its run-time dependencies copied into a world-readable directory, run by the system
interpreter the virtualenv was made from (world-executable, as it is in /usr/bin)."""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# tracer's own dependencies (pyproject.toml's [project] dependencies), by import name, and its
# zstd extra (compressed traces: the agent's incidents)
RUNTIME = (
    "tracer",
    "click",
    "orjson",
    "msgspec",
    "psutil",
    "pynvml",
    "prometheus_client",
    "zstandard",
)


@contextmanager
def unprivileged_whyrestart() -> Iterator[tuple[list[str], dict[str, str]]]:
    """(argv prefix, environment) that run ``whyrestart`` as any user can, from a copy that
    is removed afterwards."""
    top = Path(tempfile.mkdtemp(prefix="wr-nobody-"))
    try:
        top.chmod(0o755)
        lib = top / "lib"
        lib.mkdir()
        for name in RUNTIME:
            mod = importlib.import_module(name)
            src = Path(mod.__file__ or "")
            if src.name == "__init__.py":
                shutil.copytree(
                    src.parent, lib / name, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:  # a single-module distribution (pynvml.py) or a compiled one (orjson)
                for f in src.parent.glob(f"{name}*"):
                    copy = shutil.copytree if f.is_dir() else shutil.copy2
                    copy(f, lib / f.name)
        for d, _, files in os.walk(top):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(lib), "PYTHONNOUSERSITE": "1"}
        yield [os.path.realpath(sys.executable), "-m", "tracer.cli"], env
    finally:
        shutil.rmtree(top, ignore_errors=True)
