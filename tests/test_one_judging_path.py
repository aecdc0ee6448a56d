"""Tier 1: every output judges alike. replay --json, explain --json, report's verdict table and
export's verdict instants give the same cause and confidence for every exit of every trace in
tests/data, and of a ``--supervisor`` recording (written with the project's trace writer: a
watchdog pid given on the command line kills the service while its probes fail), whose header
is what makes the difference between a supervisor's probe kill and some process's kill.
"""

from __future__ import annotations

import html
import re
import signal
from collections import Counter
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from tests.streams import cgroup, execd, killed, probe, sent
from tests.streams import header as trace_header
from tracer.cli import main
from tracer.events import Event
from tracer.trace.writer import TraceWriter

DATA = Path(__file__).parent / "data"
WATCHDOG = 777

Judged = Counter[tuple[int, str, str]]  # (pid, cause, confidence) -> how many


def supervisor_trace(path: Path) -> Path:
    header = trace_header(targets={"pids": [100], "supervisor_pids": [WATCHDOG]})
    events: list[Event] = [
        cgroup(40, "/svc/model", 1 << 30),
        execd(0.1, 100, 40, "model"),
        probe(1.0, False, 1000, timed_out=True),
        probe(2.0, False, 1000, timed_out=True),
        probe(3.0, False, 1000, timed_out=True),
        sent(3.5, WATCHDOG, 100, signal.SIGKILL, comm="my-watchdog"),
        killed(3.5, 100, signal.SIGKILL, cg=40, start=0.1),
    ]
    w = TraceWriter.open(path, header)
    w.write_many(events)
    w.close(w.make_footer("command exited", ended_ns=5_000_000_000))
    return path


# Real recordings of this project's root tier on a v1 host (kernel 6.18), each of its command
# alone: cgroup OOMs (*_v1_oom, eta_*), a hand-written supervisor's kill after its server's
# /health timed out (probe_kill_supervisor: tests/test_supervisor_root.py's SERVER and
# SUPERVISOR under `record --probe --probe-interval 300ms --probe-timeout 300ms`) and a refused
# cuMemAlloc_v2 through the stand-in libcuda (gpu_oom_fake_libcuda: tests/gpu's `fast fail`
# with FAKE_CUDA_BUDGET_BYTES=1048576) and Debian's earlyoom 1.7 SIGTERMing a 200 MiB python
# (userspace_oom_earlyoom: `earlyoom -m 90 -s 100` beside it in a pid namespace of their own, so
# it could kill nothing else, on a host with 74% of its memory available: a real daemon's kill
# on a threshold set above the host's free memory, as a misconfigured one makes; a kill under
# real pressure, systemd-oomd's, is the lab VM's test). demo_v2_oom is scripts/demo's recording
# in the lab's Debian 12 VM (kernel 6.1, cgroup v2, the fentry rung): `scripts/lab-vm --kernel
# bookworm --exec 'whyrestart record -o ... -- python -m tracer.demo'`. What each is judged,
# exactly:
EXPECTED: dict[str, Judged] = {
    "demo_v2_oom.trace.zst": Counter(
        {
            (165, "cgroup_oom", "high"): 1,  # the demo's child, at its cgroup's memory.max
            (166, "app_exit", "high"): 1,
            (167, "signal_kill", "high"): 1,
            (168, "app_exit", "high"): 1,
            (164, "app_exit", "high"): 1,
        }
    ),
    "probe_kill_supervisor.trace.zst": Counter(
        {(16579, "probe_kill", "high"): 1, (16092, "app_exit", "high"): 1}
    ),
    "gpu_oom_fake_libcuda.trace.zst": Counter({(1733, "gpu_oom", "high"): 1}),
    "userspace_oom_earlyoom.trace.zst": Counter(
        {
            (9019, "userspace_oom", "high"): 1,  # python, by earlyoom (known by its executable)
            (9141, "signal_kill", "high"): 1,  # earlyoom, stopped by the shell that started it
            (9006, "app_exit", "high"): 1,
            (9018, "app_exit", "high"): 1,
            (9020, "app_exit", "high"): 1,
        }
    ),
}


