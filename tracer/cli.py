"""The ``whyrestart`` command line: doctor, record, replay.

Each subcommand is a thin shell over a module that does the work; every ``WhyrestartError`` is
printed as ``whyrestart: <message>`` plus its fix and ends the process with that error's exit
code, never a traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import orjson

from tracer import __version__
from tracer.analysis.pressure import TailLine
from tracer.analysis.verdicts import Analyzer, Verdict
from tracer.errors import UsageError, WhyrestartError
from tracer.events import CgroupInfo, Event
from tracer.render import Clock, timeline, verdict_table

F = TypeVar("F", bound=Callable[..., Any])


def _friendly(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except WhyrestartError as exc:
            click.echo(f"whyrestart: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="whyrestart")
def main() -> None:
    """Why did my process or container restart? eBPF evidence, one verdict per exit."""


# -- doctor --------------------------------------------------------------------------------


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_friendly
def doctor(as_json: bool) -> None:
    """Check that this machine can record, and which rung each hook attaches with."""
    from tracer.doctor import can_record, run_checks

    checks, facts = run_checks()
    ok = can_record(checks)
    if as_json:
        click.echo(
            _dumps(
                {
                    "schema": 1,
                    "ok": ok,
                    "facts": facts,
                    "checks": [
                        {
                            "name": c.name,
                            "ok": c.ok,
                            "detail": c.detail,
                            "fix": c.fix,
                            "required": c.required,
                        }
                        for c in checks
                    ],
                }
            )
        )
    else:
        for c in checks:
            mark = "ok  " if c.ok else ("FAIL" if c.required else "warn")
            click.echo(f"[{mark}] {c.name:18} {c.detail}")
            if not c.ok and c.fix:
                click.echo(f"       {'':18} fix: {c.fix}")
        click.echo("\nready to record" if ok else "\ncannot record: fix the FAIL lines above")
    sys.exit(0 if ok else 4)


# -- record --------------------------------------------------------------------------------


def _status_printer() -> Callable[[str, bool], None]:
    tty = sys.stderr.isatty()
    last = [0.0]

    def show(line: str, final: bool) -> None:
        import time

        if tty:
            click.echo("\r\x1b[2K" + line + ("\n" if final else ""), err=True, nl=False)
        else:
            now = time.monotonic()
            if final or now - last[0] >= 10:
                last[0] = now
                click.echo(line, err=True)

    return show


@main.command(context_settings={"ignore_unknown_options": False})
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="Trace file to write (JSON lines; .zst to compress).",
)
@click.option(
    "--pid",
    "pids",
    type=int,
    multiple=True,
    help="Watch this process and its descendants (repeatable).",
)
@click.option(
    "--cgroup",
    "cgroups",
    multiple=True,
    help="Watch every process in this memory "
    "cgroup or below, e.g. /system.slice/x.service (repeatable).",
)
@click.option("--all", "all_", is_flag=True, help="Watch every process on the host.")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON at the end.")
@click.option("-q", "--quiet", is_flag=True, help="No status line.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_friendly
def record(
    output: str,
    pids: tuple[int, ...],
    cgroups: tuple[str, ...],
    all_: bool,
    duration: float | None,
    as_json: bool,
    quiet: bool,
    command: tuple[str, ...],
) -> None:
    """Record exits, signals and OOM kills to a trace file; print a verdict per exit.

    \b
    Examples:
      sudo whyrestart record -o run1.trace -- python serve.py
      sudo whyrestart record -o run2.trace --cgroup /system.slice/llama.service
      sudo whyrestart record -o run3.trace --pid 4242 --duration 600
    """
    from tracer.record import Recorder, Targets

    if duration is not None and duration <= 0:
        raise UsageError("--duration must be positive")
    targets = Targets(pids=list(pids), cgroups=list(cgroups), all=all_, command=list(command))
    rec = Recorder(output, targets, duration=duration, status=None if quiet else _status_printer())
    result = rec.run()
    for w in result.warnings:
        click.echo(f"whyrestart: warning: {w}", err=True)
    clock = Clock(result.header.started_ns, result.header.clock_offset_ns)
    if as_json:
        click.echo(_verdicts_json(result.verdicts, clock))
    else:
        click.echo(
            verdict_table(
                result.verdicts,
                clock,
                restarts=result.restarts,
                restart_counts=result.restart_counts,
            ),
            nl=False,
        )
        click.echo(
            f"\ntrace written to {result.path} ({result.reason}); replay it with: "
            f"whyrestart replay {result.path}",
            err=True,
        )
    if result.command_status is not None:
        sys.exit(result.command_status)


def _verdicts_json(verdicts: list[Verdict], clock: Clock) -> str:
    return _dumps(
        {"schema": 1, "verdicts": [{**v.to_json(), "t": clock.rel(v.ts)} for v in verdicts]}
    )


# -- tail ----------------------------------------------------------------------------------

_COLOURS = {"info": "", "warn": "\x1b[33m", "crit": "\x1b[1;31m"}


def _tail_printer(clock_holder: list[Clock], as_json: bool) -> Any:
    colour = sys.stdout.isatty() and not as_json

    def show(lines: list[TailLine]) -> None:
        for line in lines:
            if as_json:
                click.echo(
                    orjson.dumps(
                        {"ts": line.ts, "severity": line.severity, "text": line.text}
                    ).decode()
                )
                continue
            t = clock_holder[0].wall(line.ts) if clock_holder else str(line.ts)
            text = f"{t}  {line.text}"
            if colour and _COLOURS[line.severity]:
                text = f"{_COLOURS[line.severity]}{text}\x1b[0m"
            click.echo(text)
        sys.stdout.flush()

    return show


@main.command()
@click.option(
    "--pid",
    "pids",
    type=int,
    multiple=True,
    help="Watch this process and its descendants (repeatable).",
)
@click.option("--cgroup", "cgroups", multiple=True, help="Watch a memory cgroup and below.")
@click.option("--all", "all_", is_flag=True, help="Watch every process on the host.")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_friendly
def tail(
    pids: tuple[int, ...],
    cgroups: tuple[str, ...],
    all_: bool,
    duration: float | None,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Live memory-pressure events, one line each: stalls, limits, PSI, OOM kills, verdicts.

    Nothing is written to disk; use `record` to keep a trace (`replay --tail` shows the same
    lines from it).
    """
    from tracer.analysis.pressure import PressureFeed
    from tracer.record import Recorder, Targets

    targets = Targets(pids=list(pids), cgroups=list(cgroups), all=all_, command=list(command))
    clock: list[Clock] = []
    show = _tail_printer(clock, as_json)
    rec: Recorder

    def path_of(cid: int) -> str | None:
        return rec.analyzer.cgroup_path(cid)

    feed = PressureFeed(path_of)

    def on_event(ev: Event | None, verdicts: list[Verdict]) -> None:
        if not clock and rec.header is not None:
            clock.append(Clock(rec.header.started_ns, rec.header.clock_offset_ns))
        show(feed.feed(ev, verdicts))

    rec = Recorder(None, targets, duration=duration, on_event=on_event)
    result = rec.run()
    show(feed.flush(result.header.started_ns if not clock else clock[0].start_ns))
    for w in result.warnings:
        click.echo(f"whyrestart: warning: {w}", err=True)


