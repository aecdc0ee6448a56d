"""``whyrestart agent`` and ``history``: the always-on recorder (``tracer.agent``) and what
its journal kept."""

from __future__ import annotations

import sys

import click

from tracer.cli.common import _dumps, _friendly, _text, main
from tracer.errors import UsageError
from tracer.parse import values


@main.command()
@click.option(
    "--state-dir",
    default=None,
    help="Where segments, incidents and the journal live "
    "(default $WHYRESTART_STATE_DIR or /var/lib/whyrestart).",
)
@click.option(
    "--max-disk", default="1G", show_default=True, help="Disk budget of the state dir: 20M, 1G."
)
@click.option(
    "--metrics-addr",
    default="127.0.0.1:9464",
    show_default=True,
    help="Serve Prometheus metrics on HOST:PORT at /metrics ('' for none).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json", "none"]),
    default="text",
    show_default=True,
    help="Each notable verdict on stdout: a text line, or one JSON line with OpenTelemetry "
    "attribute names.",
)
@click.option(
    "--retain",
    default="30m",
    show_default=True,
    help="How much recent history the segment ring keeps at full resolution.",
)
@click.option(
    "--series-ttl",
    default="10m",
    show_default=True,
    help="A vanished unit's metric series are removed after it has been quiet this long.",
)
@_friendly
def agent(
    state_dir: str | None,
    max_disk: str,
    metrics_addr: str,
    log_format: str,
    retain: str,
    series_ttl: str,
) -> None:
    """Run always on: every container and unit on the host, a verdict per notable exit and
    restart, kept in a journal (`whyrestart history`) with its evidence window as an incident
    trace (`whyrestart explain ID`), and served as Prometheus metrics.

    \b
    SIGTERM/SIGINT: flush and exit 0. SIGHUP: reopen the journal, apply the budget again.
    Examples:
      sudo whyrestart agent
      sudo whyrestart agent --state-dir /data/whyrestart --max-disk 200M --log-format json
    """
    from tracer.agent.run import Agent, AgentConfig
    from tracer.agent.state import default_state_dir
    from tracer.pipeline.record import preflight

    try:
        budget = values.parse_size(max_disk)
    except UsageError as exc:
        raise UsageError(f"--max-disk: {exc.message}", exc.fix) from None
    seconds = {}
    for name, text in (("--retain", retain), ("--series-ttl", series_ttl)):
        seconds[name] = values.parse_span(name, text)
    preflight()
    cfg = AgentConfig(
        state_dir=state_dir or default_state_dir(),
        max_disk=budget,
        metrics_addr=metrics_addr or None,
        log_format=log_format,
        retain_s=seconds["--retain"],
        series_ttl_s=seconds["--series-ttl"],
    )
    sys.exit(Agent(cfg).run())


@main.command()
@click.option("--state-dir", default=None, help="The agent's state dir (default as the agent's).")
@click.option("--since", default=None, help="Only verdicts this recent: 30m, 2h, 7d.")
@click.option("--unit", default=None, help="Only units whose name contains this.")
@click.option("--cause", default=None, help="Only this cause (cgroup_oom, probe_kill, ...).")
@click.option(
    "--restarts",
    is_flag=True,
    help="Each unit's crash loop instead of verdicts: runs, causes, how long each lived, peaks,"
    " back-off, and a leak that survives restarts; in full with --unit.",
)
@click.option("--json", "as_json", is_flag=True, help="The entries as JSON (schema 1).")
@_friendly
def history(
    state_dir: str | None,
    since: str | None,
    unit: str | None,
    cause: str | None,
    restarts: bool,
    as_json: bool,
) -> None:
    """What the agent concluded: every notable verdict (or restart) it reached, newest last,
    with the incident to open with `whyrestart explain ID`. Needs no root where the state dir
    is readable."""
    import os
    import time

    from tracer.agent.journal import read_journal, select
    from tracer.agent.state import StateDir, default_state_dir

    sd = StateDir(state_dir or default_state_dir())
    if not os.path.isdir(sd.path):
        raise UsageError(
            f"no agent state in {sd.path}",
            "start one with `sudo whyrestart agent`, or name its --state-dir",
        )
    try:
        entries = read_journal(sd.journal_old, sd.journal)
    except PermissionError:
        raise UsageError(f"cannot read {sd.journal}: permission denied", "run it as root") from None
    since_wall = time.time() - values.parse_span("--since", since) if since else None
    rows = select(
        entries,
        since_wall=since_wall,
        unit=unit,
        cause=cause,
        kind="restart" if restarts else "verdict",
    )
    if restarts:  # each unit's crash loop (tracer/agent/loops.py), with the restart entries
        from tracer.agent.loops import loops_json, loops_text

        scope = select(entries, since_wall=since_wall, unit=unit, kind=None)
        if as_json:
            doc = {"schema": 1, "state_dir": sd.path, "entries": rows, "loops": loops_json(scope)}
            click.echo(_dumps(doc))
        else:
            _text(loops_text(scope, detailed=unit is not None), nl=False)
        return
    if as_json:
        click.echo(_dumps({"schema": 1, "state_dir": sd.path, "entries": rows}))
        return
    if not rows:
        _text(f"no {'restarts' if restarts else 'verdicts'} in {sd.journal}")
        return
    from tracer.agent.history import history_table

    _text(history_table(rows, restarts), nl=False)
