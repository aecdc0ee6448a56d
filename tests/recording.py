"""Recording while a test drives a workload (root tests of runtimes: podman, Docker).

The recordings run in the test's own process, so the recorder's self-guard (tracer/selfguard.py:
RLIMIT_DATA 1 GiB, oom_score_adj -900) would be the test process's while they run, and every
program the test starts meanwhile (podman, a container's conmon and the container itself, a
shell) would inherit it: a container whose 1.5 GiB allocation fails under the recorder's data
limit exits 1 instead of being OOM-killed. The recordings here run with it off (``PROFILE``);
tests/test_hardening_root.py checks the guard itself, on a recorder in a process of its own.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tracer.pipeline.assembly import INTERACTIVE
from tracer.pipeline.record import Recorder, RecordResult, Targets

PROFILE = dataclasses.replace(INTERACTIVE, self_guard=False)


def record(tmp_path: Path, argv: list[str], name: str = "t.trace") -> RecordResult:
    """Record ``argv`` run as the target command, to its end."""
    return Recorder(str(tmp_path / name), Targets(command=argv), duration=60, profile=PROFILE).run()


def record_while(
    tmp_path: Path,
    container: str,
    action: Callable[[], None],
    duration: float = 120,
    **targets: object,
) -> RecordResult:
    """Record --container while ``action`` drives it (no container: only ``targets``, a pod's
    ``cgroups`` as --pod gives them); stop once it is done (or after ``duration`` seconds)."""
    ready = threading.Event()
    containers = [container] if container else []
    rec = Recorder(
        str(tmp_path / "c.trace"),
        Targets(containers=containers, **targets),  # type: ignore[arg-type]
        duration=duration,
        on_ready=ready.set,
        profile=PROFILE,
    )
    out: dict[str, RecordResult] = {}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out["res"] = rec.run()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    try:
        while not ready.wait(0.05) and t.is_alive():  # attached, every source reading
            pass
        if ready.is_set():
            action()
            time.sleep(1.5)  # let the last exit settle
    finally:
        rec.stop.set("test done")
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return out["res"]


def wait_for(pred: Callable[[], bool], seconds: float = 60, what: str = "condition") -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached in {seconds:g} s")
