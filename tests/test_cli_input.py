"""Tier 1: every subcommand, every option that takes a value, generated values (hypothesis):
malformed URLs, sizes, durations, pids, cgroup paths and paths of every kind (device, FIFO,
directory, /proc, missing parents, existing files, links, over-long names). Whatever the value:
never a traceback, always a documented exit code, and a refusal names the option it refused.
(issue 22: the class behind findings 2, 8 and 9)

The stages that need root and run for a while (a recording, a repro experiment) are replaced by
a stub that raises `Reached`: reaching it means every value was accepted and checked.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracer.cli import main

DATA = Path(__file__).parent / "data"
TRACE = str(DATA / "demo_v1_oom.trace")
# tracer/cli/common.py EXIT_CODES: 0 done, 1 other error, 2 usage, 3 root, 4 kernel, 5 BPF, 6 trace
# file, 7 output; no command runs here, so no command status can be passed through.
DOCUMENTED = {0, 1, 2, 3, 4, 5, 6, 7}


class Reached(Exception):
    """The stub of a stage that needs root: every option value was accepted before it."""


# -- values ---------------------------------------------------------------------------------

_SCRATCH = tempfile.mkdtemp(prefix="wr-cli-input-")
_FIFO = os.path.join(_SCRATCH, "fifo")
os.mkfifo(_FIFO)
_FILE = os.path.join(_SCRATCH, "existing.file")
Path(_FILE).write_text("x\n")
_LINK = os.path.join(_SCRATCH, "link")
os.symlink(_FILE, _LINK)
_DANGLING = os.path.join(_SCRATCH, "dangling")
os.symlink(os.path.join(_SCRATCH, "nowhere"), _DANGLING)
# outputs may be pointed at this copy; the checked-in trace itself is only ever read
_TRACE_COPY = os.path.join(_SCRATCH, "copy.trace")
shutil.copyfile(TRACE, _TRACE_COPY)

# Outputs are only ever pointed at the scratch directory, at devices and FIFOs, at directories
# and at pseudo file systems that make no files: never at a real file outside the scratch
# directory (an accepted path is written to).
OUTPUT_PATHS = st.sampled_from(
    [
        "/dev/null", "/dev/zero", _FIFO, "/tmp", _SCRATCH, "/proc/foo", "/proc",
        "/sys/kernel/x", "/nonexistent/a/b", _FILE, _FILE + "/x", _LINK, _DANGLING, "", " ",
        "-", os.path.join(_SCRATCH, "x" * 300), os.path.join(_SCRATCH, "a\nb"),
        os.path.join(_SCRATCH, "\x1b[31mred"), "relative/missing/x", _TRACE_COPY, "/",
    ]
) | st.builds(lambda s: os.path.join(_SCRATCH, s), st.text(min_size=1, max_size=12).filter(
    lambda s: "\x00" not in s and "/" not in s))  # fmt: skip
# Inputs are only read: system files are fair game.
PATHS = OUTPUT_PATHS | st.sampled_from(
    ["/proc/self/status", "/etc/hostname", "/nonexistent", TRACE, TRACE + ".zst"]
)

DURATIONS = st.sampled_from(
    ["nan", "inf", "-inf", "1e400", "1e-400", "0", "-1", "5s", "500ms", "1m", "1h", "abc", "",
     " 2s ", "0.0001", "1e3", "0x10", "1_000", "½", "2ss", "9" * 40]
) | st.floats(allow_nan=True, allow_infinity=True).map(str) | st.text(max_size=8)  # fmt: skip

URLS = st.sampled_from(
    ["http://[::1/x", "tcp://[zz", "http://[::1]:99999/", "http://h:-1/", "tcp://h", "tcp://h:0",
     "http://", "http://:80/", "ftp://h:1/", "exec:", "exec:'unbalanced", "exec:true", "h:80",
     "http://u:p@h/", "http://[fe80::1%eth0]:80/", "tcp://h:80/path", "http://%zz/", ""]
) | st.builds(lambda a, b: a + b, st.sampled_from(["http://", "tcp://", "exec:", ""]),
              st.text(max_size=12))  # fmt: skip

SIZES = st.sampled_from(
    ["32M", "32M,32M", "32M,33554432", "0", "-1M", "1e6", "1.5", "M", "", ",", "1G,,2G",
     "64M,128M", "9" * 30 + "T", "nan", "inf"]
) | st.text(max_size=10)  # fmt: skip

INTS = st.sampled_from(["0", "-1", "1", "999999999", "abc", "", "1.5", "9" * 30]) | st.integers(
    min_value=-(2**70), max_value=2**70
).map(str)

CGROUPS = st.sampled_from(
    ["/", "/x/../..", "/sys/fs/cgroup/memory/x", "x", "", "..", "/no/such", "/./.", "//",
     "/sys/fs/cgroup/memory", "/\x1b[31m"]
) | st.text(max_size=12)  # fmt: skip

TEXT = st.text(max_size=16)

# every option that takes a value, per subcommand, and what to generate for it
OPTIONS: dict[str, dict[str, Any]] = {
    "record": {
        "-o": OUTPUT_PATHS, "--pid": INTS, "--cgroup": CGROUPS, "--container": TEXT, "--unit": TEXT,
        "--pod": TEXT, "--probe": URLS, "--probe-interval": DURATIONS,
        "--probe-timeout": DURATIONS, "--probe-failures": INTS, "--supervisor": INTS,
        "--duration": DURATIONS, "--runtime-endpoint": PATHS | TEXT,
    },
    "tail": {
        "--pid": INTS, "--cgroup": CGROUPS, "--container": TEXT, "--unit": TEXT, "--pod": TEXT,
        "--probe": URLS, "--probe-interval": DURATIONS, "--probe-timeout": DURATIONS,
        "--probe-failures": INTS, "--supervisor": INTS, "--duration": DURATIONS,
        "--runtime-endpoint": PATHS | TEXT,
    },
    "repro": {
        "--memory-max": SIZES, "--memory-high": SIZES, "--probe-timeout": SIZES | DURATIONS,
        "--runs": INTS, "--probe": URLS, "--probe-data": TEXT, "--probe-interval": DURATIONS,
        "--probe-failures": INTS, "--probe-delay": DURATIONS, "--duration": DURATIONS,
        "--out-dir": OUTPUT_PATHS, "--parent-cgroup": CGROUPS,
    },
    "replay": {"TRACE": PATHS},
    "explain": {"TRACE": PATHS, "--pid": INTS, "--unit": TEXT},
    "report": {"TRACE": PATHS, "-o": OUTPUT_PATHS, "--png": OUTPUT_PATHS},
    "export": {"TRACE": PATHS, "-o": OUTPUT_PATHS, "--format": TEXT},
    "postmortem": {
        "--container": TEXT, "--unit": TEXT, "--pod": TEXT, "--cgroup": CGROUPS, "--pid": INTS,
        "--since": DURATIONS,
    },
    "agent": {
        "--state-dir": OUTPUT_PATHS, "--max-disk": SIZES, "--metrics-addr": URLS | TEXT,
        "--log-format": TEXT, "--retain": DURATIONS, "--series-ttl": DURATIONS,
    },
    "history": {
        "--state-dir": PATHS, "--since": DURATIONS, "--unit": TEXT, "--cause": TEXT,
    },
}  # fmt: skip


def _argv(command: str, option: str, value: str) -> list[str]:
    """A command line that is valid but for ``option``'s generated ``value``."""
    fresh = os.path.join(_SCRATCH, f"out-{os.urandom(4).hex()}")
    if command in ("record", "tail"):
        base = {"record": ["-o", fresh + ".trace"], "tail": []}[command]
        if option == "-o":
            base = []
        probe = ["--probe", "tcp://127.0.0.1:9"] if option.startswith("--probe-") else []
        return [command, *base, *probe, option, value, "--", "true"]
    if command == "repro":
        vary = [] if option == "--memory-max" else ["--memory-max", "32M,64M"]
        if option == "--memory-max":
            vary = []
        elif option in ("--memory-high", "--probe-timeout"):
            vary = ["--memory-max", "1G"]
        probe = (
            ["--probe", "tcp://127.0.0.1:9"]
            if option in ("--probe-interval", "--probe-delay", "--probe-timeout")
            else ["--probe", "http://127.0.0.1:9/completion"]
            if option == "--probe-data"
            else []
        )
        out = [] if option == "--out-dir" else ["--out-dir", fresh]
        return [command, *vary, *probe, *out, option, value, "--", "true"]
    if command == "postmortem":
        return (
            [command, option, value]
            if option != "--since"
            else [command, "--pid", "1", option, value]
        )
    if command in ("agent", "history"):
        if command == "history":
            os.mkdir(fresh)  # an agent's (empty) state directory
        state = [] if option == "--state-dir" else ["--state-dir", fresh]
        return [command, *state, option, value]
    trace = value if option == "TRACE" else _TRACE_COPY
    rest = [] if option == "TRACE" else [option, value]
    if command == "report" and option != "-o":
        rest += ["-o", fresh + ".html"]
    if command == "export" and option != "-o":
        rest += ["-o", fresh + ".json"]
    return [command, trace, *rest]


