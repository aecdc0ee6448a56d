"""The built-in reproduction that ``scripts/demo`` records: three ways for a process to end.

1. a Python memory hog in a fresh child memory cgroup limited to 64 MiB (a real cgroup OOM kill),
2. a process that exits with code 3,
3. a sleeper killed with SIGTERM by another process (``kill``).

Run it under the recorder (``whyrestart record -o demo.trace -- python -m tracer.demo``) as root;
the cgroup is created under the caller's own memory cgroup and removed afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup

LIMIT = 64 * 1024 * 1024
# Writes every page it allocates (b"x" * n), so the memory is really charged to the cgroup.
HOG = "chunks = []\nwhile True:\n    chunks.append(b'x' * (1 << 20))\n"


def run_hog(cgroup_procs: str) -> int:
    def enter_cgroup() -> None:
        # move this (child) process into the cgroup before exec: nothing escapes the limit
        with open(cgroup_procs, "w") as f:
            f.write("0")

    hog = subprocess.Popen([sys.executable, "-c", HOG], preexec_fn=enter_cgroup)
    return hog.wait()


def main() -> int:
    layout = CgroupLayout.from_system()
    parent = own_memory_cgroup(layout=layout)
    name = f"whyrestart-demo-{os.getpid()}"
    print(
        f"demo: 1/3 a memory hog in {parent.rstrip('/')}/{name} limited to 64 MiB", file=sys.stderr
    )
    with ChildCgroup(parent, name, LIMIT, layout=layout) as cg:
        rc = run_hog(cg.procs_file)
    print(f"demo:     the hog ended with status {rc}", file=sys.stderr)

    print("demo: 2/3 a process that exits with code 3", file=sys.stderr)
    subprocess.run(["sh", "-c", "exit 3"], check=False)

    print("demo: 3/3 a sleeper killed with SIGTERM by another process", file=sys.stderr)
    sleeper = subprocess.Popen(["sleep", "300"])
    time.sleep(0.2)
    subprocess.run(["kill", "-TERM", str(sleeper.pid)], check=True)
    sleeper.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
