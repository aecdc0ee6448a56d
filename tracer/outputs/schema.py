"""The JSON Schema (draft 2020-12) of a verdict object, as ``replay --json``, ``explain
--json``, ``record --json`` and ``postmortem --json`` print it (``Verdict.to_json()`` plus
``"t"``), and of ``explain --json``'s document. A test validates real output against it, and
it has no room for fields it does not name: a field added to ``Verdict`` must be added here.
"""

from __future__ import annotations

from typing import Any

from tracer.analysis.findings import CAUSES, CONFIDENCES
from tracer.analysis.senders import ROLES

_INT = {"type": "integer"}
_STR = {"type": "string"}
_OPT_INT = {"type": ["integer", "null"]}
_OPT_STR = {"type": ["string", "null"]}

VERDICT: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["ts", "pid", "comm", "cause", "confidence", "summary", "advice", "evidence"],
    "properties": {
        "t": {"type": ["string", "number"]},  # relative time ("+1.234s") or wall-clock (ISO)
        "ts": _INT,  # the exit, CLOCK_BOOTTIME ns
        "pid": _INT,
        "comm": _STR,  # exact, as the process named itself (text outputs escape it)
        "cause": {"enum": list(CAUSES)},
        "confidence": {"enum": list(CONFIDENCES)},
        "summary": _STR,
        "advice": _STR,
        "evidence": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["ts", "what"],
                "properties": {"ts": _INT, "what": _STR},
            },
        },
        "disagreements": {"type": "array", "items": _STR},
        "unit": _OPT_STR,  # "docker web", "podman llm", "llama.service", ...
        "main": {"type": "boolean"},  # the unit's main process: its end is a restart
        "start_ns": _OPT_INT,  # the process's start (CLOCK_BOOTTIME ns)
        "exit_code": _OPT_INT,
        "signal": _OPT_STR,  # "SIGKILL"
        "sender_pid": _OPT_INT,
        "sender_comm": _OPT_STR,
        "sender_role": {"enum": [*ROLES, None]},
        "limit_cgroup": _OPT_STR,
        "limit_scope": {"enum": ["own", "ancestor", None]},
        "limit_bytes": _OPT_INT,
        "usage_bytes": _OPT_INT,
        "peak_bytes": _OPT_INT,
        "peak_ts": _OPT_INT,
        "breakdown": {"type": "object", "additionalProperties": _INT},  # anon, file, shmem...
        "stall_ns": _OPT_INT,  # reclaim + throttling stall time in the minute before
        "host_available": _OPT_INT,  # MemAvailable at the kill (bytes)
        "sender_exe": _OPT_STR,  # the sender's executable, when the recording saw it
        "probe_failures": {"type": "integer", "minimum": 0},  # failing in a row up to the exit
    },
}

RESTART: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["ts", "unit", "old_pid", "new_pid", "downtime_ns", "cause"],
    "properties": {
        "ts": _INT,
        "unit": _STR,
        "old_pid": _INT,
        "new_pid": _INT,
        "downtime_ns": _INT,
        "cause": {"enum": list(CAUSES)},
        "carried_bytes": _INT,  # memory already charged when the new run started
        "carried": _STR,
    },
}

EXPLAIN: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "whyrestart explain --json (schema 1)",
    "type": "object",
    "additionalProperties": False,
    "required": ["schema", "verdicts", "restarts", "verdicts_not_kept"],
    "properties": {
        "schema": {"const": 1},
        "verdicts": {"type": "array", "items": VERDICT},
        "restarts": {"type": "array", "items": RESTART},
        "verdicts_not_kept": {"type": "integer", "minimum": 0},
    },
}
