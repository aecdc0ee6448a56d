"""The commands that read a trace file (no root needed): ``replay``, ``explain``, ``report``
and ``export``, each judging it through the same analyzer a recording had."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from tracer.analysis.analyzer import Analyzer
from tracer.cli.common import NOT_KEPT, _dumps, _friendly, _text, _warn, analyzer_for, main
from tracer.cli.record import _tail_printer
from tracer.errors import UsageError
from tracer.events import CgroupInfo, Event
from tracer.options import OUTPUT_FILE, TRACE, check_not_input, check_output_file
from tracer.outputs.tail import TailLine
from tracer.outputs.text import Clock, timeline, verdict_table

if TYPE_CHECKING:
    from tracer.trace.reader import TraceReader


@main.command()
@click.argument("trace", type=TRACE)
@click.option("--json", "as_json", is_flag=True, help="Events and verdicts as JSON.")
@click.option("--verdicts-only", is_flag=True, help="Skip the event timeline.")
@click.option("--tail", "as_tail", is_flag=True, help="Show the lines `tail` showed live.")
@click.option(
    "--warnings",
    "as_warnings",
    is_flag=True,
    help="Only the time-to-limit warnings `tail` gave (with --json: each with its estimate).",
)
@_friendly
def replay(
    trace: str, as_json: bool, verdicts_only: bool, as_tail: bool, as_warnings: bool
) -> None:
    """Replay a trace file (no root needed): the timeline, then one verdict per exit."""
    from tracer.trace.reader import TraceReader

    reader = TraceReader(trace)
    header = reader.header
    clock = Clock(header.started_ns, header.clock_offset_ns)
    analyzer = analyzer_for(header, every_verdict=as_tail)
    if as_tail or as_warnings:
        _replay_tail(reader, analyzer, clock, as_json, warnings=as_warnings)
        return
    if as_json:
        _replay_json(reader, analyzer, clock, verdicts_only)
        return
    if verdicts_only:
        analyzer.feed_all(reader)
    else:
        for line in timeline(_fed(reader, analyzer), clock, analyzer.cgroup_path):
            click.echo(line)  # escaped line by line by timeline()
        click.echo()
        analyzer.finish()
    for w in [*reader.warnings, *analyzer.warnings]:
        _warn(w)
    _text(
        verdict_table(
            analyzer.verdicts,
            clock,
            restarts=analyzer.restarts,
            restart_counts=analyzer.restart_counts(),
        ),
        nl=False,
    )
    if analyzer.not_kept:
        click.echo(NOT_KEPT.format(analyzer.not_kept))


def _fed(
    reader: TraceReader, analyzer: Analyzer, kept: list[Event] | None = None
) -> Iterator[Event]:
    """The reader's events, each fed to the analyzer first (and kept in ``kept``)."""
    for ev in reader:
        analyzer.feed(ev)
        if kept is not None:
            kept.append(ev)
        yield ev


def _replay_tail(
    reader: TraceReader, analyzer: Analyzer, clock: Clock, as_json: bool, warnings: bool = False
) -> None:
    """replay --tail: the lines tail showed live (``warnings``: only its time-to-limit
    warnings, tracer/analysis/eta.py)."""
    from tracer.outputs.tail import feed_of

    feed = feed_of(lambda: analyzer)
    printer = _tail_printer([clock], as_json)

    def show(lines: list[TailLine]) -> None:
        printer([ln for ln in lines if ln.text.startswith("eta ")] if warnings else lines)

    last = reader.header.started_ns
    for ev in reader:
        show(feed.feed(ev, analyzer.feed(ev)))
        last = ev.ts
    show(feed.feed(None, analyzer.finish()))
    show(feed.flush(last))
    for w in [*reader.warnings, *analyzer.warnings]:
        _warn(w)


def _replay_json(
    reader: TraceReader, analyzer: Analyzer, clock: Clock, verdicts_only: bool
) -> None:
    """replay --json: one document (without the "events" key under --verdicts-only)."""
    events: list[Event] = []
    if verdicts_only:
        analyzer.feed_all(reader)
    else:
        for _ in _fed(reader, analyzer, events):
            pass
        analyzer.finish()
    events_doc = (
        {}
        if verdicts_only
        else {"events": [e.to_record() for e in events if not isinstance(e, CgroupInfo)]}
    )
    click.echo(
        _dumps(
            {
                "schema": 1,
                "header": reader.header.to_record(),
                **events_doc,
                "cgroups": {str(k): v.path for k, v in analyzer.cgroups.items()},
                "verdicts": [{**v.to_json(), "t": clock.rel(v.ts)} for v in analyzer.verdicts],
                "restarts": [r.to_json() for r in analyzer.restarts],
                "verdicts_not_kept": analyzer.not_kept,
                "warnings": [*reader.warnings, *analyzer.warnings],
                "footer": reader.footer.to_record() if reader.footer else None,
            }
        )
    )


