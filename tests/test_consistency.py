"""Every quantity that more than one command prints is the same in all of them (issue 22: the
class behind finding 5). For the traces in tests/data (tier 1) and a fresh recording and repro
run (tier 3): peak, limit, breakdown, stall time, restart counts and each verdict's words agree
between replay, explain, report, export, tail and repro, because each is computed once (one
analyzer, `quantities.stall_total_ns`, `wording.memory_at_kill`) and printed from there.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from tests.test_repro import repro_json
from tests.workloads import HOG
from tracer.analysis.quantities import fmt_bytes, fmt_duration
from tracer.analysis.wording import memory_at_kill
from tracer.cli import main

DATA = Path(__file__).parent / "data"
TRACES = sorted(str(p) for p in [*DATA.glob("*.trace"), *DATA.glob("*.trace.zst")])
MiB = 1024 * 1024


def _run(*args: str) -> str:
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 0, (args, r.output)
    return r.stdout


def _json(*args: str) -> Any:
    return orjson.loads(_run(*args))


def check_agreement(trace: str, tmp: Path) -> list[dict[str, Any]]:
    """Assert that every command says the same about ``trace``; returns its verdicts."""
    replayed = _json("replay", "--json", trace)
    verdicts: list[dict[str, Any]] = replayed["verdicts"]
    explained = _json("explain", "--json", trace)
    only = _json("replay", "--json", "--verdicts-only", trace)
    # one analyzer: the same verdicts, quantities and restarts, whichever command asks
    assert explained["verdicts"] == verdicts == only["verdicts"]
    assert explained["restarts"] == replayed["restarts"] == only["restarts"]

    table = _run("replay", "--verdicts-only", trace)
    assert _run("explain", trace) == table
    tail = [orjson.loads(line) for line in _run("replay", "--tail", "--json", trace).splitlines()]
    tail_text = "\n".join(line["text"] for line in tail)
    perfetto = tmp / "p.json"
    _run("export", trace, "-o", str(perfetto))
    instants = {
        e["args"]["summary"]: e["args"]
        for e in orjson.loads(perfetto.read_bytes())["traceEvents"]
        if e.get("name", "").startswith("verdict ")
    }
    report = tmp / "r.html"
    _run("report", trace, "-o", str(report))
    page = html.unescape(report.read_text())

    for v in verdicts:
        words = f"pid {v['pid']}"
        clean = v["cause"] == "app_exit" and v["exit_code"] == 0 and not v["disagreements"]
        # the verdict's words, which carry its quantities, are the same everywhere (the table
        # explains every verdict but clean exits)
        assert clean or v["summary"] in table, words
        assert v["summary"] in page, words
        assert instants[v["summary"]]["advice"] == v["advice"], words
        if v["advice"]:
            assert v["advice"] in page, words
        if not clean:
            assert v["summary"] in tail_text, words
        if v["peak_bytes"] is not None and v["limit_bytes"] is not None:
            pair = f"{fmt_bytes(v['peak_bytes'])} / {fmt_bytes(v['limit_bytes'])}"
            assert pair in table and pair in page, words
            assert f"peak usage {fmt_bytes(v['peak_bytes'])}" in page, words
        if v["breakdown"]:
            said = memory_at_kill(tuple(v["breakdown"].items()), fmt_bytes)
            assert said in table and said in page, words
        if v["stall_ns"]:
            assert f"{fmt_duration(v['stall_ns'])} of reclaim stalls" in v["summary"], words
    return verdicts


@pytest.mark.parametrize("trace", TRACES, ids=[Path(t).name for t in TRACES])
def test_commands_agree_on_the_checked_in_traces(trace: str, tmp_path: Path) -> None:
    verdicts = check_agreement(trace, tmp_path)
    assert verdicts  # every checked-in trace has something to agree on


def test_the_stall_a_verdict_names_is_the_traces_own_record(tmp_path: Path) -> None:
    """The reclaim trace: the verdict's stall time, the trace's summary record and the tail's
    storm line are one number (the verdict said 48 ms where the others said 61 ms)."""
    from tracer.analysis.quantities import stall_total_ns
    from tracer.events import ReclaimSummary
    from tracer.trace.reader import read_trace

    trace = str(DATA / "reclaim_v1_oom.trace")
    [v] = [v for v in check_agreement(trace, tmp_path) if v["cause"] == "cgroup_oom"]
    summaries = [e for e in read_trace(trace).events if isinstance(e, ReclaimSummary)]
    assert (
        v["stall_ns"]
        == stall_total_ns(summaries, 0, 2**63)
        == sum(s.total_ns for s in summaries if s.kind != "kswapd")
    )
    storm = [
        orjson.loads(line)["text"]
        for line in _run("replay", "--tail", "--json", trace).splitlines()
        if "reclaim stalls" in line and "total" in line
    ]
    assert storm and all(f"{fmt_duration(v['stall_ns'])} total" in line for line in storm)


# -- fresh recordings (root) --------------------------------------------------------------------


@pytest.mark.root
def test_a_fresh_oom_and_its_repro_run_agree(tmp_path: Path) -> None:
    """A real OOM kill under reclaim, recorded by repro: its table and JSON say the same stall
    time and peak as explain, report, export and tail say of the run's trace."""
    doc, _ = repro_json(tmp_path, "48M", HOG)
    [run] = doc["runs"]
    assert run["outcome"] == "killed" and run["cause"] == "cgroup_oom"
    [v] = [v for v in check_agreement(run["trace"], tmp_path) if v["pid"] == run["verdict"]["pid"]]
    assert v["summary"] == run["verdict"]["summary"]
    assert run["stall_s"] == round((v["stall_ns"] or 0) / 1e9, 3)
    assert v["peak_bytes"] == run["peak_bytes"] == 48 * MiB
    assert os.path.exists(run["trace"])
