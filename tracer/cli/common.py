"""What every ``whyrestart`` command shares: the click group ``main`` they register on, the
error-to-exit-code wrapper, the analyzer a trace is judged with, and the printing helpers
(text through ``safetext``, JSON, warnings).

Every ``WhyrestartError`` is printed as ``whyrestart: <message>`` plus its fix and ends the
process with that error's exit code, never a traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import orjson

from tracer import __version__, safetext
from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.errors import WhyrestartError
from tracer.outputs.text import Clock

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


NOT_KEPT = (
    "{} more verdicts were reached but not kept (bounded memory); `whyrestart replay "
    "--tail FILE` shows every one"
)


def _verdicts_json(verdicts: list[Verdict], clock: Clock) -> str:
    return _dumps(
        {"schema": 1, "verdicts": [{**v.to_json(), "t": clock.rel(v.ts)} for v in verdicts]}
    )
