"""Tier 3 (root, real kernel): `scripts/bench --quick`, the smoke run of the benchmark.

Every section runs, every variant of it (whyrestart and its peers, which scripts/setup
installs) runs without failing, and the report prints each section's table with a row per
variant. Nothing here asserts a speed (the numbers of a one-second run on a shared machine mean
little); the counts asserted are the ones that do not depend on speed: the synthetic trace is
read back whole, every record decodes, and the overflow run's events are all accounted for.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from typing import Any

import pytest

from bench.options import ROOT, SECTION_VARIANTS, SECTIONS

pytestmark = pytest.mark.root

# Each section's table: its heading, and the header row that starts it.
TABLES = {
    "storm": ("## Fork/exit storm, 1 round(s) x 1 s", "| variant | exits/s | slowdown |"),
    "signals": ("## Signal storm (SIGUSR1 ping-pong)", "| variant | signals/s | slowdown |"),
    "reclaim": ("## Memcg reclaim storm", "| variant | MiB/s read | slowdown |"),
    "overflow": ("## Ring-buffer overflow on purpose", "| recording | storm children made |"),
    "decode": ("## Decode throughput (batched, Python)", "| records | bytes each |"),
    "replay": ("## Replay throughput (100,001-event", "| what | seconds | events/s |"),
    "soak": ("## Tracer RSS steady state", "| storm children exit | exits made |"),
    "gpuhold": ("## GPU: a program's first driver call", "| what | programs |"),
    "agent": ("## Agent: CPU at idle and at 1,000 clean exits/s", "| variant | idle CPU %"),
    "eta": ("## Time-to-limit warnings (eta)", "| trace | OOM kills |"),
    "llm": ("## llama.cpp llama-server: tokens/s and latency", "| variant | tokens/s |"),
}


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    r = subprocess.run(
        [str(ROOT / "scripts" / "bench"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, json.loads(out.read_text())


def _table_rows(text: str, heading: str, header: str) -> list[str]:
    """The rows of the first table after ``heading`` (the header and rule lines left out)."""
    after = text[text.index(heading) :]
    lines = after.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_every_section_prints_its_table(quick: tuple[str, dict[str, Any]]) -> None:
    text, doc = quick
    assert list(doc["sections"]) == list(SECTIONS)
    for name in SECTIONS:
        heading, header = TABLES[name]
        assert heading in text, f"{name}: no table heading {heading!r}"
        rows = _table_rows(text, heading, header)
        assert rows, f"{name}: its table has no rows"
        for row in rows:
            assert "failed" not in row, f"{name}: {row}"
        if name in SECTION_VARIANTS:
            first_cells = [row.split("|")[1].strip() for row in rows]
            # (signals has a second, paced table below: its rows come after these)
            assert first_cells[: len(SECTION_VARIANTS[name])] == list(SECTION_VARIANTS[name])
        assert "error" not in doc["sections"][name], doc["sections"][name].get("error")
    assert "## Machine and run" in text


def test_every_variant_ran(quick: tuple[str, dict[str, Any]]) -> None:
    _, doc = quick
    for name, variants in SECTION_VARIANTS.items():
        section = doc["sections"][name]
        assert section["skipped"] == {}, f"{name}: {section['skipped']} (scripts/setup installs)"
        runs = section["runs"]
        assert sorted(r["variant"] for r in runs) == sorted(variants)
        for r in runs:
            assert "error" not in r, f"{name} {r['variant']}: {r['error']}"
            assert r["work"]["per_s"] > 0
            if r["variant"] == "whyrestart":
                assert r["footer"] is True, f"{name}: whyrestart's trace has no footer"
                # stopped by the bench's SIGINT: record exits 128 + 2 (tracer/spawn.py's policy)
                assert r["tool_rc"] == 128 + signal.SIGINT, r.get("stderr_tail")
                assert r["tool_killed"] is False


def test_counts_that_do_not_depend_on_speed(quick: tuple[str, dict[str, Any]]) -> None:
    _, doc = quick
    decode = doc["sections"]["decode"]["result"]
    assert decode["decoded"] == decode["records"] == 50_000

    replay = doc["sections"]["replay"]
    assert replay["gen"]["events"] == 100_001  # the 100,000 asked for, rounded up to a whole exit
    assert [r["events"] for r in replay["runs"]["read"]] == [replay["gen"]["events"]]
    assert all(r["footer"] and r["warnings"] == [] for r in replay["runs"]["read"])

    for run in doc["sections"]["overflow"]["runs"]:
        assert "error" not in run, run["error"]
        assert run["footer"] is True
        assert run["lost_records_sum"] == run["lost"]  # the footer's total = the lost records
        if run["mode"] == "cgroup":
            # only the storm in that cgroup: every event seen or counted lost, exactly
            assert run["seen_events"] + run["lost"] == run["expected"], run
        else:
            assert run["missing"] <= run["lost"], run

    [soak] = doc["sections"]["soak"]["runs"]
    assert soak["seen"] + soak["lost"] >= soak["work"]["exits"] > 0


def test_agent_section_accounts_for_every_failure(quick: tuple[str, dict[str, Any]]) -> None:
    text, doc = quick
    agent = doc["sections"]["agent"]
    for phase in ("bare", "exitsnoop", "agent"):
        assert "error" not in agent[phase], agent[phase]["error"]
    rows = _table_rows(text, *TABLES["agent"])
    assert [row.split("|")[1].strip() for row in rows] == [
        "bare",
        "exitsnoop",
        "whyrestart agent",
        "whyrestart agent, 5 of 5 containers' cgroups idle",
    ]
    a = agent["agent"]
    # every container of the crowd ran through its CPU window
    assert a["crowd"]["running"] == a["crowd"]["cgroups"] == 5
    # SIGTERM: the agent flushes and exits 0
    assert a["tool_rc"] == 0 and a["tool_killed"] is False, a.get("stderr_tail")
    storm = a["storm"]
    # the workload's own count of what it made, each confirmed by the kernel
    assert storm["fatal_made"] == 2 and storm["oom_made"] == storm["oom_kills_cgroup"] == 1
    assert storm["nonzero_made"] > 0
    # the failures are sent, never filtered: each OOM kill and fatal signal is in the segments,
    # and a non-zero exit missing from them is one the ring buffer counted lost
    assert storm["oom_seen"] == storm["oom_made"]
    assert storm["fatal_seen"] == storm["fatal_made"]
    assert storm["nonzero_seen"] + storm["lost"] >= storm["nonzero_made"]
    lat = a["latency"]
    # every OOM kill reached the journal that `history` reads
    assert lat["missing"] == 0 and len(lat["history_s"]) == lat["kills"] == 3
    assert len(lat["metric_s"]) + lat["foreign"] == 3
    assert "## Agent: storm with failures" in text
    assert "## Agent: OOM kill -> /metrics and -> history (3 kills)" in text
    assert "## Agent: RSS soak" in text


def test_the_report_names_the_code_it_measured(quick: tuple[str, dict[str, Any]]) -> None:
    text, doc = quick
    sha = doc["machine"]["code_at_start"]["sha256"]
    assert re.search(rf"Code measured: tracer/ \+ bpf/ sha256 {sha} ", text)