# -- replay --------------------------------------------------------------------------------


@main.command()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Events and verdicts as JSON.")
@click.option("--verdicts-only", is_flag=True, help="Skip the event timeline.")
@click.option("--tail", "as_tail", is_flag=True, help="Show the lines `tail` showed live.")
@_friendly
def replay(trace: str, as_json: bool, verdicts_only: bool, as_tail: bool) -> None:
    """Replay a trace file (no root needed): the timeline, then one verdict per exit."""
    from tracer.trace.reader import TraceReader

    reader = TraceReader(trace)
    header = reader.header
    clock = Clock(header.started_ns, header.clock_offset_ns)
    analyzer = Analyzer()
    events: list[Event] = []

    def fed() -> Any:
        for ev in reader:
            analyzer.feed(ev)
            if as_json:
                events.append(ev)
            yield ev

    def path_of(cid: int) -> str | None:
        return analyzer.cgroup_path(cid)

    if as_tail:
        from tracer.analysis.pressure import PressureFeed

        feed = PressureFeed(path_of)
        show = _tail_printer([clock], False)
        last = header.started_ns
        for ev in reader:
            show(feed.feed(ev, analyzer.feed(ev)))
            last = ev.ts
        show(feed.feed(None, analyzer.finish()))
        show(feed.flush(last))
        for w in reader.warnings:
            click.echo(f"whyrestart: warning: {w}", err=True)
        return
    if as_json:
        for _ in fed():
            pass
        analyzer.finish()
        click.echo(
            _dumps(
                {
                    "schema": 1,
                    "header": header.to_record(),
                    "events": [e.to_record() for e in events if not isinstance(e, CgroupInfo)],
                    "cgroups": {str(k): v.path for k, v in analyzer.cgroups.items()},
                    "verdicts": [{**v.to_json(), "t": clock.rel(v.ts)} for v in analyzer.verdicts],
                    "restarts": [r.to_json() for r in analyzer.restarts],
                    "warnings": reader.warnings,
                    "footer": reader.footer.to_record() if reader.footer else None,
                }
            )
        )
        return
    if verdicts_only:
        for _ in fed():
            pass
    else:
        for line in timeline(fed(), clock, path_of):
            click.echo(line)
        click.echo()
    analyzer.finish()
    for w in reader.warnings:
        click.echo(f"whyrestart: warning: {w}", err=True)
    click.echo(
        verdict_table(
            analyzer.verdicts,
            clock,
            restarts=analyzer.restarts,
            restart_counts=analyzer.restart_counts(),
        ),
        nl=False,
    )


