"""Tier 3 (root, real kernel): a shortened soak of the recorder (the full one is
``scripts/bench soak``).

A command forks and reaps ~1,000 short-lived children a second for ~15 s while a `Recorder`
records it in a thread of this very process; the main thread samples this process's resident
memory every 0.5 s. Nothing may be lost, every exit must be in the trace, and memory must not
keep growing once the recorder has warmed up: a memory assertion, not a timing one.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from tracer.events import Exit, Fork
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.trace.reader import read_trace

pytestmark = pytest.mark.root

MiB = 1024 * 1024
RATE = 1000  # exits per second
SECONDS = 15.0
MAX_GROWTH = 20 * MiB  # RSS growth allowed from the 25% mark to the end

# Forks RATE children a second, in batches of 10 on an absolute schedule; each _exit(0)s at once.
# Writes "PID CHILDREN" to argv[1] at the end: the exact count the trace must hold.
STORM = """
import os, sys, time
out, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
made = 0
start = time.monotonic()
while time.monotonic() - start < seconds:
    pids = []
    for _ in range(10):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    made += len(pids)
    delay = start + made / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)
with open(out, "w") as f:
    f.write(f"{os.getpid()} {made}\\n")
"""


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_soak_no_loss_exact_exits_flat_memory(tmp_path: Path) -> None:
    made_file = tmp_path / "made"
    argv = [sys.executable, "-c", STORM, str(made_file), str(RATE), str(SECONDS)]
    rec = Recorder(str(tmp_path / "soak.trace"), Targets(command=argv), duration=SECONDS + 30)
    results: list[RecordResult] = []
    errors: list[BaseException] = []

    def record() -> None:
        try:
            results.append(rec.run())
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)

    thread = threading.Thread(target=record, name="recorder")
    samples: list[int] = []
    thread.start()
    try:
        while thread.is_alive():
            samples.append(rss_bytes())
            thread.join(0.5)
    finally:
        rec.stop.set("test over")  # (a no-op once it stopped by itself)
        thread.join(30)
    if errors:
        raise errors[0]
    [res] = results
    assert res.reason == "command exited", res.reason

    storm_pid, made = (int(x) for x in made_file.read_text().split())
    assert made >= RATE * SECONDS / 2, f"the storm made only {made} children"
    assert res.lost == 0
    trace = read_trace(str(tmp_path / "soak.trace"))
    assert trace.footer is not None and trace.footer.lost == 0
    exits = sum(1 for e in trace.events if isinstance(e, Exit) and e.ppid == storm_pid)
    forks = sum(1 for e in trace.events if isinstance(e, Fork) and e.parent_pid == storm_pid)
    assert exits == made
    assert forks == made

    assert len(samples) >= 8, samples
    quarter, end = samples[len(samples) // 4], samples[-1]
    growth = end - quarter
    assert growth < MAX_GROWTH, (
        f"RSS grew {growth / MiB:.1f} MiB from the 25% mark to the end "
        f"({quarter / MiB:.1f} -> {end / MiB:.1f} MiB; samples every 0.5 s: "
        f"{[round(s / MiB, 1) for s in samples]})"
    )
