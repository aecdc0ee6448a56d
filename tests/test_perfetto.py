"""Tier 1: the Perfetto export (Chrome trace-event JSON) of a real recorded OOM trace.

How it is validated: Perfetto's own trace processor would be the best judge, and the PyPI
``perfetto`` package drives it, but the package does not ship the ``trace_processor_shell``
binary: it downloads it at run time, which cannot work on these offline machines. So the
export is checked against a JSON schema of the trace-event format (the fields and phases
Perfetto's JSON importer reads: ``src/trace_processor/importers/json``), plus the rules that
importer imposes (numeric counter args, ``dur`` on complete slices, instant scopes, slices of
one thread nesting, thread names keyed by tid alone), and the expected tracks and instants are
asserted. Where a trace_processor binary is at hand, point WHYRESTART_TRACE_PROCESSOR at it
(and ``pip install perfetto``) and `test_perfetto_trace_processor_loads_it` loads the file for
real.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from tests.streams import header
from tracer.cli import main
from tracer.events import CgroupInfo, Event, Exec, Exit, OomKill, ReclaimStall, Signal
from tracer.outputs.perfetto import HOST_PID, export
from tracer.outputs.timeline import build, load

DATA = Path(__file__).parent / "data"
NESTED = DATA / "nested_v1_oom.trace"
PARENT = "/process_api/8cc8fa5152fae0761ec959a6a71a95d3/wr-report"
APP = f"{PARENT}/app"

_NUMBER = {"type": "number"}
_ID = {"type": "integer", "minimum": 0}
TRACE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "metadata": {"type": "object"},
        "traceEvents": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["ph", "name", "pid", "tid"],
                "properties": {
                    "ph": {"enum": ["M", "C", "X", "i"]},
                    "name": {"type": "string", "minLength": 1},
                    "cat": {"type": "string"},
                    "pid": _ID,
                    "tid": _ID,
                    "ts": _NUMBER,
                    "dur": {"type": "number", "minimum": 0},
                    "s": {"enum": ["g", "p", "t"]},
                    "args": {"type": "object"},
                },
                "allOf": [
                    {
                        "if": {"properties": {"ph": {"const": "M"}}},
                        "then": {
                            "required": ["args"],
                            "properties": {
                                "name": {
                                    "enum": ["process_name", "thread_name", "process_sort_index"]
                                }
                            },
                        },
                        "else": {"required": ["ts"]},
                    },
                    {
                        "if": {"properties": {"ph": {"const": "C"}}},
                        "then": {
                            "required": ["args"],
                            "properties": {
                                "args": {
                                    "type": "object",
                                    "minProperties": 1,
                                    "additionalProperties": _NUMBER,
                                }
                            },
                        },
                    },
                    {"if": {"properties": {"ph": {"const": "X"}}}, "then": {"required": ["dur"]}},
                    {"if": {"properties": {"ph": {"const": "i"}}}, "then": {"required": ["s"]}},
                ],
            },
        },
    },
}


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("perfetto") / "out.json"
    r = CliRunner().invoke(main, ["export", str(NESTED), "--format", "perfetto", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    assert "trace events written" in r.stderr
    loaded: dict[str, Any] = orjson.loads(out.read_bytes())
    return loaded


def test_schema(doc: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(doc, TRACE_EVENT_SCHEMA)
    # the schema is no rubber stamp: a slice without dur (dropped by Perfetto), a counter
    # that is not a number, an instant without the scope the export promises: all rejected
    for broken in (
        {"ph": "X", "name": "slice", "pid": 1, "tid": 1, "ts": 0},  # no dur
        {"ph": "C", "name": "c", "pid": 1, "tid": 1, "ts": 0, "args": {"MiB": "12"}},
        {"ph": "i", "name": "i", "pid": 1, "tid": 1, "ts": 0},  # no scope
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"traceEvents": [broken]}, TRACE_EVENT_SCHEMA)
    assert doc["metadata"]["schema"] == 1
    assert doc["metadata"]["verdicts"] == 1


def test_one_process_track_per_unit_and_the_host(doc: dict[str, Any]) -> None:
    names = {
        e["pid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert names == {HOST_PID: "host vm", 2: "unit python (pid 4563)"}
    # every event belongs to a named process
    assert {e["pid"] for e in doc["traceEvents"]} == set(names)


def test_counter_tracks(doc: dict[str, Any]) -> None:
    # Perfetto names a counter track "<name> <arg>"
    tracks = Counter(
        f"{e['name']} {next(iter(e['args']))}" for e in doc["traceEvents"] if e["ph"] == "C"
    )
    for expected in (
        f"usage {APP} MiB",
        f"limit {APP} MiB",
        f"limit {PARENT} MiB",
        f"usage {PARENT} (ancestor) MiB",
        f"effective limit {APP} MiB",
        f"anon {APP} MiB",
        f"shmem {APP} MiB",
        "MemAvailable MiB",
        "PSI some avg10 %",
    ):
        assert tracks[expected] > 1, expected
    limit = [
        e["args"]["MiB"]
        for e in doc["traceEvents"]
        if e["ph"] == "C" and e["name"] == f"effective limit {APP}"
    ]
    assert set(limit) == {96.0}


def test_instants_and_slices(doc: dict[str, Any]) -> None:
    events = doc["traceEvents"]
    instants = [(e["name"], e["s"], e["pid"]) for e in events if e["ph"] == "i"]
    assert ("OOM kill pid 4563", "p", 2) in instants
    assert ("exit pid 4563: SIGKILL", "p", 2) in instants
    assert ("verdict cgroup_oom pid 4563", "p", 2) in instants
    [oom] = [e for e in events if e["ph"] == "i" and e["name"] == "OOM kill pid 4563"]
    assert PARENT in oom["args"]["detail"]
    stalls = [e for e in events if e["ph"] == "X" and e["name"] == "memcg stall pid 4563"]
    assert len(stalls) == 4
    assert all(e["dur"] > 0 for e in stalls)
    [summary] = [e for e in events if e["ph"] == "X" and "memcg stalls" in e["name"]]
    assert summary["args"]["count"] == 43
    # timestamps are microseconds since the start of the recording
    ts = [e["ts"] for e in events if "ts" in e]
    assert min(ts) >= 0
    assert max(ts) <= load(NESTED).rel_s(load(NESTED).end_ns) * 1e6 + 1


def test_thread_tracks_are_named_and_slices_nest(doc: dict[str, Any]) -> None:
    events = doc["traceEvents"]
    threads = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    tids = [e["tid"] for e in threads]
    assert len(tids) == len(set(tids))  # Perfetto keys thread names by tid alone
    named = set(tids)
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in events:
        if e["ph"] == "X":
            assert e["tid"] in named
            by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end


def test_overlapping_stalls_go_to_lanes_and_a_host_oom_is_global() -> None:
    ms = 1_000_000
    events: list[Event] = [
        CgroupInfo(0, 5, "/job", "memory", None),
        Exec(1, 10, "worker", "/w", 5),
        # two threads of pid 10 stalled at once: overlapping slices
        ReclaimStall(50 * ms, 10, "worker", 5, 5, "direct", 40 * ms, 0, "tp_btf"),
        ReclaimStall(60 * ms, 10, "worker", 5, 5, "direct", 30 * ms, 0, "tp_btf"),
        ReclaimStall(90 * ms, 10, "worker", 5, 5, "direct", 5 * ms, 0, "tp_btf"),
        OomKill(100 * ms, 10, "worker", 5, 10, "worker", False, 0, 0, 0, "tp_btf"),
        Signal(100 * ms, 10, 10, "worker", 5, 10, "worker", 9, 0x80, 0, True),
        Exit(101 * ms, 10, 1, "worker", 5, 9, 0),
    ]
    doc = export(build(header(tool_version="t"), events), "synthetic")
    lanes = {e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert len(lanes) == 2
    lane_names = sorted(
        e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    )
    assert lane_names == ["reclaim stalls", "reclaim stalls (lane 2)"]
    scopes = {(e["name"], e["s"], e["pid"]) for e in doc["traceEvents"] if e["ph"] == "i"}
    assert ("OOM kill pid 10", "g", HOST_PID) in scopes  # a host OOM cuts across all tracks
    assert ("OOM kill pid 10", "p", 2) in scopes
    assert doc["metadata"]["started"] == "2023-11-14T22:13:20+00:00"  # wall clock from the offset


def test_perfetto_trace_processor_loads_it(tmp_path: Path) -> None:
    binary = os.environ.get("WHYRESTART_TRACE_PROCESSOR")
    if not binary:
        pytest.skip(
            "no trace_processor binary: the PyPI perfetto package downloads it at run time, "
            "which needs the internet; set WHYRESTART_TRACE_PROCESSOR=/path/to/trace_processor"
        )
    tp_api = pytest.importorskip("perfetto.trace_processor")
    out = tmp_path / "out.json"
    out.write_bytes(orjson.dumps(export(load(NESTED), str(NESTED))))
    tp = tp_api.TraceProcessor(trace=str(out), config=tp_api.TraceProcessorConfig(bin_path=binary))
    try:
        procs = {r.name for r in tp.query("select name from process where name is not null")}
        assert {"host vm", "unit python (pid 4563)"} <= procs
        counters = {r.name for r in tp.query("select name from counter_track")}
        assert f"effective limit {APP} MiB" in counters
        slices = {r.name for r in tp.query("select name from slice")}
        assert "OOM kill pid 4563" in slices and "memcg stall pid 4563" in slices
    finally:
        tp.close()
