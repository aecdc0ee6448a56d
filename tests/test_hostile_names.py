"""Names a workload chooses cannot reach the operator's terminal raw (issue 18).

A synthetic trace whose process names, executable paths, cgroup, container and unit names,
probe errors and kernel log text carry ESC, BEL, CR, backspace, DEL, C1 and bidi controls, an
HTML tag and a 5,000-character name goes through every text output (replay, its --tail view,
explain, record's and tail's renderers, repro's table), the JSON outputs (exact values, no raw
control character), the HTML report (escaped) and the Perfetto export (exact values).
The same with a real process renamed by prctl is in test_record_root.py.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import msgspec
import orjson
import pytest
from click.testing import CliRunner

from tests import streams as s
from tracer import safetext
from tracer.cli import main
from tracer.events import Event, Exec, ProbeSample
from tracer.trace.writer import TraceWriter

# 15 bytes, what prctl(PR_SET_NAME) keeps: set the window title, then paint red.
TITLE = "\x1b]0;pwned\x07\x1b[31m"
# Carriage return and backspaces over a forged verdict line; C1 CSI; DEL; a bidi override.
FORGE = "ok\r\x08\x08\x9b2J\x7f\u202eevil\nfake: cgroup_oom, high confidence"
SVG = "<svg onload=1>"
LONG = "x" * 5000 + "\x1b[2J"

# Any of these in terminal text is a raw control character; LF alone separates our lines.
RAW = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def assert_clean(text: str) -> None:
    m = RAW.search(text)
    assert m is None, (
        f"raw {m.group()!r} at {m.start()}: {text[max(0, m.start() - 60) : m.start() + 20]!r}"
    )


HEADER = s.header(
    host="h\x1b[2Jost",
    hooks={"exit": "tp_btf", "signal": "tp_btf", "oom": "tp_btf/mark_victim"},
    targets={"cgroups": [f"/evil{TITLE}"], "pids": []},
)


def hostile_events() -> list[Event]:
    cg, path = 20, f"/evil{TITLE}/{SVG}/$\\undefined{{$"
    oom = s.oom(2.0, 100, limit_cgroup=cg, victim_cg=cg)
    return [
        s.cgroup(cg, path, limit=64 * s.MiB),
        s.unit_info(cg, "docker", f"llm{FORGE}"),
        s.forked(0.05, 1, 100, cg, comm=TITLE),
        Exec(ts=s.t(0.1), pid=100, comm=TITLE, filename=f"/tmp/{FORGE}/{SVG}", cgroup_id=cg),
        s.forked(0.15, 1, 101, cg, comm=LONG[:15]),
        Exec(ts=s.t(0.2), pid=101, comm=LONG[:15], filename=f"/opt/{LONG}", cgroup_id=cg),
        s.forked(0.25, 1, 102, cg, comm=SVG[:15]),
        ProbeSample(
            ts=s.t(0.5),
            target=f"http://127.0.0.1:8080/{SVG}",
            unit="",
            latency_ns=5_000_000,
            ok=False,
            timed_out=False,
            status=500,
            error=f"HTTP 500: {FORGE}",
        ),
        s.sample(1.0, cg, path, usage=60 * s.MiB, limit=64 * s.MiB),
        s.reclaim(1.5, cg, 0.4, 3),
        msgspec.structs.replace(oom, victim_comm=TITLE, trigger_comm=TITLE),
        s.kmsg(2.0, 100, oom_memcg=path, comm=TITLE),
        s.oom_killer_sigkill(2.0, 100, 100),
        s.killed(2.01, 100, signal.SIGKILL, comm=TITLE, cg=cg),
        s.sent(3.0, 555, 101, signal.SIGTERM, comm=FORGE[:15], target_comm=LONG[:15]),
        s.killed(3.01, 101, signal.SIGTERM, comm=LONG[:15], cg=cg),
        s.exit_code(4.0, 102, 3, comm=SVG[:15], cg=cg),
        s.runtime(4.5, f"llm{FORGE}", 1, source="docker"),
    ]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.trace"
    w = TraceWriter.open(path, HEADER)
    w.write_many(sorted(hostile_events(), key=lambda e: e.ts))
    w.close(w.make_footer("command exited", ended_ns=s.t(5.0)))
    return path


def run(*args: str) -> str:
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 0, r.output
    return r.output  # stdout and stderr together


def test_helper_escapes_every_control_character() -> None:
    assert safetext.field(TITLE) == "\\x1b]0;pwned\\x07\\x1b[31m"
    assert safetext.field("a\tb\nc\rd\x08e\x7ff\x9bg\u202eh") == (
        "a\\x09b\\x0ac\\x0dd\\x08e\\x7ff\\x9bg\\u202eh"
    )
    assert safetext.block("line 1\nline\x1b 2\n") == "line 1\nline\\x1b 2\n"
    assert safetext.field("llama-server ü 模型") == "llama-server ü 模型"  # printable: untouched
    cut = safetext.cell(LONG)
    assert len(cut) == safetext.CELL_MAX and "…" in cut and cut.endswith("\\x1b[2J")
    # JSON keeps the value: orjson escapes C0, json_text the rest, and both read back exact.
    raw = orjson.dumps({"comm": FORGE}).decode()
    safe = safetext.json_text(raw)
    assert_clean(safe)
    assert orjson.loads(safe) == {"comm": FORGE}


def test_replay_and_explain_escape_every_name(trace: Path) -> None:
    out = run("replay", str(trace))
    assert_clean(out)
    # each name is there, escaped, and the forged line stayed inside its own line
    assert "\\x1b]0;pwned\\x07\\x1b[31m" in out
    assert "\\x0afake: cgroup_oom, high confidence" in out
    assert not any(line.startswith("fake:") for line in out.splitlines())
    assert SVG in out  # a terminal shows tags as text
    # the table stays narrow: a 5,000-character name is cut in its cell
    table = out[out.index("time  ") :]
    assert max(len(line) for line in table.splitlines()[:6]) < 300
    for args in (
        ("replay", "--verdicts-only", str(trace)),
        ("replay", "--tail", str(trace)),
        ("explain", str(trace)),
        ("explain", "--pid", "100", str(trace)),
    ):
        assert_clean(run(*args))


def test_json_keeps_exact_values(trace: Path) -> None:
    for args in (("replay", "--json", str(trace)), ("explain", "--json", str(trace))):
        out = run(*args)
        assert_clean(out)
        doc = orjson.loads(out)
        by_pid = {v["pid"]: v for v in doc["verdicts"]}
        assert by_pid[100]["comm"] == TITLE
        assert by_pid[102]["comm"] == SVG[:15]
        assert by_pid[100]["unit"] == f"docker llm{FORGE}"
    events = orjson.loads(run("replay", "--json", str(trace)))["events"]
    assert any(e.get("error") == f"HTTP 500: {FORGE}" for e in events)
    assert any(e.get("filename") == f"/opt/{LONG}" for e in events)


def test_report_escapes_html_and_survives_math_text(trace: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    html, png = tmp_path / "r.html", tmp_path / "r.png"
    assert_clean(run("report", str(trace), "-o", str(html), "--png", str(png)))
    page = html.read_text()
    assert_clean(page)
    assert SVG not in page and "&lt;svg onload=1&gt;" in page
    assert png.stat().st_size > 0


def test_export_keeps_exact_values(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    assert_clean(run("export", str(trace), "-o", str(out)))
    text = out.read_text()
    assert_clean(text)
    doc = orjson.loads(text)
    names = [e.get("name", "") for e in doc["traceEvents"]] + [
        str(e.get("args", {})) for e in doc["traceEvents"]
    ]
    assert any(TITLE in n for n in names)


def test_tail_lines_and_status_are_escaped(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tracer.cli import _status_printer, _tail_printer
    from tracer.outputs.tail import TailLine
    from tracer.outputs.text import Clock

    show = _tail_printer([Clock(0, None)], False)
    show([TailLine(ts=1, severity="crit", text=f"pid 1 ({TITLE}) {FORGE}")])
    _status_printer()(f"recording {TITLE}", True)
    cap = capsys.readouterr()
    assert_clean(cap.out)
    assert_clean(cap.err)
    assert cap.out.count("\n") == 1


# --- root: a real process renames itself, runs from a hostile path, kills a hostile child ------

WORKLOAD = """#!/usr/bin/python3
import ctypes, os, signal, time
libc = ctypes.CDLL(None)
libc.prctl(15, b"\\x1b]0;pwned\\x07\\x1b[31m", 0, 0, 0)
child = os.fork()
if child == 0:
    libc.prctl(15, b"ok\\r\\x08\\x08\\xc2\\x9b2J\\x7f\\n!", 0, 0, 0)
    time.sleep(30)
    os._exit(0)
