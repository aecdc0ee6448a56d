"""The ``whyrestart`` command line: doctor, record, replay.

Each subcommand is a thin shell over a module that does the work; every ``WhyrestartError`` is
printed as ``whyrestart: <message>`` plus its fix and ends the process with that error's exit
code, never a traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import click
import orjson

from tracer import __version__, safetext
from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.errors import UsageError, WhyrestartError
from tracer.events import CgroupInfo, Event
from tracer.options import (
    CGROUP,
    DURATION,
    OUTPUT_DIR,
    OUTPUT_FILE,
    PROBE,
    TRACE,
    Checked,
    SettingList,
    check_not_input,
    check_output_file,
)
from tracer.outputs.tail import TailLine
from tracer.outputs.text import Clock, timeline, verdict_table
from tracer.parse import values

if TYPE_CHECKING:
    from tracer.trace.reader import TraceReader

F = TypeVar("F", bound=Callable[..., Any])


def _friendly(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except WhyrestartError as exc:
            click.echo(f"whyrestart: {safetext.block(str(exc))}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            # a SIGINT outside the recording loop (which handles its own): no traceback
            click.echo("whyrestart: interrupted by SIGINT", err=True)
            sys.exit(128 + 2)

    return wrapper  # type: ignore[return-value]


def analyzer_for(header: Any, every_verdict: bool = False) -> Analyzer:
    """The analyzer a replay needs: the same settings the recording had (``Analyzer.
    from_header``, as the recorder and the timeline build theirs). ``every_verdict``: for a
    caller that reads what ``feed`` returns, not only the kept verdicts."""
    return Analyzer.from_header(header.targets, every_verdict=every_verdict)


def _dumps(obj: Any) -> str:
    return safetext.json_text(
        orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()
    )


def _warn(warning: str) -> None:
    # warnings quote what they could not read: kernel log lines, names, paths
    click.echo(f"whyrestart: warning: {safetext.field(warning)}", err=True)


def _text(text: str, err: bool = False, nl: bool = True) -> None:
    """Print text we laid out (its fields already escaped): the last guard at the terminal."""
    click.echo(safetext.block(text), err=err, nl=nl)


EXIT_CODES = """\b
Exit codes: 0 done; 1 other error; 2 bad usage (the message names the option);
3 needs root or a capability; 4 the kernel lacks a feature; 5 a BPF step failed;
6 a bad trace file; 7 writing an output failed (a full disk, a file system that makes no
files). record, tail and repro exit with the command's status instead (128+N when signal N
ended it), or 128+N when signal N stopped them."""

LIFECYCLE = """\b
The command runs in its own process group, in the terminal's foreground (Ctrl-C reaches it
once). When the recording ends first (--duration, or SIGINT/SIGTERM/SIGHUP to whyrestart), the
group gets that signal (SIGTERM for --duration), then 5 s for the command to exit, then SIGKILL
(at a second signal: at once)."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
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
            _text(f"[{mark}] {c.name:18} {safetext.field(c.detail)}")
            if not c.ok and c.fix:
                _text(f"       {'':18} fix: {safetext.field(c.fix)}")
        click.echo("\nready to record" if ok else "\ncannot record: fix the FAIL lines above")
    sys.exit(0 if ok else 4)


# -- record --------------------------------------------------------------------------------


def _status_printer() -> Callable[[str, bool], None]:
    tty = sys.stderr.isatty()
    last = [0.0]

    def show(line: str, final: bool) -> None:
        import time

        line = safetext.field(line)
        if tty:
            click.echo("\r\x1b[2K" + line + ("\n" if final else ""), err=True, nl=False)
        else:
            now = time.monotonic()
            if final or now - last[0] >= 10:
                last[0] = now
                click.echo(line, err=True)

    return show


