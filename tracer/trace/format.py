"""The trace file format, version 1: its constants and the header and footer records.

A trace is JSON lines (written with orjson), optionally zstd-compressed as a sequence of frames:

* line 1, the header: ``{"t": "header", "schema": 1, "tool": "whyrestart", ...}`` (`TraceHeader`);
* then one line per event, ``Event.to_record()``, in time order;
* last, the footer: ``{"t": "footer", "ended_ns": ..., "counts": {...}, ...}`` (`TraceFooter`).
  A trace without a footer is a recording that did not finish (killed, crashed, disk full).

This module owns the vocabulary shared by `tracer.trace.writer` and `tracer.trace.reader`: the
schema version, the limits, and the two framing records with their validation. Events themselves
belong to `tracer.events`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

SCHEMA_VERSION = 1  # bump when a reader of the old version would misread the new one
TOOL_NAME = "whyrestart"
HEADER_KIND = "header"
FOOTER_KIND = "footer"

# A record longer than this is corruption, not data: the longest real record is a few KiB (an
# exec with a long filename). The cap bounds the reader's memory on a damaged or foreign file.
MAX_LINE_BYTES = 1 << 20

ZSTD_SUFFIX = ".zst"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # every zstd frame starts with it (RFC 8878 section 3.1.1)
GZIP_MAGIC = b"\x1f\x8b"


class FormatError(ValueError):
    """A header or footer record that is malformed; the message says which field and why."""


def json_type_name(value: object) -> str:
    """The JSON name of a decoded value's type, for messages about malformed records."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _take_int(rec: dict[str, Any], name: str) -> int:
    value = rec.get(name)
    # bool is an int subclass in Python, but JSON true is no count or timestamp.
    if type(value) is not int:
        raise FormatError(f"{name!r} must be an integer, got {json_type_name(value)}")
    return value


def _take_str(rec: dict[str, Any], name: str) -> str:
    value = rec.get(name)
    if not isinstance(value, str):
        raise FormatError(f"{name!r} must be a string, got {json_type_name(value)}")
    return value


def _take_dict(rec: dict[str, Any], name: str) -> dict[str, Any]:
    value = rec.get(name)
    if not isinstance(value, dict):
        raise FormatError(f"{name!r} must be an object, got {json_type_name(value)}")
    return value


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """Line 1 of a trace: what recorded it, where, on which clock, with which hooks.

    Timestamps in the trace are CLOCK_BOOTTIME ns; ``clock_offset_ns`` (CLOCK_REALTIME minus
    CLOCK_BOOTTIME, taken at start) turns them into wall-clock time for display. Keys this
    version does not know (sampler intervals, options, anything later versions add without a
    schema bump) travel in ``extra`` and are written back unchanged.
    """

    tool_version: str
    host: str
    kernel: str  # uname release
    cgroup: dict[str, Any]  # the cgroup layout (v1/v2/hybrid, mount points)
    clock_offset_ns: int  # realtime_ns - boottime_ns at start
    hooks: dict[str, str | None]  # hook -> the rung that attached ("exit": "tp_btf"), None: none
    targets: dict[str, Any]  # what was watched (pids, cgroups, containers, the command)
    started_ns: int  # CLOCK_BOOTTIME at start
    schema: int = SCHEMA_VERSION
    clock: str = "boottime"
    extra: dict[str, Any] = field(default_factory=dict)

    # Keys of the record that are fields (everything else is ``extra``).
    _KNOWN: ClassVar[frozenset[str]] = frozenset(
        (
            "t",
            "schema",
            "tool",
            "tool_version",
            "host",
            "kernel",
            "cgroup",
            "clock",
            "clock_offset_ns",
            "hooks",
            "targets",
            "started_ns",
        )
    )

    def __post_init__(self) -> None:
        clash = self._KNOWN.intersection(self.extra)
        if clash:
            raise ValueError(f"header extra keys clash with header fields: {sorted(clash)}")

    def to_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "t": HEADER_KIND,
            "schema": self.schema,
            "tool": TOOL_NAME,
            "tool_version": self.tool_version,
            "host": self.host,
            "kernel": self.kernel,
            "cgroup": self.cgroup,
            "clock": self.clock,
            "clock_offset_ns": self.clock_offset_ns,
            "hooks": self.hooks,
            "targets": self.targets,
            "started_ns": self.started_ns,
        }
        rec.update(self.extra)
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> TraceHeader:
        """Inverse of `to_record`. Raises `FormatError` naming the first bad field.

        It does not judge the schema version; the reader refuses a newer one before calling this.
        """
        if rec.get("t") != HEADER_KIND:
            raise FormatError(f"not a header record (t={rec.get('t')!r})")
        if rec.get("tool") != TOOL_NAME:
            raise FormatError(f"written by {rec.get('tool')!r}, not {TOOL_NAME!r}")
        hooks = _take_dict(rec, "hooks")
        for name, rung in hooks.items():
            if rung is not None and not isinstance(rung, str):
                raise FormatError(
                    f"hooks[{name!r}] must be a string or null, got {json_type_name(rung)}"
                )
        return cls(
            schema=_take_int(rec, "schema"),
            tool_version=_take_str(rec, "tool_version"),
            host=_take_str(rec, "host"),
            kernel=_take_str(rec, "kernel"),
            cgroup=_take_dict(rec, "cgroup"),
            clock=_take_str(rec, "clock"),
            clock_offset_ns=_take_int(rec, "clock_offset_ns"),
            hooks=hooks,
            targets=_take_dict(rec, "targets"),
            started_ns=_take_int(rec, "started_ns"),
            extra={k: v for k, v in rec.items() if k not in cls._KNOWN},
        )

    def realtime_ns(self, ts: int) -> int:
        """A trace timestamp (CLOCK_BOOTTIME ns) as CLOCK_REALTIME ns, for display."""
        return ts + self.clock_offset_ns


