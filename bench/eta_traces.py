"""Records the traces the eta section scores (root):
``python -m bench.eta_traces OUT_DIR [NAME ...]``.

Each scenario runs under ``whyrestart record`` in a child memory cgroup of this process's own,
with its limit; ``*_oom`` ones grow until the OOM killer takes them, ``*_ok`` ones end without
an OOM kill. The ``eta_llama_*`` ones run llama.cpp's real llama-server (llm/load.py, built by
scripts/build-llama) with the generated model. The traces in tests/data/eta_*.trace.zst were
recorded with it (cgroup v1, kernel 6.18, the development VM).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from llm.server import PROMPT_CACHE_LIMIT, Built, built, charged_here, private_copy
from tests.workloads import cache_churn, in_cgroup
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]


def grow(rate_mib: float, step_mib: int = 1) -> str:
    """Anonymous memory, ``step_mib`` at a time, at ``rate_mib`` MiB/s, until killed."""
    return (
        "import time\nchunks = []\nstart = time.monotonic()\nwhile True:\n"
        f"    chunks.append(bytearray(b'x' * ({step_mib} << 20)))\n"
        f"    time.sleep(max(0.0, start + len(chunks) * {step_mib} / {rate_mib}"
        " - time.monotonic()))\n"
    )


# a startup: 150 MiB at once (a model's weights copied into memory), then serving, flat
RAMP = "import time\nchunks = [bytearray(b'x' * (1 << 20)) for _ in range(150)]\ntime.sleep(35)\n"
# a steady server: 80 MiB, plus 0-8 MiB of requests in flight, for 40 s
STEADY = (
    "import random, time\nbase = [bytearray(b'x' * (1 << 20)) for _ in range(80)]\nextra = []\n"
    "end = time.monotonic() + 40\nwhile time.monotonic() < end:\n"
    "    if extra and random.random() < 0.5:\n        extra.pop()\n"
    "    elif len(extra) < 8:\n        extra.append(bytearray(b'x' * (1 << 20)))\n"
    "    time.sleep(0.2)\n"
)


def leak_over_cache(rate_mib: float) -> str:
    """A leak of ``rate_mib`` MiB/s while the program keeps re-reading a 160 MiB file (argv[1],
    on disk): the cgroup is full of page cache the kernel can drop, the anon is what kills."""
    return (
        "import os, sys, time\npath = sys.argv[1]\nwith open(path, 'wb') as f:\n"
        "    for _ in range(160):\n        f.write(os.urandom(1 << 20))\n"
        "chunks = []\nstart = time.monotonic()\nf = open(path, 'rb')\nos.unlink(path)\n"
        "while True:\n    chunks.append(bytearray(b'x' * (1 << 20)))\n"
        "    if not f.read(8 << 20):\n        f.seek(0)\n"
        f"    time.sleep(max(0.0, start + len(chunks) / {rate_mib} - time.monotonic()))\n"
    )


def restarted(runs: int, rate_mib: float) -> str:
    """A supervisor (in the same cgroup) that restarts a leak of ``rate_mib`` MiB/s each time it
    is killed, ``runs`` times, a second apart: a crash loop, each run warned about anew."""
    return (
        "import subprocess, sys, time\n"
        f"for _ in range({runs}):\n"
        f"    subprocess.run([sys.executable, '-c', {grow(rate_mib)!r}])\n"
        "    time.sleep(1)\n"
    )


def scenarios(cache_file: str, llama: Built, copy: Path) -> dict[str, tuple[int, list[str]]]:
    """Each scenario's limit and its Python's arguments. ``copy``: where the scenarios in
    MODEL_COPY find a copy of the model out of the page cache (charged to their own cgroup)."""
    server = [str(llama.binary), str(llama.model)]
    copied = [str(llama.binary), str(copy)]
    return {
        "eta_leak8_oom": (256 * MiB, ["-c", grow(8)]),
        "eta_leak3_oom": (160 * MiB, ["-c", grow(3)]),
        "eta_steps_oom": (384 * MiB, ["-c", grow(12, 24)]),
        "eta_leak5_cache_oom": (256 * MiB, ["-c", leak_over_cache(5), cache_file]),
        "eta_ramp_ok": (256 * MiB, ["-c", RAMP]),
        "eta_steady_ok": (256 * MiB, ["-c", STEADY]),
        "eta_cache_ok": (64 * MiB, ["-c", cache_churn(40), cache_file]),  # page cache on disk
        "eta_restarts_leak4_oom": (160 * MiB, ["-c", restarted(3, 4)]),
        # waves of 4 long prompts kept by llama-server's prompt cache, one every 8 s, +32-65 MiB
        # a wave, until one is OOM-killed (llm.server.PROMPT_CACHE_ARGS; as in
        # tests/test_llama_prompt_cache_root.py)
        "eta_llama_waves_oom": (PROMPT_CACHE_LIMIT, ["-m", "llm.load", "waves", "120", *server]),
        # serving short completions for 40 s, ~130 MiB of anon, well under its limit
        "eta_llama_steady_ok": (512 * MiB, ["-m", "llm.load", "steady", "40", *server]),
        # its weights (272 MiB) mapped and charged to it under 200 MiB: the page cache fills the
        # limit and is re-read from disk, its anon stays flat (tests/test_llama_thrash_root.py);
        # 20 s: at its limit it is sampled every 50 ms
        "eta_llama_mapped_ok": (200 * MiB, ["-m", "llm.load", "steady", "20", *copied]),
    }


MODEL_COPY = {"eta_llama_mapped_ok"}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    llama = built()
    charged_here(llama.model)  # the shared model's pages charged here, not to a server's cgroup
    scratch = Path(f"/var/tmp/wr-eta-model-{os.getpid()}")
    scen = scenarios(f"/var/tmp/wr-eta-cache-{os.getpid()}", llama, scratch / llama.model.name)
    layout = CgroupLayout.from_system()
    parent = own_memory_cgroup(layout=layout)
    for name in argv[1:] or list(scen):
        limit, args = scen[name]
        if name in MODEL_COPY:
            scratch.mkdir(exist_ok=True)
            private_copy(llama.model, scratch)
        with ChildCgroup(parent, f"wr-eta-{name}-{os.getpid()}", limit, layout=layout) as cg:
            trace = out / f"{name}.trace.zst"
            cmd = [sys.executable, "-m", "tracer.cli", "record", "-q", "-o", str(trace), "--"]
            r = subprocess.run(
                [*cmd, *in_cgroup(cg, sys.executable, *args)],
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        shutil.rmtree(scratch, ignore_errors=True)
        print(name, r.returncode, r.stderr[-300:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
