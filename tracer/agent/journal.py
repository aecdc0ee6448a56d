"""The verdict journal: every notable verdict and restart the agent reached, one JSON line each,
in the state directory. It outlives the agent: `whyrestart history` reads it, with or without an
agent.

The journal rotates past ``max_bytes`` (the file becomes ``journal.1.jsonl``, replacing the one
before): history reads both. An entry's ``key`` is (boot id, pid, exit time): the agent loads
the keys of both on start and never writes one twice, so a restarted agent adds no duplicates.
Each line is written with a single ``write`` on an O_APPEND descriptor and flushed at once (a
SIGKILLed agent loses no verdict it had reached). A line that cannot be written (disk full) is
held, up to ``MAX_HELD``, and written again with the next one; what does not fit is counted in
``unwritten``.

`parse_lines` and `select` are pure: history's reading and filtering, tested without files.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from tracer.agent.otel import runtime_attributes
from tracer.analysis.findings import Restart, Verdict
from tracer.clock import wall_time

if TYPE_CHECKING:
    from tracer.pipeline.follow import RuntimeIdentity

SCHEMA = 1
MAX_HELD = 10_000


def verdict_key(boot: str, pid: int, ts: int) -> str:
    return f"{boot}/{pid}/{ts}"


def verdict_entry(
    v: Verdict,
    boot: str,
    clock_offset_ns: int,
    incident: str | None,
    labels: dict[str, str],
    identity: RuntimeIdentity | None = None,
) -> dict[str, Any]:
    """``attributes``: the unit's CRI identity under OpenTelemetry's names, as the log line
    has them (tracer.agent.otel.runtime_attributes); only where a CRI runtime named the unit."""
    entry = {
        "schema": SCHEMA,
        "kind": "verdict",
        "key": verdict_key(boot, v.pid, v.ts),
        "time": wall_time(v.ts, clock_offset_ns).isoformat(),
        "ts_ns": v.ts,
        "boot_id": boot,
        "unit": v.unit,
        "labels": labels,
        "pid": v.pid,
        "comm": v.comm,
        "cause": v.cause,
        "confidence": v.confidence,
        "incident": incident,
        "verdict": v.to_json(),
    }
    return _with_identity(entry, identity)


def restart_entry(
    r: Restart, boot: str, clock_offset_ns: int, identity: RuntimeIdentity | None = None
) -> dict[str, Any]:
    """``attributes``: as a verdict's; the identity is the new container's (its id, its count)."""
    entry = {
        "schema": SCHEMA,
        "kind": "restart",
        "key": f"{boot}/restart/{r.old_pid}/{r.new_pid}/{r.ts}",
        "time": wall_time(r.ts, clock_offset_ns).isoformat(),
        "ts_ns": r.ts,
        "boot_id": boot,
        "unit": r.unit,
        "cause": r.cause,
        "restart": r.to_json(),
    }
    return _with_identity(entry, identity)


def _with_identity(entry: dict[str, Any], identity: RuntimeIdentity | None) -> dict[str, Any]:
    attrs = runtime_attributes(identity)
    if attrs:
        entry["attributes"] = attrs
    return entry


def parse_lines(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The journal's entries; a torn or foreign line (a crash mid-write long ago) is skipped."""
    for line in lines:
        if not line.strip():
            continue
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict) and entry.get("schema") == SCHEMA and "key" in entry:
            yield entry


def select(
    entries: Iterable[dict[str, Any]],
    *,
    since_wall: float | None = None,
    unit: str | None = None,
    cause: str | None = None,
    kind: str | None = "verdict",
) -> list[dict[str, Any]]:
    """The entries history shows: of ``kind``, at or after ``since_wall`` (POSIX seconds),
    whose unit's label contains ``unit``, of ``cause``."""
    from datetime import datetime

    out = []
    for e in entries:
        if kind is not None and e.get("kind") != kind:
            continue
        if cause is not None and e.get("cause") != cause:
            continue
        if unit is not None and unit not in (e.get("unit") or ""):
            continue
        if since_wall is not None:
            try:
                when = datetime.fromisoformat(str(e.get("time"))).timestamp()
            except ValueError:
                continue
            if when < since_wall:
                continue
        out.append(e)
    return out


class Journal:
    def __init__(self, path: str, old_path: str | None = None, max_bytes: int = 64 << 20) -> None:
        self.path = path
        self.old_path = old_path
        self.max_bytes = max_bytes
        self.keys: set[str] = set()
        self.unwritten = 0
        self.written = 0
        self._held: list[bytes] = []
        data = b""
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
            data = f.read()
        if data and not data.endswith(b"\n"):
            # a line torn by a crash: cut it off, or the next entry would be glued to it
            data = data[: data.rfind(b"\n") + 1]
            os.truncate(path, len(data))
        for entry in [*read_journal(old_path or ""), *parse_lines(data.splitlines())]:
            self.keys.add(str(entry["key"]))
        self._size = len(data)
        self._fd: int | None = None
        self.reopen()

    def reopen(self) -> None:
        """(Re)open the file: after a log rotation moved it away (SIGHUP)."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(
            self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )

    def add(self, entry: dict[str, Any]) -> bool:
        """Append ``entry`` unless its key is already there; False for a duplicate."""
        key = str(entry["key"])
        if key in self.keys:
            return False
        self.keys.add(key)
        self._held.append(orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE))
        if len(self._held) > MAX_HELD:
            self._held.pop(0)
            self.unwritten += 1
        self.flush()
        return True

    def flush(self) -> None:
        """Write what is held; on failure keep it for the next try."""
        if self._fd is None:
            return
        while self._held:
            line = self._held[0]
            try:
                n = os.write(self._fd, line)
            except OSError:
                return
            if n != len(line):
                # a short append (disk full mid-line): cut back to the last whole line
                with contextlib.suppress(OSError):
                    os.truncate(self.path, os.fstat(self._fd).st_size - n)
                return
            self._held.pop(0)
            self.written += 1
            self._size += n
            if self._size >= self.max_bytes and self.old_path is not None:
                self._rotate()

    def _rotate(self) -> None:
        """This file becomes the previous generation; the keys of the one it replaces go."""
        try:
            os.replace(self.path, self.old_path or "")
        except OSError:
            return
        self.keys = {str(e["key"]) for e in read_journal(self.old_path or "")}
        self._size = 0
        self.reopen()

    @property
    def held(self) -> int:
        return len(self._held)

    def close(self) -> None:
        self.flush()
        self.unwritten += len(self._held)
        self._held.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_journal(*paths: str) -> list[dict[str, Any]]:
    """The entries of the journal files given (oldest generation first)."""
    out: list[dict[str, Any]] = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                out += parse_lines(f)
        except FileNotFoundError:
            continue
    return out