@pytest.fixture(scope="module", autouse=True)
def _stubbed() -> Iterator[None]:
    def reached(*_a: Any, **_k: Any) -> Any:
        raise Reached

    # relative paths land in the scratch directory, not in the checkout
    cwd = os.getcwd()
    os.chdir(_SCRATCH)
    with (
        mock.patch("tracer.pipeline.record.Recorder.run", reached),
        mock.patch("tracer.repro.Experiment.run", reached),
        mock.patch("tracer.agent.run.Agent", reached),
        mock.patch("tracer.postmortem.gather.gather", reached),
        # the report's charts take seconds; its writing (what is tested here) is kept
        mock.patch("tracer.outputs.report.render_html", lambda *_a: "<html></html>\n"),
        mock.patch("tracer.outputs.report._figures", lambda _t: [("x", 1.0, lambda _s: None)]),
    ):
        try:
            yield
        finally:
            os.chdir(cwd)


def _check(command: str, option: str, value: str) -> None:
    argv = _argv(command, option, value)
    r = CliRunner().invoke(main, argv)
    if isinstance(r.exception, Reached):
        return  # every value accepted: the stage that needs root was reached
    assert r.exception is None or isinstance(r.exception, SystemExit), (argv, r.exc_info)
    assert "Traceback" not in r.output, (argv, r.output)
    assert r.exit_code in DOCUMENTED, (argv, r.exit_code, r.output)
    if r.exit_code == 0:
        return
    err = r.stderr
    assert err.startswith(("whyrestart: ", "Usage: ")), (argv, err)
    if r.exit_code == 2 and option != "TRACE":
        # a refusal names the option: click's ("Invalid value for '--x'") and ours
        names = re.findall(r"(?<![\w-])(-{1,2}[a-z][-a-z]*)", err)
        assert option in names or (option == "-o" and "--output" in names), (argv, err)


