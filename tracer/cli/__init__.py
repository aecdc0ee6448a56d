"""The ``whyrestart`` command line: one module per command group, each registering its
commands on the click group ``main`` (``tracer.cli.common``).

- ``doctor``: doctor (what this host can record)
- ``record``: record, tail (watching live; the target options they share)
- ``trace``: replay, explain, report, export (reading a trace file)
- ``postmortem``: postmortem (after the fact, no recording)
- ``repro``: repro (one run per value of a setting)
- ``agent``: agent, history (the always-on recorder and its journal)

``tracer.cli:main`` is the entry point (pyproject.toml's ``whyrestart`` script and
``python -m tracer.cli``); the exit codes are in ``common.EXIT_CODES``.
"""

from __future__ import annotations

# Importing a command module registers its commands on ``main``.
from tracer.cli import agent, doctor, postmortem, record, repro, trace
from tracer.cli.common import analyzer_for, main
from tracer.cli.postmortem import postmortem_header
from tracer.cli.record import _status_printer, _tail_printer
from tracer.cli.trace import default_report_path

__all__ = [
    "_status_printer",
    "_tail_printer",
    "agent",
    "analyzer_for",
    "default_report_path",
    "doctor",
    "main",
    "postmortem",
    "postmortem_header",
    "record",
    "repro",
    "trace",
]