def traces(tmp: Path) -> list[Path]:
    recorded = sorted([*DATA.glob("*.trace"), *DATA.glob("*.trace.zst")])
    return [*recorded, supervisor_trace(tmp / "supervisor.trace")]


def run(*args: str) -> str:
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 0, r.stderr
    return r.stdout


def from_replay(trace: Path) -> Judged:
    doc = orjson.loads(run("replay", "--json", str(trace)))
    return Counter((v["pid"], v["cause"], v["confidence"]) for v in doc["verdicts"])


def from_explain(trace: Path) -> Judged:
    doc = orjson.loads(run("explain", "--json", str(trace)))
    return Counter((v["pid"], v["cause"], v["confidence"]) for v in doc["verdicts"])


_ROW = re.compile(
    r"<tr><td>[^<]*</td><td>[^<]*</td><td class=num>(\d+)</td><td>[^<]*</td>"
    r"<td class='cause cause-[^']*'>([^<]*)</td><td>([^<]*)</td>"
)


def from_report(trace: Path, tmp: Path) -> Judged:
    out = tmp / f"{trace.stem}.html"
    run("report", str(trace), "-o", str(out))
    page = out.read_text()
    # the summary table, before the per-unit sections repeat its rows
    start = page.index("<h2 id=verdicts-summary>")
    table = page[start : page.index("</table>", start)]
    return Counter(
        (int(pid), html.unescape(cause), html.unescape(conf))
        for pid, cause, conf in _ROW.findall(table)
    )


def from_export(trace: Path, tmp: Path) -> Judged:
    out = tmp / f"{trace.stem}.perfetto.json"
    run("export", str(trace), "-o", str(out))
    doc = orjson.loads(out.read_bytes())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    got: Judged = Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "i" and name.startswith("verdict "):
            pid = int(name.rsplit(" ", 1)[1])
            got[(pid, e["args"]["cause"], e["args"]["confidence"])] += 1
    return got


def test_every_output_gives_the_same_cause_and_confidence_for_every_pid(tmp_path: Path) -> None:
    paths = traces(tmp_path)
    assert {p.name for p in paths} >= EXPECTED.keys()
    for trace in paths:
        replayed = from_replay(trace)
        assert replayed, f"{trace.name}: no verdicts"
        assert from_explain(trace) == replayed, trace.name
        assert from_report(trace, tmp_path) == replayed, trace.name
        assert from_export(trace, tmp_path) == replayed, trace.name


def test_the_supervisor_pid_in_the_header_is_honoured_by_every_output(tmp_path: Path) -> None:
    trace = supervisor_trace(tmp_path / "supervisor.trace")
    want: Judged = Counter({(100, "probe_kill", "high"): 1})
    assert from_replay(trace) == want
    assert from_report(trace, tmp_path) == want
    assert from_export(trace, tmp_path) == want


@pytest.mark.parametrize("name", ["demo_v1_oom", "nested_v1_oom", "reclaim_v1_oom"])
def test_each_checked_in_trace_has_a_kill_among_its_verdicts(name: str) -> None:
    causes = {cause for _, cause, _ in from_replay(DATA / f"{name}.trace")}
    assert "cgroup_oom" in causes


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_probe_gpu_and_userspace_trace_is_judged_as_it_was_checked_in(
    name: str, tmp_path: Path
) -> None:
    """The probe kill, the GPU OOM and the user-space OOM keep their cause and confidence, pid by
    pid, in replay and report alike (the supervisor itself exits 0 after its kill: app_exit)."""
    assert from_replay(DATA / name) == EXPECTED[name]
    assert from_report(DATA / name, tmp_path) == EXPECTED[name]