# -- explain -------------------------------------------------------------------------------


@main.command()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Verdicts and restarts as JSON.")
@click.option("--pid", "pids", type=int, multiple=True, help="Only this process (repeatable).")
@click.option(
    "--unit",
    "units",
    multiple=True,
    help="Only this unit (container, service, command), as shown in the unit column (repeatable).",
)
@_friendly
def explain(trace: str, as_json: bool, pids: tuple[int, ...], units: tuple[str, ...]) -> None:
    """Why each watched process ended: the verdict table, then each verdict's evidence."""
    from tracer.trace.reader import TraceReader

    reader = TraceReader(trace)
    clock = Clock(reader.header.started_ns, reader.header.clock_offset_ns)
    analyzer = Analyzer()
    analyzer.feed_all(reader)
    verdicts = [
        v
        for v in analyzer.verdicts
        if (not pids or v.pid in pids) and (not units or v.unit in units)
    ]
    restarts = [r for r in analyzer.restarts if not units or r.unit in units]
    if (pids or units) and not verdicts:
        raise UsageError(
            "no verdict matches "
            + " ".join([f"--pid {p}" for p in pids] + [f"--unit {u!r}" for u in units]),
            "run `whyrestart explain FILE` to list every pid and unit",
        )
    for w in reader.warnings:
        click.echo(f"whyrestart: warning: {w}", err=True)
    if as_json:
        click.echo(
            _dumps(
                {
                    "schema": 1,
                    "verdicts": [{**v.to_json(), "t": clock.rel(v.ts)} for v in verdicts],
                    "restarts": [r.to_json() for r in restarts],
                }
            )
        )
    else:
        counts = [c for c in analyzer.restart_counts() if not units or c[0] in units]
        click.echo(
            verdict_table(verdicts, clock, restarts=restarts, restart_counts=counts), nl=False
        )


if __name__ == "__main__":  # pragma: no cover
    main()
