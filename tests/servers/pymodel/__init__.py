"""A multi-worker Python model server: gunicorn's master with uvicorn workers (the
``uvicorn-worker`` package) serving a plain ASGI app (app.py) whose model is a weights file
it maps with numpy.memmap. gunicorn's master respawns a dead worker, as the model servers of
issue 29 do; with ``exit_on_worker_death`` it exits 1 instead (gunicorn_conf.py), as vLLM's
API server does when its engine core dies ("Failed core proc(s)", vllm#45626).

``weights(path)`` writes the model (deterministic from a seed) and evicts it from the page
cache, so the server's own reads fault it in and its memory cgroup is charged for it, as for
a model file fresh on disk; ``command(...)`` is the server's command line and environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MiB = 1024 * 1024
DIM = 1024  # float32 columns: a row is 4 KiB, one page
WEIGHTS_MIB = 96
SEED = 29


def weights(path: Path, mib: int = WEIGHTS_MIB, seed: int = SEED) -> Path:
    """The model file at ``path``: ``mib`` MiB of float32 from ``seed`` (the same bytes every
    time), written once and kept, and dropped from the page cache."""
    want = mib * MiB
    if not path.exists() or path.stat().st_size != want:
        rng = np.random.default_rng(seed)
        tmp = path.with_name(path.name + ".part")
        with open(tmp, "wb") as f:
            for _ in range(mib):
                f.write(rng.standard_normal(MiB // 4, dtype=np.float32).tobytes())
        os.replace(tmp, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # (dirty pages are not dropped)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


def gunicorn() -> str:
    """The gunicorn script of this Python's environment (its processes are named gunicorn)."""
    return str(Path(sys.executable).parent / "gunicorn")


def command(
    port: int,
    model: Path,
    workers: int = 2,
    exit_on_worker_death: bool = False,
    load_s: float = 0.0,
) -> tuple[list[str], dict[str, str]]:
    """The server's argv and environment: listening on 127.0.0.1:``port``, serving ``model``
    with ``workers`` workers; ``load_s``: seconds each worker waits before it maps the model
    (a slow disk: /health answers 503 meanwhile)."""
    env = {
        **os.environ,
        "PYMODEL_PORT": str(port),
        "PYMODEL_WEIGHTS": str(model),
        "PYMODEL_WORKERS": str(workers),
        "PYMODEL_EXIT_ON_WORKER_DEATH": "1" if exit_on_worker_death else "0",
        "PYMODEL_LOAD_S": str(load_s),
    }
    argv = [gunicorn(), "-c", str(HERE / "gunicorn_conf.py"), "--chdir", str(HERE), "app:app"]
    return argv, env