@pytest.mark.parametrize(
    ("command", "option"), [(c, o) for c, opts in OPTIONS.items() for o in opts]
)
def test_every_option_value_gets_a_clear_answer(command: str, option: str) -> None:
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(OPTIONS[command][option])
    def check(value: str) -> None:
        _check(command, option, value)

    check()


# -- the instances of issue 22 that the property covers, as plain tests ------------------------


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["record", "-o", "{fresh}", "--probe", "http://[::1/x", "--", "true"], "--probe"),
        (["repro", "--memory-max", "32M", "--probe", "http://[::1/x", "--", "true"], "--probe"),
        (["tail", "--probe", "tcp://[zz", "--", "true"], "--probe"),
        (["repro", "--memory-max", "32M", "--out-dir", _FILE, "--", "true"], "--out-dir"),
        (["repro", "--memory-max", "32M", "--out-dir", "/a/b/c", "--", "true"], "--out-dir"),
        (["record", "-o", "{fresh}", "--duration", "nan", "--", "true"], "--duration"),
        (["record", "-o", "{fresh}", "--duration", "inf", "--", "true"], "--duration"),
        (["record", "-o", "{fresh}", "--duration", "1e400", "--", "true"], "--duration"),
        (["record", "-o", "{fresh}", "--probe-interval", "abc", "--", "true"], "--probe-interval"),
        (["record", "-o", "{fresh}", "--cgroup", "/x/../..", "--", "true"], "--cgroup"),
        (["record", "-o", "/dev/null", "--force", "--", "true"], "--output"),
        (["record", "-o", _FIFO, "--force", "--", "true"], "--output"),
        (["tail", "--redact", "--", "true"], "--redact"),
    ],
)
def test_findings_2_and_9_are_refused_naming_the_option(argv: list[str], option: str) -> None:
    argv = [a.replace("{fresh}", os.path.join(_SCRATCH, "f.trace")) for a in argv]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 2, (argv, r.output)
    assert option in r.stderr and "Traceback" not in r.output


def test_force_on_a_device_says_why_it_is_refused() -> None:
    """Finding 8: `-o /dev/null --force` said "it exists ... replace it with --force"."""
    r = CliRunner().invoke(main, ["record", "-o", "/dev/null", "--force", "--", "true"])
    assert "/dev/null is a character device" in r.stderr
    assert "--force replaces only those" in r.stderr


def test_probe_options_need_a_probe() -> None:
    r = CliRunner().invoke(
        main, ["record", "-o", os.path.join(_SCRATCH, "p.trace"), "--probe-timeout", "2s",
               "--", "true"],
    )  # fmt: skip
    assert r.exit_code == 2 and "--probe-timeout need --probe" in r.stderr


