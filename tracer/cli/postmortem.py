"""``whyrestart postmortem``: why it restarted, asked after the fact (``tracer.postmortem``
gathers, the same analyzer judges)."""

from __future__ import annotations

from typing import Any

import click

from tracer import __version__
from tracer.cli.common import _dumps, _friendly, _text, analyzer_for, main
from tracer.errors import UsageError
from tracer.parse import values


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