@dataclass(frozen=True, slots=True)
class TraceFooter:
    """The last line of a finished trace: how it ended and what it holds.

    ``counts`` (events per kind) let the reader notice records that went missing; ``lost`` is
    the kernel's count of events it could not hand over; ``warnings`` are the ones the recorder
    printed, kept so that a replay can repeat them.
    """

    ended_ns: int  # CLOCK_BOOTTIME at the end
    exit: str  # "command exited", "interrupted", ...
    counts: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    warnings: Sequence[str] = ()  # stored as a tuple, whatever sequence was given
    extra: dict[str, Any] = field(default_factory=dict)

    _KNOWN: ClassVar[frozenset[str]] = frozenset(
        ("t", "ended_ns", "counts", "lost", "warnings", "exit")
    )

    def __post_init__(self) -> None:
        clash = self._KNOWN.intersection(self.extra)
        if clash:
            raise ValueError(f"footer extra keys clash with footer fields: {sorted(clash)}")
        # A tuple keeps the frozen footer immutable and makes footers equal whatever sequence
        # type a caller passed.
        object.__setattr__(self, "warnings", tuple(self.warnings))

    def to_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "t": FOOTER_KIND,
            "ended_ns": self.ended_ns,
            "counts": self.counts,
            "lost": self.lost,
            "warnings": list(self.warnings),
            "exit": self.exit,
        }
        rec.update(self.extra)
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> TraceFooter:
        """Inverse of `to_record`. Raises `FormatError` naming the first bad field."""
        if rec.get("t") != FOOTER_KIND:
            raise FormatError(f"not a footer record (t={rec.get('t')!r})")
        counts = _take_dict(rec, "counts")
        for kind, n in counts.items():
            if type(n) is not int:
                raise FormatError(f"counts[{kind!r}] must be an integer, got {json_type_name(n)}")
        warnings = rec.get("warnings")
        if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
            raise FormatError("'warnings' must be an array of strings")
        return cls(
            ended_ns=_take_int(rec, "ended_ns"),
            exit=_take_str(rec, "exit"),
            counts=counts,
            lost=_take_int(rec, "lost"),
            warnings=tuple(warnings),
            extra={k: v for k, v in rec.items() if k not in cls._KNOWN},
        )
