"""The agent section's container phase (issue 31 item 2): --agent-containers starts of a podman
image whose layer carries a libcuda.so.1, one after the other, each program failing cuInit
once. Every start is a new overlay mount of the same real file: the agent must probe it once
(one set of uprobes, its descriptor count flat) and record each failing call once.

The image is the tests' (tests/gpu/build.py cuda_rootfs: the stand-in driver and a program
linked against it, in a busybox rootfs imported with podman), built here."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from bench.procs import say
from tracer.events import GpuCallFailure
from tracer.trace.reader import TraceReader

Result = dict[str, Any]
PROGRAM = "wrbench-cuda"  # its comm tells its records from any other process's on the host
NO_DEVICE = 3  # the program's exit when cuInit fails (CUDA_ERROR_NO_DEVICE: 100)
# "flat": the later starts' maximum within this of the earlier starts' (a descriptor leaked
# per start would add one per start)
FLAT_FDS = 8


def missing() -> str | None:
    """Why the phase cannot run here, or None."""
    from tests.gpu import build
    from tests.podmanimg import BUSYBOX

    if shutil.which("podman") is None or shutil.which("runc") is None:
        return "podman and runc are not installed (scripts/setup installs them)"
    if not os.path.exists(BUSYBOX):
        return "busybox-static is not installed (scripts/setup installs it)"
    if build.gcc() is None:
        return "no C compiler (gcc) to build the stand-in driver"
    return None


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def run(starts: int, tmp: Path, agent_pid: int) -> Result:
    """Start the image ``starts`` times beside the agent; its descriptors after each start."""
    from tests import podmanimg
    from tests.gpu import build

    why = missing()
    if why is not None:
        return {"skipped": why}
    image = f"localhost/wrbench-cuda-{uuid.uuid4().hex[:8]}"
    root = tmp / "cuda-rootfs"
    root.mkdir()
    fds = [_fds(agent_pid)]
    codes: dict[int, int] = {}
    with podmanimg.busybox_image(
        root, image, ("sh",), prepare=lambda: build.cuda_rootfs(root, tmp, PROGRAM)
    ):
        for i in range(starts):
            r = podmanimg.run_failing_cuinit(image, PROGRAM)
            codes[r.returncode] = codes.get(r.returncode, 0) + 1
            fds.append(_fds(agent_pid))
            if (i + 1) % 50 == 0:
                say(f"agent: {i + 1}/{starts} container starts, agent fds {fds[-1]}")
    return {
        "starts": starts,
        "failed_as_expected": codes.get(NO_DEVICE, 0),
        "exit_codes": {str(k): v for k, v in codes.items()},
        "fds_before": fds[0],
        "fds_after_first": fds[1] if len(fds) > 1 else None,
        "fds_last": fds[-1],
        "fds_max": max(fds),
        # the descriptors move with what else the agent has open at that moment (a
        # container's cgroup files, the runtime's event stream): growth shows as a higher
        # maximum over the later starts than over the earlier ones
        "fds_max_first_half": max(fds[1 : 1 + starts // 2]),
        "fds_max_second_half": max(fds[1 + starts // 2 :]),
    }


def count(state: Path, res: Result) -> None:
    """The agent's records of the programs' failing calls (read after it stopped)."""
    calls = pids = 0
    seen: set[int] = set()
    for path in sorted((state / "segments").iterdir()):
        with TraceReader(str(path)) as reader:
            for ev in reader:
                if isinstance(ev, GpuCallFailure) and ev.comm == PROGRAM:
                    calls += 1
                    seen.add(ev.pid)
    pids = len(seen)
    res.update(call_records=calls, call_pids=pids)


def row(res: Result) -> str:
    """The README table's row."""
    if "fds_last" not in res:
        return f"| {res.get('starts', '?')} container starts with a libcuda | " + (
            f"{res.get('skipped') or res.get('error', 'failed')} | - | - |"
        )
    flat = res["fds_max_second_half"] <= res["fds_max_first_half"] + FLAT_FDS
    return (
        f"| {res['starts']} container starts of an image carrying a libcuda, each failing "
        f"cuInit once | agent fds {res['fds_before']} before, {res['fds_after_first']} after "
        f"the first, at most {res['fds_max_first_half']} over the first half and "
        f"{res['fds_max_second_half']} over the second, {res['fds_last']} after the last; "
        f"{res.get('call_records', '?')} call-failure records for "
        f"{res['failed_as_expected']} failing starts ({res.get('call_pids', '?')} processes) "
        f"| - | fds flat, one record per call: "
        f"{'met' if flat and res.get('call_records') == res['failed_as_expected'] else 'NOT met'} |"
    )
