"""The llama.cpp case that ``scripts/demo`` records after the built-in reproduction: the real
``llama-server`` loading the generated 272 MiB model without mmap (``--load-mode none``: the
weights are read into buffers, every page charged to the cgroup) in a fresh child memory
cgroup limited to half the model's size. The kernel OOM-kills it while it loads; its /health
answered 503 (loading) all along, never 200.

    python -m llm.demo --prepare       # builds what is missing; prints BINARY MODEL PORT
    whyrestart record --probe http://127.0.0.1:PORT/health -o llama.trace -- \\
        python -m llm.demo --binary BINARY --model MODEL --port PORT

Run it as root; the cgroup is made under the caller's own memory cgroup and removed afterwards,
so the machine's memory is never at stake: only the cgroup's limit is reached.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from llm.server import BuildFailed, argv, built, free_port, status_of
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup

MiB = 1 << 20
WAIT_S = 120.0  # a load that neither ends nor answers healthy by then is stopped


def say(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


def prepare() -> int:
    """Build llama-server and write the model if they are missing (the build: about 13 minutes
    on 2 cores the first time, then cached); print the binary, the model and a free port."""
    try:
        b = built(quiet=False)
    except BuildFailed as exc:
        say(f"llama-server could not be built: {exc}")
        return 1
    print(b.binary, b.model, free_port())
    return 0


def run(binary: Path, model: Path, port: int) -> int:
    size = model.stat().st_size
    limit = size // 2 // MiB * MiB
    layout = CgroupLayout.from_system()
    parent = own_memory_cgroup(layout=layout)
    name = f"whyrestart-llama-{os.getpid()}"
    say(
        f"llama-server loading a {size / MiB:.1f} MiB model without mmap (--load-mode none) in "
        f"{parent.rstrip('/')}/{name} limited to {limit / MiB:.0f} MiB"
    )
    url = f"http://127.0.0.1:{port}/health"
    seen: dict[int, int] = {}
    with ChildCgroup(parent, name, limit, layout=layout) as cg:

        def enter_cgroup() -> None:
            # this (child) process joins the cgroup before exec: nothing escapes the limit
            with open(cg.procs_file, "w") as f:
                f.write("0")

        server = subprocess.Popen(
            argv(binary, model, port, "--load-mode", "none"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=enter_cgroup,
        )
        t0 = time.monotonic()
        while server.poll() is None:
            status = status_of(url, 0.5)
            seen[status] = seen.get(status, 0) + 1
            if status == 200 or time.monotonic() - t0 > WAIT_S:
                server.terminate()  # it loaded after all (a host with a different build)
                break
            time.sleep(0.05)
        rc = server.wait()
    answers = ", ".join(f"{k or 'no answer'} x{n}" for k, n in sorted(seen.items()))
    say(f"llama-server ended with status {rc} after {time.monotonic() - t0:.1f} s")
    say(f"its /health answered: {answers or 'never polled'}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--prepare", action="store_true")
    ap.add_argument("--binary", type=Path)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--port", type=int)
    a = ap.parse_args()
    if a.prepare:
        return prepare()
    if a.binary is None or a.model is None or a.port is None:
        ap.error("--binary, --model and --port are needed (or --prepare)")
    return run(a.binary, a.model, a.port)


if __name__ == "__main__":
    sys.exit(main())