def target_options(fn: F) -> F:
    """The options that say what to watch, shared by record and tail (long: one click option
    per kind of target, declared once here for both commands)."""
    opts = [
        click.option(
            "--pid",
            "pids",
            type=click.IntRange(min=1),
            multiple=True,
            help="Watch this process and its descendants (repeatable).",
        ),
        click.option(
            "--cgroup",
            "cgroups",
            type=CGROUP,
            multiple=True,
            help="Watch every process in this memory cgroup or below, e.g. "
            "/system.slice/x.service (repeatable).",
        ),
        click.option(
            "--container",
            "containers",
            multiple=True,
            help="Watch a container by name or id, across its restarts "
            "(podman, Docker; repeatable).",
        ),
        click.option(
            "--unit",
            "units",
            multiple=True,
            help="Watch a systemd unit, across its restarts and from before it starts "
            "(needs systemd as PID 1; repeatable).",
        ),
        click.option(
            "--pod",
            "pods",
            multiple=True,
            help="Watch a Kubernetes pod on this node, NS/NAME (all its containers, "
            "across restarts; repeatable).",
        ),
        click.option(
            "--runtime-endpoint",
            "runtime_endpoint",
            default=None,
            envvar="CONTAINER_RUNTIME_ENDPOINT",
            help="The node's CRI socket, as crictl's (unix:///run/containerd/containerd.sock): "
            "pods and their containers are named, and --pod found, through it "
            "[default: $CONTAINER_RUNTIME_ENDPOINT, else containerd's or CRI-O's socket].",
        ),
        click.option(
            "--all",
            "all_",
            is_flag=True,
            help="Watch every process on the host (its cgroups are sampled, not each process).",
        ),
        click.option(
            "--probe",
            "probes",
            type=PROBE,
            multiple=True,
            help="Health probe: http://HOST:PORT/PATH, tcp://HOST:PORT or exec:CMD (repeatable).",
        ),
        click.option(
            "--probe-interval",
            type=DURATION,
            default=None,
            help="Time between probes (0.5, 500ms, 2s; default 1s; needs --probe).",
        ),
        click.option(
            "--probe-timeout",
            type=DURATION,
            default=None,
            help="A probe slower than this failed (default 1s; needs --probe).",
        ),
        click.option(
            "--probe-failures",
            type=click.IntRange(min=1),
            default=None,
            help="A supervisor's kill after this many failed probes in a row is a probe kill "
            "(default 3, like Kubernetes' failureThreshold; needs --probe).",
        ),
        click.option(
            "--supervisor",
            "supervisors",
            type=click.IntRange(min=1),
            multiple=True,
            help="Pid of a supervisor whose kills count as stops/probe kills.",
        ),
        click.option(
            "--duration",
            type=DURATION,
            default=None,
            help="Stop after this long (seconds: 600, 600s, 500ms).",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def make_targets(kw: dict[str, Any], command: tuple[str, ...], verb: str = "record") -> Any:
    """Turn the target options into ``tracer.pipeline.record.Targets`` (bad input: UsageError)."""
    from tracer.pipeline.follow import ProbeSetup
    from tracer.pipeline.record import Targets

    if not (kw["pids"] or kw["cgroups"] or kw["all_"] or command or kw["containers"]) and not (
        kw["units"] or kw["pods"]
    ):
        raise UsageError(
            f"nothing to {verb}",
            "give a command after --, or --pid, --cgroup, --container, --unit, --pod or --all",
        )
    if not kw["probes"]:
        given = [
            o for o in ("probe_interval", "probe_timeout", "probe_failures") if kw[o] is not None
        ]
        if given:
            raise UsageError(
                " and ".join("--" + o.replace("_", "-") for o in given) + " need --probe",
                "say what to probe: --probe http://HOST:PORT/PATH, or drop them",
            )
    cgroups = list(kw["cgroups"])
    if kw["pods"]:
        from tracer.runtimes.kubernetes import resolve_pod
        from tracer.sources.cgroupfs import CgroupLayout, CgroupResolver

        layout = CgroupLayout.from_system()
        if layout.memory_root is None:
            raise UsageError("--pod: no memory cgroup controller is mounted here")
        resolver = CgroupResolver(layout)
        endpoint = kw.get("runtime_endpoint")
        cgroups += [resolve_pod(p, resolver, cri_endpoint=endpoint) for p in kw["pods"]]
    probes = None
    if kw["probes"]:
        probes = ProbeSetup(
            list(kw["probes"]),
            kw["probe_interval"] if kw["probe_interval"] is not None else 1.0,
            kw["probe_timeout"] if kw["probe_timeout"] is not None else 1.0,
        )
    return Targets(
        pids=list(kw["pids"]),
        cgroups=cgroups,
        all=kw["all_"],
        command=list(command),
        containers=list(kw["containers"]),
        units=list(kw["units"]),
        probes=probes,
        supervisor_pids=list(kw["supervisors"]),
        redact=kw.get("redact", False),
        probe_failures=kw["probe_failures"] or 3,
        runtime_endpoint=kw.get("runtime_endpoint"),
    )


@main.command(context_settings={"ignore_unknown_options": False}, epilog=LIFECYCLE)
@click.option(
    "-o",
    "--output",
    required=True,
    help="Trace file to write (JSON lines; .zst to compress).",
)
@target_options
@click.option("--redact", is_flag=True, help="Keep the recorded command line out of the trace.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON at the end.")
@click.option("-q", "--quiet", is_flag=True, help="No status line.")
@click.option("--force", is_flag=True, help="Replace an existing trace file at -o.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_friendly
def record(
    output: str, as_json: bool, quiet: bool, force: bool, command: tuple[str, ...], **kw: Any
) -> None:
    """Record exits, signals, OOM kills and memory pressure to a trace; a verdict per exit.

    \b
    Examples:
      sudo whyrestart record -o run1.trace -- python serve.py
      sudo whyrestart record -o run2.trace --container llm --probe http://127.0.0.1:8000/health
      sudo whyrestart record -o run3.trace --cgroup /system.slice/llama.service
      sudo whyrestart record -o run4.trace --pid 4242 --duration 600
    """
    from tracer.pipeline.record import Recorder

    try:
        check_output_file(output, overwrite=force, force_option="--force")
    except UsageError as exc:
        raise click.BadParameter(str(exc), param_hint="'-o' / '--output'") from None
    targets = make_targets(kw, command)
    rec = Recorder(
        output,
        targets,
        duration=kw["duration"],
        status=None if quiet else _status_printer(),
        overwrite=force,
    )
    result = rec.run()
    for w in result.warnings:
        _warn(w)
    clock = Clock(result.header.started_ns, result.header.clock_offset_ns)
    if as_json:
        click.echo(_verdicts_json(result.verdicts, clock))
    else:
        _text(
            verdict_table(
                result.verdicts,
                clock,
                restarts=result.restarts,
                restart_counts=result.restart_counts,
            ),
            nl=False,
        )
        if rec.analyzer.not_kept:
            click.echo(NOT_KEPT.format(rec.analyzer.not_kept))
        click.echo(
            f"\ntrace written to {result.path} ({result.reason}); replay it with: "
            f"whyrestart replay {result.path}",
            err=True,
        )
    sys.exit(result.exit_code)


NOT_KEPT = (
    "{} more verdicts were reached but not kept (bounded memory); `whyrestart replay "
    "--tail FILE` shows every one"
)


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
                    safetext.json_text(
                        orjson.dumps(
                            {"ts": line.ts, "severity": line.severity, "text": line.text}
                            | ({"eta": line.eta.to_json()} if line.eta is not None else {})
                        ).decode()
                    )
                )
                continue
            t = clock_holder[0].wall(line.ts) if clock_holder else str(line.ts)
            text = f"{t}  {safetext.field(line.text)}"
            if colour and _COLOURS[line.severity]:
                text = f"{_COLOURS[line.severity]}{text}\x1b[0m"
            click.echo(text)
        sys.stdout.flush()

    return show


@main.command(epilog=LIFECYCLE)
@target_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_friendly
def tail(as_json: bool, command: tuple[str, ...], **kw: Any) -> None:
    """Live memory-pressure events, one line each: stalls, limits, PSI, OOM kills, verdicts.

    Nothing is written to disk; use `record` to keep a trace (`replay --tail` shows the same
    lines from it).
    """
    from tracer.outputs.tail import feed_of
    from tracer.pipeline.record import Recorder

    targets = make_targets(kw, command, verb="watch")
    clock: list[Clock] = []
    show = _tail_printer(clock, as_json)
    rec: Recorder
    feed = feed_of(lambda: rec.analyzer)

    last = [0]  # the newest event's time: open storm windows close there at the end

    def on_event(ev: Event | None, verdicts: list[Verdict]) -> None:
        if not clock and rec.header is not None:
            clock.append(Clock(rec.header.started_ns, rec.header.clock_offset_ns))
        if ev is not None:
            last[0] = max(last[0], ev.ts)
        show(feed.feed(ev, verdicts))

    rec = Recorder(None, targets, duration=kw["duration"], on_event=on_event)
    result = rec.run()
    # (as replay --tail closes them: at the last event, not at the start of the recording)
    show(feed.flush(max(last[0], result.header.started_ns)))
    for w in result.warnings:
        _warn(w)
    sys.exit(result.exit_code)


# -- replay --------------------------------------------------------------------------------


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


# -- postmortem (tracer/postmortem) ---------------------------------------------------------


def postmortem_header(facts: Any) -> Any:
    """The header a post-mortem's analyzer is built from, as a recording's would be: the
    same ``analyzer_for`` then judges (no supervisor pids: none were given)."""
    import platform

    from tracer.sources.system import kernel_release
    from tracer.trace.format import TraceHeader

    return TraceHeader(
        tool_version=__version__,
        host=platform.node(),
        kernel=kernel_release(),
        cgroup={"hierarchy": facts.hierarchy},
        clock_offset_ns=facts.realtime_offset,
        hooks={},
        targets={"postmortem": {"kind": facts.target.kind, "spec": facts.target.spec}},
        started_ns=facts.since_ns,
    )


@main.command()
@click.option("--container", default=None, help="A container, by name or id (podman, Docker).")
@click.option("--unit", default=None, help="A systemd unit.")
@click.option("--pod", default=None, help="A Kubernetes pod on this node, NS/NAME.")
@click.option("--cgroup", default=None, help="A memory cgroup path, e.g. /system.slice/x.service.")
@click.option("--pid", default=None, help="A process id (the kernel log's OOM kills of it).")
@click.option("--all", "all_", is_flag=True, help="Every OOM kill the kernel log still holds.")
@click.option(
    "--since", default=None, help="Only exits this recent: 30m, 1h, 2d (default: all known)."
)
@click.option("--json", "as_json", is_flag=True, help="The post-mortem as JSON (schema 1).")
@_friendly
def postmortem(
    container: str | None,
    unit: str | None,
    pod: str | None,
    cgroup: str | None,
    pid: str | None,
    all_: bool,
    since: str | None,
    as_json: bool,
) -> None:
    """Why did it restart? Asked after the fact, with no recording: the kernel log's OOM
    reports, the memory cgroups' counters and limits now, and the runtime's record of the last
    exit, judged by the same rules as `replay`. Says what only a recording could know, and the
    command that records the next one.

    \b
    Examples:
      sudo whyrestart postmortem --container llm
      whyrestart postmortem --cgroup /system.slice/llama.service --since 2h --json
    """
    from tracer.postmortem import correlate, gather, report

    given = [
        (k, v)
        for k, v in (
            ("container", container),
            ("unit", unit),
            ("pod", pod),
            ("cgroup", cgroup),
            ("pid", pid),
            ("all", "" if all_ else None),
        )
        if v is not None
    ]
    if len(given) != 1:
        raise UsageError(
            "postmortem: name exactly one target",
            "--container NAME, --unit U, --pod NS/NAME, --cgroup PATH, --pid PID or --all",
        )
    kind, spec = given[0]
    since_s = values.parse_span("--since", since) if since else None
    facts = gather.gather(kind, spec, since_s)
    asm = correlate.assemble(facts)
    analyzer = analyzer_for(postmortem_header(facts))
    verdicts = analyzer.feed_all(asm.events)
    if as_json:
        click.echo(_dumps(report.to_json(facts, asm, verdicts)))
    else:
        _text(report.text(facts, asm, verdicts), nl=False)


# -- report, export, repro (tracer/outputs, tracer/repro.py) -------------------------------


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


def _parse_probe(text: str) -> object:
    from tracer.sources.probes import parse_probe

    return parse_probe(text)


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


@main.command(context_settings={"ignore_unknown_options": False}, epilog=LIFECYCLE)
@click.option(
    "--memory-max",
    type=SettingList("--memory-max"),
    default=None,
    help="Memory limits to try, e.g. 64M,128M,256M.",
)
@click.option(
    "--memory-high",
    type=SettingList("--memory-high"),
    default=None,
    help="memory.high values to try (cgroup v2 only).",
)
@click.option(
    "--probe-timeout",
    type=SettingList("--probe-timeout", durations=True),
    default=None,
    help="Probe timeouts to try, e.g. 0.5,1s,2s (needs --probe).",
)
@click.option(
    "--runs",
    "repeats",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Runs per value.",
)
@click.option(
    "--probe",
    type=Checked("probe", _parse_probe),
    default=None,
    help="http://HOST:PORT/PATH, tcp://HOST:PORT or exec:CMD.",
)
@click.option(
    "--probe-interval",
    type=Checked("duration", values.parse_duration),
    default=None,
    help="Time between probes (default 1s).",
)
@click.option(
    "--probe-failures",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Kill the workload after this many failed probes in a row, like a liveness probe "
    "(0: never).",
)
@click.option(
    "--probe-delay",
    type=Checked("duration", values.parse_duration),
    default=None,
    help="Wait this long before the first probe.",
)
@click.option(
    "--duration", type=DURATION, default=None, help="End each run after this long (120, 2s)."
)
@click.option(
    "--out-dir",
    type=OUTPUT_DIR,
    default=None,
    help="Directory for the traces, made if missing (its parent must exist; default "
    "./repro-<timestamp>).",
)
@click.option(
    "--parent-cgroup",
    type=CGROUP,
    default=None,
    help="Memory cgroup under which each run's cgroup is made (default: beside/under ours).",
)
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


# -- agent, history (tracer/agent) ---------------------------------------------------------


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
@click.option("--restarts", is_flag=True, help="List restarts instead of verdicts.")
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
    if as_json:
        click.echo(_dumps({"schema": 1, "state_dir": sd.path, "entries": rows}))
        return
    if not rows:
        _text(f"no {'restarts' if restarts else 'verdicts'} in {sd.journal}")
        return
    from tracer.agent.history import history_table

    _text(history_table(rows, restarts), nl=False)


if __name__ == "__main__":  # pragma: no cover
    main()