def test_duration_takes_the_units_probe_options_take() -> None:
    """Finding 9: `--duration 5s` was refused while `--probe-interval 2s` was accepted."""
    for value in ("5s", "500ms", "5"):
        r = CliRunner().invoke(main, ["record", "-o", os.path.join(_SCRATCH, "d.trace"),
                                      "--duration", value, "--", "true"])  # fmt: skip
        assert isinstance(r.exception, Reached), (value, r.output)


def test_tail_without_a_target_says_nothing_to_watch() -> None:
    r = CliRunner().invoke(main, ["tail"])
    assert r.exit_code == 2 and "nothing to watch" in r.stderr and "record" not in r.stderr


def test_cgroup_paths_are_normalised() -> None:
    from tracer.options import normalise_cgroup

    root = "/sys/fs/cgroup/memory"
    assert normalise_cgroup("/sys/fs/cgroup/memory/x", root) == "/x"
    assert normalise_cgroup("/sys/fs/cgroup/memory", root) == "/"
    assert normalise_cgroup("x/./y/", root) == "/x/y"
    assert normalise_cgroup("/x/../y", root) == "/y"
    assert normalise_cgroup("//x", root) == "/x"


def test_replay_json_follows_tail_and_verdicts_only() -> None:
    """Finding 9: `replay --json --tail` printed text; `--json --verdicts-only` carried every
    event."""
    r = CliRunner().invoke(main, ["replay", "--json", "--tail", str(DATA / "reclaim_v1_oom.trace")])
    lines = r.stdout.splitlines()
    assert r.exit_code == 0 and lines
    assert all(set(orjson.loads(line)) == {"ts", "severity", "text"} for line in lines)
    r = CliRunner().invoke(main, ["replay", "--json", "--verdicts-only", TRACE])
    doc = orjson.loads(r.stdout)
    assert "events" not in doc and len(doc["verdicts"]) == 5


@pytest.mark.parametrize(
    ("trace", "html"),
    [("z.trace.zst", "z.html"), ("z.trace", "z.html"), ("z.zst", "z.html"), ("z", "z.html")],
)
def test_report_default_output_drops_the_trace_suffixes(trace: str, html: str) -> None:
    from tracer.cli import default_report_path

    assert default_report_path(trace) == html


@pytest.mark.parametrize("option", ["-o", "--png"])
def test_report_refuses_to_overwrite_its_own_trace(option: str) -> None:
    """`report T --png T` wrote a PNG over the trace it read."""
    before = Path(_TRACE_COPY).read_bytes()
    argv = ["report", _TRACE_COPY, option, _TRACE_COPY]
    if option == "--png":
        argv += ["-o", os.path.join(_SCRATCH, "r.html")]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 2 and "is the trace being read" in r.stderr and option in r.stderr
    assert Path(_TRACE_COPY).read_bytes() == before
    r = CliRunner().invoke(main, ["export", _TRACE_COPY, "-o", _TRACE_COPY])
    assert r.exit_code == 2 and "is the trace being read" in r.stderr
    assert Path(_TRACE_COPY).read_bytes() == before


def test_repro_out_dir_is_made_like_record_makes_its_file() -> None:
    """Finding 2/9: `--out-dir /proc/foo` was a FileNotFoundError traceback, an existing file a
    FileExistsError, and `/a/b/c` made the whole path where record refuses a missing directory.
    """
    from tracer.errors import OutputError, UsageError
    from tracer.repro.run import _make_out_dir

    with pytest.raises(OutputError, match="--out-dir /proc/foo: cannot make the directory"):
        _make_out_dir("/proc/foo")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        _make_out_dir(_FILE)
    missing = os.path.join(_SCRATCH, "no", "such")
    with pytest.raises(UsageError, match=f"directory {os.path.dirname(missing)} does not exist"):
        _make_out_dir(missing)
    assert not os.path.exists(os.path.dirname(missing))
    made = os.path.join(_SCRATCH, "runs")
    _make_out_dir(made)
    assert os.path.isdir(made)
    _make_out_dir(made)  # an existing directory without run traces is reused


def test_the_property_covers_every_option_of_every_subcommand() -> None:
    """A new subcommand or option joins the property test, or this fails."""
    import click

    for name, cmd in main.commands.items():
        wanted = {
            "TRACE" if isinstance(p, click.Argument) else p.opts[0]
            for p in cmd.params
            if not (isinstance(p, click.Option) and p.is_flag) and p.name not in ("help", "command")
        }
        assert wanted == set(OPTIONS.get(name, {})), name