time.sleep(0.3)
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
os._exit(3)
"""


@pytest.mark.root
@pytest.mark.parametrize("command", ["record", "tail"])
def test_recorded_hostile_process(tmp_path: Path, command: str) -> None:
    import subprocess
    import sys

    evil_dir = tmp_path / f"bin{FORGE.replace(chr(10), ' ')}{SVG}"
    evil_dir.mkdir()
    script = evil_dir / "serve"
    script.write_text(WORKLOAD)
    script.chmod(0o755)
    out = tmp_path / "t.trace"
    cli = [sys.executable, "-m", "tracer.cli", command]
    args = [*cli, "-q", "-o", str(out)] if command == "record" else [*cli]
    r = subprocess.run(
        [*args, "--", str(script)], capture_output=True, timeout=120, cwd=Path(__file__).parents[1]
    )
    text = (r.stdout + r.stderr).decode()
    assert r.returncode == 3, text  # the command's own status, passed on
    assert_clean(text)
    assert "\\x1b]0;pwned\\x07\\x1b[31m" in text  # the parent's name, shown escaped
    assert "ok\\x0d\\x08\\x08\\x9b2J\\x7f\\x0a!" in text  # the child's
    if command == "tail":
        return
    verdicts = {
        v["comm"]: v["cause"] for v in orjson.loads(run("explain", "--json", str(out)))["verdicts"]
    }
    assert verdicts == {TITLE: "app_exit", "ok\r\x08\x08\x9b2J\x7f\n!": "signal_kill"}
    replayed = run("replay", str(out))
    assert_clean(replayed)
    assert f"runs {tmp_path}/bin" in replayed and "\\x0d\\x08\\x08\\x9b2J" in replayed


def test_explain_json_matches_the_verdict_schema(trace: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from tracer.outputs.schema import EXPLAIN

    doc = orjson.loads(run("explain", "--json", str(trace)))
    jsonschema.validate(doc, EXPLAIN)
    assert {v["cause"] for v in doc["verdicts"]} == {"cgroup_oom", "signal_kill", "app_exit"}
    golden = Path(__file__).parent / "data" / "demo_v1_oom.trace"
    jsonschema.validate(orjson.loads(run("explain", "--json", str(golden))), EXPLAIN)
