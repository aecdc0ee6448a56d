"""Tier 1: the command line through click's runner: replay, golden output, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from tracer.cli import main

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "demo_v1_oom.trace"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_replay_golden_trace_gives_the_recorded_verdicts() -> None:
    """A trace recorded by the root tier (tracer.demo on this v1 host) replays to the same
    timeline and verdicts as when it was checked in."""
    code, out, _ = run("replay", str(GOLDEN))
    assert code == 0
    assert out == (DATA / "demo_v1_oom.replay.txt").read_text()


def test_replay_golden_v2_trace_gives_the_recorded_verdicts() -> None:
    """The same demo recorded on cgroup v2 (the lab's Debian 12 VM, kernel 6.1: the fentry rung,
    memory.max, memory.events): the limiting cgroup, its composition from memory.stat at the
    kill and the evidence replay as when it was checked in."""
    code, out, _ = run("replay", str(DATA / "demo_v2_oom.trace.zst"))
    assert code == 0
    assert out == (DATA / "demo_v2_oom.replay.txt").read_text()
    assert "[fentry] OOM killer chose pid 165, memcg in /whyrestart-demo-164" in out


def test_replay_golden_probe_kill_trace() -> None:
    """A real supervisor's probe kill (recorded on this host with --probe, see
    tests/test_one_judging_path.py): the probes, the kill and the verdict's evidence replay as
    when it was checked in."""
    code, out, _ = run("replay", str(DATA / "probe_kill_supervisor.trace.zst"))
    assert code == 0
    assert out == (DATA / "probe_kill_supervisor.replay.txt").read_text()


def test_replay_json_shape() -> None:
    code, out, _ = run("replay", "--json", str(GOLDEN))
    assert code == 0
    doc = orjson.loads(out)
    assert doc["schema"] == 1
    causes = [(v["comm"], v["cause"]) for v in doc["verdicts"]]
    assert causes == [
        ("python3", "cgroup_oom"),
        ("sh", "app_exit"),
        ("kill", "app_exit"),
        ("sleep", "signal_kill"),
        ("python3", "app_exit"),
    ]
    oom = doc["verdicts"][0]
    assert oom["limit_bytes"] == 64 * 1024 * 1024
    assert oom["limit_cgroup"].endswith("/whyrestart-demo-" + str(doc["verdicts"][-1]["pid"]))
    assert doc["footer"]["lost"] == 0


def test_replay_missing_file() -> None:
    code, _, err = run("replay", "/nonexistent/x.trace")
    assert code == 6
    assert "no such trace file" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "empty"),
        (b"\x00\xff garbage \x01" * 10, "not a whyrestart trace"),
        (b'{"hello": 1}\n', "not a whyrestart trace"),
    ],
)
def test_replay_bad_files(tmp_path: Path, content: bytes, needle: str) -> None:
    p = tmp_path / "bad.trace"
    p.write_bytes(content)
    code, _, err = run("replay", str(p))
    assert code == 6, err
    assert needle in err
    assert "Traceback" not in err


def test_replay_truncated_trace_warns_and_keeps_what_is_whole(tmp_path: Path) -> None:
    data = GOLDEN.read_bytes()
    cut = tmp_path / "cut.trace"
    cut.write_bytes(data[: len(data) * 2 // 3])
    code, out, err = run("replay", str(cut))
    assert code == 0
    assert "warning" in err and "cut" in err
    assert "cgroup_oom" in out


def test_replay_every_cut_offset_is_clean(tmp_path: Path) -> None:
    data = GOLDEN.read_bytes()
    header_len = data.index(b"\n") + 1
    cut = tmp_path / "cut.trace"
    for n in range(0, len(data), 37):
        cut.write_bytes(data[:n])
        code, _, err = run("replay", "--verdicts-only", str(cut))
        assert "Traceback" not in err
        assert code == (0 if n >= header_len else 6), (n, err)


def test_record_refuses_without_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, _, err = run("record", "-o", str(tmp_path / "x.trace"), "--", "true")
    assert code == 3
    assert "root" in err and "sudo" in err


@pytest.mark.root
def test_record_bad_targets_and_output(tmp_path: Path) -> None:
    code, _, err = run("record", "-o", str(tmp_path / "x.trace"), "--pid", "999999999")
    assert code == 2 and "no process with pid 999999999" in err
    code, _, err = run("record", "-o", "/nonexistent/dir/x.trace", "--", "true")
    assert code == 2 and "does not exist" in err and "'-o' / '--output'" in err
    code, _, err = run("record", "-o", str(tmp_path / "x.trace"), "--cgroup", "/no/such/cg")
    assert code == 2 and "/no/such/cg" in err
    code, _, err = run("record", "-o", str(tmp_path / "x.trace"), "--", "/no/such/binary")
    assert code == 2 and "cannot run" in err
    code, _, err = run("record", "-o", str(tmp_path / "x.trace"))
    assert code == 2 and "nothing to record" in err


def test_doctor_json_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, out, _ = run("doctor", "--json")
    doc = orjson.loads(out)
    assert code == 4 and doc["ok"] is False
    names = {c["name"]: c for c in doc["checks"]}
    assert names["root"]["ok"] is False and names["root"]["fix"]


def test_replay_tail_golden() -> None:
    """A real reclaim storm ending in an OOM kill (recorded on this v1 host) gives the same tail
    lines as when it was checked in: two long stalls, the kill, the verdict, one storm line."""
    code, out, _ = run("replay", "--tail", str(DATA / "reclaim_v1_oom.trace"))
    assert code == 0
    assert out == (DATA / "reclaim_v1_oom.tail.txt").read_text()
    assert sum(line.split()[1] == "storm" for line in out.splitlines()) == 1


def test_explain_filters_and_json() -> None:
    code, out, _ = run("explain", "--json", str(GOLDEN))
    doc = orjson.loads(out)
    assert code == 0 and doc["schema"] == 1 and doc["restarts"] == []
    sleeper = next(v for v in doc["verdicts"] if v["comm"] == "sleep")
    code, out, _ = run("explain", str(GOLDEN), "--pid", str(sleeper["pid"]))
    assert code == 0
    assert "signal_kill" in out and "cgroup_oom" not in out
    code, _, err = run("explain", str(GOLDEN), "--unit", "no-such-unit")
    assert code == 2 and "no verdict matches" in err


def test_explain_equals_the_table_replay_prints() -> None:
    _, explained, _ = run("explain", str(GOLDEN))
    _, replayed, _ = run("replay", "--verdicts-only", str(GOLDEN))
    assert explained == replayed


def test_the_v2_composition_agrees_with_the_kernels_figures_at_the_kill() -> None:
    """Issue 30 §1 on cgroup v2: the limiting cgroup's composition (memory.stat read at the
    kill, in the lab's 6.1 VM) agrees with the kernel's own report of the victim (anon-rss of
    its OOM line) within 10%, and fills the 64 MiB limit to within 10%."""
    code, out, _ = run("replay", "--json", str(DATA / "demo_v2_oom.trace.zst"))
    assert code == 0
    [v] = [v for v in orjson.loads(out)["verdicts"] if v["cause"] == "cgroup_oom"]
    parts = v["breakdown"]
    assert abs(parts["anon"] - parts["anon_rss"]) <= 0.1 * parts["anon_rss"], parts
    total = sum(parts[k] for k in ("anon", "shmem", "file_mapped", "file_unmapped", "kernel"))
    assert abs(total - v["limit_bytes"]) <= 0.1 * v["limit_bytes"], (total, v["limit_bytes"])
