"""``whyrestart repro``: one recorded run per value of one setting, compared
(``tracer.repro`` plans and runs them)."""

from __future__ import annotations

import sys
from typing import Any

import click

from tracer import safetext
from tracer.cli.common import LIFECYCLE, F, _dumps, _friendly, _text, main
from tracer.options import CGROUP, DURATION, OUTPUT_DIR, Checked, SettingList
from tracer.parse import values


def _parse_probe(text: str) -> object:
    from tracer.sources.probes import parse_probe

    return parse_probe(text)


# The one setting varied, its values, and how many runs each value gets.
_SETTING_OPTIONS = [
    click.option(
        "--memory-max",
        type=SettingList("--memory-max"),
        default=None,
        help="Memory limits to try, e.g. 64M,128M,256M.",
    ),
    click.option(
        "--memory-high",
        type=SettingList("--memory-high"),
        default=None,
        help="memory.high values to try (cgroup v2 only).",
    ),
    click.option(
        "--probe-timeout",
        type=SettingList("--probe-timeout", durations=True),
        default=None,
        help="Probe timeouts to try, e.g. 0.5,1s,2s (needs --probe).",
    ),
    click.option(
        "--runs",
        "repeats",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="Runs per value.",
    ),
]

# The liveness probe each run gets, as a kubelet's would.
_PROBE_OPTIONS = [
    click.option(
        "--probe",
        type=Checked("probe", _parse_probe),
        default=None,
        help="http://HOST:PORT/PATH, tcp://HOST:PORT or exec:CMD.",
    ),
    click.option(
        "--probe-data",
        default=None,
        metavar="BODY",
        help="POST this body with the http probe (JSON is sent as application/json), so the "
        'probe does real work, e.g. \'{"prompt": "Hi", "n_predict": 1}\'. A run '
        "whose probes fail without a kill is degraded, not survived.",
    ),
    click.option(
        "--probe-interval",
        type=Checked("duration", values.parse_duration),
        default=None,
        help="Time between probes (default 1s).",
    ),
    click.option(
        "--probe-failures",
        type=click.IntRange(min=0),
        default=3,
        show_default=True,
        help="Kill the workload after this many failed probes in a row, like a liveness probe "
        "(0: never).",
    ),
    click.option(
        "--probe-delay",
        type=Checked("duration", values.parse_duration),
        default=None,
        help="Wait this long before the first probe.",
    ),
]

# Each run's length, where its trace goes, where its cgroup is made.
_RUN_OPTIONS = [
    click.option(
        "--duration", type=DURATION, default=None, help="End each run after this long (120, 2s)."
    ),
    click.option(
        "--out-dir",
        type=OUTPUT_DIR,
        default=None,
        help="Directory for the traces, made if missing (its parent must exist; default "
        "./repro-<timestamp>).",
    ),
    click.option(
        "--parent-cgroup",
        type=CGROUP,
        default=None,
        help="Memory cgroup under which each run's cgroup is made (default: beside/under ours).",
    ),
]


def _repro_options(fn: F) -> F:
    """repro's options, in --help's order: the setting, the probe, the runs."""
    for opt in reversed([*_SETTING_OPTIONS, *_PROBE_OPTIONS, *_RUN_OPTIONS]):
        fn = opt(fn)
    return fn


@main.command(context_settings={"ignore_unknown_options": False}, epilog=LIFECYCLE)
@_repro_options
@click.option("--json", "as_json", is_flag=True, help="The comparison as JSON (schema 1).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@_friendly
def repro(as_json: bool, **options: Any) -> None:
    """Run a workload once per value of ONE setting, each run in a fresh memory cgroup and
    recorded to its own trace; compare the runs and name the smallest value that survived.

    Sizes: 64M, 1G, 512Mi or bytes (K/M/G/T are powers of 1024, as in docker --memory).
    Every run has a memory limit (the one varied, --memory-max, or 80% of the host's available
    memory), so no run can exhaust the host. Needs root.

    \b
    Examples:
      sudo whyrestart repro --memory-max 512M,1G,2G -- python serve.py --load test
      sudo whyrestart repro --memory-high 256M,512M --memory-max 1G -- ./hog
      sudo whyrestart repro --probe-timeout 0.5,1,2 --probe http://127.0.0.1:8000/health \\
          --memory-max 1G --duration 120 -- python serve.py
      sudo whyrestart repro --memory-max 160M,512M,1G --duration 60 --probe-failures 0 \\
          --probe http://127.0.0.1:8080/completion \\
          --probe-data '{"prompt": "Hi", "n_predict": 1}' -- ./serve-with-load.sh

    A run that nothing killed but whose probes failed once it had answered, or whose page
    cache was re-read from disk as fast as it could hold it (mapped model weights under a
    limit below them), is degraded, and its value is never named the one that survived.
    """
    from tracer.repro import Experiment, Options, make_plan
    from tracer.sources.cgroupfs import CgroupLayout

    layout = CgroupLayout.from_system()
    # click names each keyword after its option, as Options names its fields.
    plan = make_plan(Options(**options), memory_version=layout.memory_version)

    def progress(line: str) -> None:
        click.echo(safetext.field(line), err=True)

    comparison = Experiment(plan, progress, layout=layout).run()
    if as_json:
        click.echo(_dumps(comparison.to_json()))
    else:
        _text(comparison.table(), nl=False)
    if comparison.stop_signal is not None:
        sys.exit(128 + comparison.stop_signal)
