"""``whyrestart doctor``: whether this machine can record, and the rung each hook attaches
with (the checks are ``tracer.doctor``'s)."""

from __future__ import annotations

import sys

import click

from tracer import safetext
from tracer.cli.common import _dumps, _friendly, _text, main


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