# -- explain -------------------------------------------------------------------------------


@main.command()
@click.argument("trace", type=TRACE)
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
    analyzer = analyzer_for(reader.header)
    for ev in reader:
        analyzer.feed(ev)
    analyzer.finish()
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
    for w in [*reader.warnings, *analyzer.warnings]:
        _warn(w)
    if as_json:
        click.echo(
            _dumps(
                {
                    "schema": 1,
                    "verdicts": [{**v.to_json(), "t": clock.rel(v.ts)} for v in verdicts],
                    "restarts": [r.to_json() for r in restarts],
                    "verdicts_not_kept": analyzer.not_kept,
                }
            )
        )
    else:
        counts = [c for c in analyzer.restart_counts() if not units or c[0] in units]
        _text(verdict_table(verdicts, clock, restarts=restarts, restart_counts=counts), nl=False)


def default_report_path(trace: str) -> str:
    """report's default output: the trace's name with .html in place of .trace[.zst]."""
    for suffix in (".trace.zst", ".trace", ".zst"):
        if trace.endswith(suffix):
            return trace[: -len(suffix)] + ".html"
    return trace + ".html"


def _not_the_trace(trace: str, **outputs: str | None) -> None:
    for name, path in outputs.items():
        if path is None:
            continue
        try:
            check_not_input(path, trace)
        except UsageError as exc:
            hint = "'-o' / '--output'" if name == "output" else f"'--{name}'"
            raise click.BadParameter(str(exc), param_hint=hint) from None


@main.command()
@click.argument("trace", type=TRACE)
@click.option(
    "-o",
    "--output",
    type=OUTPUT_FILE,
    default=None,
    help="HTML file to write (self-contained: opens offline). Default: TRACE with .html "
    "in place of .trace or .trace.zst.",
)
@click.option(
    "--png",
    "png",
    type=OUTPUT_FILE,
    default=None,
    help="Also write the charts as one PNG image (for tickets).",
)
@_friendly
def report(trace: str, output: str | None, png: str | None) -> None:
    """A timeline report of a trace: memory against every nested limit, pressure, GPU,
    probes and kill/exit markers per unit, then each verdict with its evidence.

    \b
    Examples:
      whyrestart report run1.trace -o run1.html
      whyrestart report run1.trace -o run1.html --png run1.png
    """
    from tracer.outputs.report import write_report
    from tracer.outputs.timeline import load

    if output is None:
        output = default_report_path(trace)
        try:
            check_output_file(output)
        except UsageError as exc:
            raise click.BadParameter(f"the default {exc}", param_hint="'-o' / '--output'") from None
    _not_the_trace(trace, output=output, png=png)
    timeline = load(trace)
    for w in timeline.warnings:
        _warn(w)
    write_report(timeline, trace, output, png)
    click.echo(f"report written to {output}" + (f" and {png}" if png else ""), err=True)


@main.command()
@click.argument("trace", type=TRACE)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["perfetto"]),
    default="perfetto",
    show_default=True,
    help="perfetto: Chrome trace-event JSON for ui.perfetto.dev.",
)
@click.option("-o", "--output", required=True, type=OUTPUT_FILE, help="File to write.")
@_friendly
def export(trace: str, fmt: str, output: str) -> None:
    """Convert a trace for other tools: ``--format perfetto`` opens in ui.perfetto.dev, with a
    track per unit (counters for memory and limits, slices for stalls, instants for kills)."""
    from tracer.outputs.perfetto import write_perfetto
    from tracer.outputs.timeline import load

    _not_the_trace(trace, output=output)
    timeline = load(trace)
    for w in timeline.warnings:
        _warn(w)
    n = write_perfetto(timeline, trace, output)
    click.echo(
        f"{n} trace events written to {output} ({fmt}); open it in ui.perfetto.dev", err=True
    )
