"""``whyrestart record`` and ``tail``: watching live through the pipeline's ``Recorder``, to a
trace file or to one line per event; the target options both take, and their printers."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click
import orjson

from tracer import safetext
from tracer.analysis.analyzer import Verdict
from tracer.cli.common import LIFECYCLE, NOT_KEPT, F, _friendly, _text, _verdicts_json, _warn, main
from tracer.errors import UsageError
from tracer.events import Event
from tracer.options import CGROUP, DURATION, PROBE, check_output_file
from tracer.outputs.tail import TailLine
from tracer.outputs.text import Clock, verdict_table


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


# What to watch: processes, cgroups, containers, units, pods, the whole host.
_TARGET_OPTIONS = [
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
        help="Watch a container by name or id, across its restarts (podman, Docker; repeatable).",
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
]

# How to tell a probe kill: the health probes and the supervisors whose kills count.
_PROBE_OPTIONS = [
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
]

_DURATION_OPTION = click.option(
    "--duration",
    type=DURATION,
    default=None,
    help="Stop after this long (seconds: 600, 600s, 500ms).",
)


def target_options(fn: F) -> F:
    """The options that say what to watch, shared by record and tail, in --help's order:
    the targets, their health probes, how long."""
    for opt in reversed([*_TARGET_OPTIONS, *_PROBE_OPTIONS, _DURATION_OPTION]):
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
                            | ({"thrash": line.thrash.to_json()} if line.thrash else {})
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
