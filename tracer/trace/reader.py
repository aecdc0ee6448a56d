"""Reading a trace file: `TraceReader` streams its events, `read_trace` loads it whole.

The rules, so that a replay either tells the truth or says clearly why it cannot:

* A missing, empty, foreign or newer-schema file is a `TraceFileError` before any event, with a
  message that names the file and the fix. So is a header cut short: without its header a trace
  cannot be interpreted.
* A trace cut anywhere after its header (a recorder killed, a disk full, a copy interrupted) is
  replayed up to its last whole record, with a warning: a torn last line, a torn last zstd frame
  and a missing footer are all the normal ways a recording ends badly.
* Anything else that is wrong (a line that is not JSON, an unknown event kind, a missing field,
  a wrong type, a line over `MAX_LINE_BYTES`, a record after the footer) is damage, not a cut:
  a `TraceFileError` naming the line and what is wrong, never a half-replay that looks whole.

Speed matters because traces of fork storms hold millions of events: the file is read in 1 MiB
blocks, split into lines in C, parsed with orjson, and each event built by a small function
compiled per event class (see `_compile_builder`); only a record that fails that fast path is
looked at again, slowly, to say what is wrong with it.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import IO, Any, cast

import orjson

from tracer.errors import TraceFileError
from tracer.events import KINDS, Event
from tracer.trace.format import (
    FOOTER_KIND,
    GZIP_MAGIC,
    HEADER_KIND,
    MAX_LINE_BYTES,
    SCHEMA_VERSION,
    TOOL_NAME,
    ZSTD_MAGIC,
    FormatError,
    TraceFooter,
    TraceHeader,
    json_type_name,
)

READ_BLOCK = 1 << 20
# Compressed bytes handed to zstd per call. zstd can expand a few bytes into a 128 KiB block, so
# feeding it small pieces bounds the memory a hostile or damaged file can make it allocate
# (1 KiB in -> at most ~32 MiB out) before the line-length cap stops the read.
ZSTD_FEED = 1024

_HEADER_START = b'{"t":"header"'  # how the writer (orjson, "t" first) starts every trace


# ---------------------------------------------------------------------------------------------
# Building events fast


def _allowed_types(hint: object) -> tuple[type, ...] | None:
    """The exact JSON-decoded types a field accepts, or None for "do not check"."""
    if hint is None or hint is type(None):
        return (type(None),)
    if hint in (int, str, bool):
        # Exact types: orjson gives int/str/bool, and JSON true is not an integer.
        return (cast(type, hint),)
    if hint is float:
        return (float, int)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        allowed: list[type] = []
        for arg in typing.get_args(hint):
            part = _allowed_types(arg)
            if part is None:
                return None
            allowed.extend(part)
        return tuple(allowed)
    return None  # containers and the like: not used by events today, accepted as they come


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    allowed: tuple[type, ...] | None
    required: bool


def _field_specs(cls: type[Event]) -> tuple[_FieldSpec, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        _FieldSpec(
            name=f.name,
            allowed=_allowed_types(hints[f.name]),
            required=f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )


def _slot_setter(cls: type, name: str) -> Callable[[object, object], None] | None:
    for klass in cls.__mro__:
        attr = klass.__dict__.get(name)
        if attr is not None:
            return (
                cast(Callable[[object, object], None], attr.__set__)
                if isinstance(attr, types.MemberDescriptorType)
                else None
            )
    return None


def _compile_builder(cls: type[Event]) -> Callable[[dict[str, Any]], Event]:
    """A function ``record -> event`` that checks each field's type and builds the event.

    Why generated code: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, which made building dominate replay (~3 us per 11-field event,
    more than parsing the JSON). Straight-line code that type-checks each value and stores it
    through the slot descriptor is about twice as fast. It raises on any problem (a missing
    field, a wrong type) without saying which: the reader then diagnoses the record slowly.
    Unknown keys are ignored, as `tracer.events.from_record` does. A class that is not a slots
    dataclass, or has a ``__post_init__``, is built through its ``__init__`` instead.
    """
    fields = dataclasses.fields(cls)
    specs = _field_specs(cls)
    setters = [_slot_setter(cls, f.name) for f in fields]
    direct = not hasattr(cls, "__post_init__") and all(s is not None for s in setters)
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    src = ["def build(r):", "    o = _new(_cls)" if direct else "    kw = {}"]
    for i, (f, spec) in enumerate(zip(fields, specs, strict=True)):
        if f.default is not dataclasses.MISSING:
            ns[f"d{i}"] = f.default
            src.append(f"    v = r.get({f.name!r}, d{i})")
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"f{i}"] = f.default_factory
            src.append(f"    v = r[{f.name!r}] if {f.name!r} in r else f{i}()")
        else:
            src.append(f"    v = r[{f.name!r}]")
        allowed = spec.allowed
        if allowed is not None:
            ns[f"t{i}"] = allowed
            others = [t for t in allowed if t is not type(None)]
            if len(others) == 1:
                ns[f"t{i}"] = others[0]
                test = f"type(v) is not t{i}"
                if len(allowed) == 2:
                    test = f"v is not None and {test}"
            else:
                test = f"type(v) not in t{i}"
            src.append(f"    if {test}: raise TypeError({f.name!r})")
        if direct:
            ns[f"s{i}"] = setters[i]
            src.append(f"    s{i}(o, v)")
        else:
            src.append(f"    kw[{f.name!r}] = v")
    src.append("    return o" if direct else "    return _cls(**kw)")
    exec(compile("\n".join(src), f"<trace builder for {cls.__name__}>", "exec"), ns)
    return cast(Callable[[dict[str, Any]], Event], ns["build"])


_BUILDERS: dict[str, Callable[[dict[str, Any]], Event]] = {
    kind: _compile_builder(cls) for kind, cls in KINDS.items()
}
_SPECS: dict[str, tuple[_FieldSpec, ...]] = {kind: _field_specs(cls) for kind, cls in KINDS.items()}

_TYPE_WORDS = {int: "an integer", str: "a string", bool: "true or false", float: "a number"}


def _describe(allowed: tuple[type, ...]) -> str:
    words = [_TYPE_WORDS.get(t, "null" if t is type(None) else t.__name__) for t in allowed]
    return " or ".join(dict.fromkeys(words))


def _what_is_wrong(kind: str, rec: dict[str, Any]) -> str | None:
    """Why ``rec`` is not a valid ``kind`` record, in words; None if nothing is."""
    for spec in _SPECS[kind]:
        if spec.name not in rec:
            if spec.required:
                return f"{kind} record lacks field {spec.name!r}"
            continue
        value = rec[spec.name]
        if spec.allowed is not None and type(value) not in spec.allowed:
            return (
                f"{kind} field {spec.name!r} must be {_describe(spec.allowed)}, "
                f"got {json_type_name(value)}"
            )
    return None


def _preview(line: bytes, limit: int = 40) -> str:
    return repr(line[:limit]) + ("..." if len(line) > limit else "")


# ---------------------------------------------------------------------------------------------
# The reader


@dataclass(frozen=True, slots=True)
class Trace:
    """A whole trace in memory (see `read_trace`)."""

    header: TraceHeader
    events: list[Event]
    footer: TraceFooter | None  # None: the recording did not finish
    warnings: list[str]


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a whole trace into memory. Raises `TraceFileError` as `TraceReader` does."""
    with TraceReader(path) as reader:
        events = list(reader)
        return Trace(reader.header, events, reader.footer, list(reader.warnings))


class TraceReader:
    """Streams one trace: ``header`` at once, then its events in file order by iterating.

    Opening reads the header and raises `TraceFileError` for a file that cannot be replayed at
    all. Iterating yields `Event`s and raises `TraceFileError` at damage. ``footer`` (None when
    the recording was cut), ``warnings`` and ``counts`` are complete once iteration has ended.
    A reader can be iterated once; it closes its file at the end of iteration, on `close`, or
    on leaving a ``with`` block.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.footer: TraceFooter | None = None
        self.warnings: list[str] = []
        self.counts: dict[str, int] = {}  # events read per kind
        self.compressed = False
        self._frame_cut_at: int | None = None  # compressed offset of a torn last zstd frame
        self._consumed = 0  # decoded bytes taken from the block iterator
        self._iterator: Generator[Event, None, None] | None = None
        self._file = self._open()
        try:
            self._blocks = self._decoded_blocks()
            self.header, self._rest = self._read_header()
        except BaseException:
            self._file.close()
            raise

    def __iter__(self) -> Iterator[Event]:
        if self._iterator is not None:
            raise RuntimeError("a TraceReader can be iterated once; open the trace again")
        self._iterator = self._events()
        return self._iterator

    def close(self) -> None:
        if self._iterator is not None:
            self._iterator.close()
        self._file.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -----------------------------------------------------------------------------------------
    # Opening and the byte stream

    def _open(self) -> IO[bytes]:
        path = self.path
        try:
            # Unbuffered: the reader asks for 1 MiB blocks itself, a second buffer would copy.
            # Closed by close(), by the end of iteration, or by __init__ on a bad header.
            return open(path, "rb", buffering=0)
        except FileNotFoundError:
            raise TraceFileError(
                f"no such trace file: {path}",
                "check the path (a trace is the file a recording wrote)",
            ) from None
        except IsADirectoryError:
            raise TraceFileError(
                f"{path} is a directory, not a trace file", "give the trace file's path"
            ) from None
        except PermissionError:
            raise TraceFileError(
                f"cannot read trace {path}: permission denied",
                "traces are created readable by their owner only (mode 0600): read it as that "
                "user or as root",
            ) from None
        except OSError as exc:
            raise TraceFileError(f"cannot read trace {path}: {exc.strerror}") from None

    def _raw_blocks(self) -> Iterator[bytes]:
        while True:
            try:
                block = self._file.read(READ_BLOCK)
            except OSError as exc:
                raise TraceFileError(f"cannot read trace {self.path}: {exc.strerror}") from None
            if not block:
                return
            yield block

    def _decoded_blocks(self) -> Iterator[bytes]:
        """The file's text in blocks: sniffs the format from the first bytes."""
        raw = self._raw_blocks()
        first = next(raw, b"")
        if not first:
            raise TraceFileError(f"{self.path} is empty: the recording wrote nothing")
        if first.startswith(GZIP_MAGIC):
            raise TraceFileError(
                f"{self.path} is not a whyrestart trace (line 1: gzip-compressed data)",
                "whyrestart reads plain and zstd-compressed traces: gunzip it first",
            )
        # A file of 1-3 bytes that could start a zstd frame is a zstd trace cut very early.
        if first.startswith(ZSTD_MAGIC) or (len(first) < 4 and ZSTD_MAGIC.startswith(first)):
            self.compressed = True
            return self._zstd_blocks(chain([first], raw))
        return chain([first], raw)

    def _zstd_blocks(self, raw: Iterator[bytes]) -> Iterator[bytes]:
        """Decompress a sequence of zstd frames; a torn last frame ends the stream quietly.

        Decoded output is yielded as it comes (in blocks of about `READ_BLOCK`), so a torn
        frame still gives the lines of its complete zstd blocks. A damaged frame (bad data,
        wrong checksum) is a `TraceFileError`.
        """
        try:
            import zstandard  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise TraceFileError(
                f"{self.path} is zstd-compressed, and reading it needs the zstandard package",
                f"pip install zstandard (or decompress it: zstd -d {self.path})",
            ) from None
        return self._zstd_decode(zstandard, raw)

    def _zstd_decode(self, zstandard: Any, raw: Iterator[bytes]) -> Iterator[bytes]:
        dctx = zstandard.ZstdDecompressor()
        dobj = dctx.decompressobj()
        fed = False  # the current frame has been given bytes (so it is started, maybe torn)
        frame_start = 0  # compressed offset where the current frame starts
        pos = 0  # compressed offset of the piece being fed
        out: list[bytes] = []
        out_len = 0
        for chunk in raw:
            view = memoryview(chunk)
            for i in range(0, len(chunk), ZSTD_FEED):
                piece: bytes | memoryview = view[i : i + ZSTD_FEED]
                while piece:
                    try:
                        data = dobj.decompress(piece)
                    except zstandard.ZstdError as exc:
                        if out:  # the lines before the damage replay, as in plain text
                            yield b"".join(out)
                            out, out_len = [], 0
                        raise TraceFileError(
                            f"{self.path}: damaged zstd data in the frame that starts at "
                            f"compressed byte {frame_start} ({exc})",
                            f"the file is corrupt; `zstd -dc {self.path} | head` shows what "
                            "can still be decoded",
                        ) from None
                    fed = True
                    if data:
                        out.append(data)
                        out_len += len(data)
                    if dobj.eof:
                        # The frame is whole; what follows it starts the next one.
                        unused: bytes = dobj.unused_data
                        pos = frame_start = pos + len(piece) - len(unused)
                        dobj = dctx.decompressobj()
                        fed = False
                        piece = unused
                    else:
                        pos += len(piece)
                        piece = b""
                if out_len >= READ_BLOCK:
                    yield b"".join(out)
                    out, out_len = [], 0
        if out:
            yield b"".join(out)
        if fed:
            self._frame_cut_at = frame_start

    # -----------------------------------------------------------------------------------------
    # Header

    def _not_a_trace(self, why: str) -> TraceFileError:
        return TraceFileError(
            f"{self.path} is not a whyrestart trace (line 1: {why})",
            "give the path of a file written by whyrestart's trace recording",
        )

    def _incomplete_header(self) -> TraceFileError:
        return TraceFileError(
            f"{self.path}: the header is incomplete (the recording was cut while writing its "
            "first line), so there is nothing to replay",
            "record again; nothing was recorded in this file",
        )

    def _read_header(self) -> tuple[TraceHeader, bytes]:
        """Line 1, checked; returns it and the bytes that follow it."""
        acc = b""
        newline = -1
        for block in self._blocks:
            acc += block
            newline = acc.find(b"\n")
            if newline >= 0 or len(acc) > MAX_LINE_BYTES:
                break
        self._consumed = len(acc)
        if newline >= 0:
            line, rest = acc[:newline], acc[newline + 1 :]
        else:
            line, rest = acc, b""
        if not line:
            if self._frame_cut_at is not None:
                raise self._incomplete_header()
            if not acc:
                raise TraceFileError(f"{self.path} is empty: the recording wrote nothing")
            raise self._not_a_trace("empty line")
        if len(line) > MAX_LINE_BYTES:
            raise self._not_a_trace(f"no line end in the first {MAX_LINE_BYTES >> 20} MiB")
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            # Unterminated and a prefix of what the writer writes first: cut, not foreign.
            if newline < 0 and (line.startswith(_HEADER_START) or _HEADER_START.startswith(line)):
                raise self._incomplete_header() from None
            raise self._not_a_trace(f"not JSON: {_preview(line)}") from None
        if not isinstance(rec, dict):
            raise self._not_a_trace(f"a JSON {json_type_name(rec)}, not a header record")
        if rec.get("t") != HEADER_KIND:
            raise self._not_a_trace(f"a {rec.get('t')!r} record, not a header")
        if rec.get("tool") != TOOL_NAME:
            raise self._not_a_trace(f"a header written by {rec.get('tool')!r}")
        schema = rec.get("schema")
        if type(schema) is not int or schema < 1:
            raise TraceFileError(
                f"{self.path} line 1: malformed header: 'schema' must be a positive integer, "
                f"got {schema!r}"
            )
        if schema > SCHEMA_VERSION:
            raise TraceFileError(
                f"{self.path} uses trace schema {schema}, but this whyrestart reads schema "
                f"{SCHEMA_VERSION} at most",
                "upgrade whyrestart to replay it",
            )
        try:
            header = TraceHeader.from_record(rec)
        except FormatError as exc:
            raise TraceFileError(f"{self.path} line 1: malformed header: {exc}") from None
        return header, rest

    # -----------------------------------------------------------------------------------------
    # Events

    def _events(self) -> Generator[Event, None, None]:
        try:
            yield from self._scan()
        finally:
            self._file.close()

    def _scan(self) -> Iterator[Event]:
        loads = orjson.loads
        builders = _BUILDERS
        counts = self.counts
        rem = self._rest
        lineno = 1
        for block in chain([b""], self._blocks):
            self._consumed += len(block)
            lines = (rem + block).split(b"\n") if rem else block.split(b"\n")
            rem = lines.pop()
            # Over-long lines are damage even when they parse; replay stops just before one,
            # as before any other damage. (One C-level max() per block, not a check per line.)
            too_long = bool(lines) and max(map(len, lines)) > MAX_LINE_BYTES
            if too_long:
                del lines[next(i for i, ln in enumerate(lines) if len(ln) > MAX_LINE_BYTES) :]
            for line in lines:
                lineno += 1
                try:
                    rec = loads(line)
                    event = builders[rec["t"]](rec)
                except Exception:
                    slow = self._slow_record(line, lineno)
                    if slow is None:
                        # The footer: any record after it is damage. With no builders every
                        # later line takes the slow path, which says so.
                        builders = {}
                        continue
                    event = slow
                kind = event.KIND
                counts[kind] = counts.get(kind, 0) + 1
                yield event
            if too_long or len(rem) > MAX_LINE_BYTES:
                raise self._damage(lineno + 1, self._too_long())
        if rem:
            lineno += 1
            last = self._last_line(rem, lineno)
            if last is not None:
                counts[last.KIND] = counts.get(last.KIND, 0) + 1
                yield last
        self._finish()

    def _last_line(self, line: bytes, lineno: int) -> Event | None:
        """The final line, which has no newline: a whole record, or one the cut tore."""
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError:
            if self.footer is not None:
                raise self._damage(lineno, "data after the footer") from None
            # A record is a JSON object: any proper prefix of one is not valid JSON, so a line
            # that does not parse here is a torn record (or damage we cannot tell from one).
            where = self._consumed - len(line)
            of = " of the decompressed data" if self.compressed else ""
            self.warnings.append(
                f"trace ends mid-record at byte {where}{of} (the recording was cut); "
                f"replaying the {sum(self.counts.values())} whole records before it"
            )
            self._frame_cut_at = None  # one warning for one cut
            return None
        return self._slow_record(line, lineno)

    def _slow_record(self, line: bytes, lineno: int) -> Event | None:
        """A line the fast path refused: the footer (returns None), an event, or damage."""
        if self.footer is not None:
            raise self._damage(lineno, "data after the footer")
        if not line:
            raise self._damage(lineno, "empty line")
        if len(line) > MAX_LINE_BYTES:
            raise self._damage(lineno, self._too_long())
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise self._damage(lineno, f"not JSON: {_preview(line)}") from None
        if not isinstance(rec, dict):
            raise self._damage(lineno, f"a JSON {json_type_name(rec)}, not a record")
        kind = rec.get("t")
        if kind == FOOTER_KIND:
            try:
                self.footer = TraceFooter.from_record(rec)
            except FormatError as exc:
                raise self._damage(lineno, f"malformed footer: {exc}") from None
            return None
        if kind == HEADER_KIND:
            raise self._damage(lineno, "a second header")
        if not isinstance(kind, str):
            if "t" not in rec:
                raise self._damage(lineno, 'a record without a kind ("t")')
            raise self._damage(lineno, f'the kind ("t") must be a string, got {kind!r}')
        if kind not in _SPECS:
            raise self._damage(
                lineno,
                f"unknown event kind {kind!r}",
                "the trace may come from a newer whyrestart (upgrade), or is damaged",
            )
        problem = _what_is_wrong(kind, rec)
        if problem is not None:
            raise self._damage(lineno, problem)
        try:
            return _BUILDERS[kind](rec)
        except Exception as exc:  # not expected: _what_is_wrong checks what the builder does
            raise self._damage(lineno, f"malformed {kind} record ({exc!r})") from None

    def _finish(self) -> None:
        if self._frame_cut_at is not None:
            self.warnings.append(
                f"trace ends mid-frame at compressed byte {self._frame_cut_at} (the recording "
                f"was cut); replaying the {sum(self.counts.values())} whole records before it"
            )
        if self.footer is None:
            self.warnings.append("no footer: the recording did not finish")
            return
        said = {k: n for k, n in self.footer.counts.items() if n}
        if said != self.counts:
            self.warnings.append(
                f"the footer counts {_fmt_counts(said)} but the trace holds "
                f"{_fmt_counts(self.counts)}: records were lost or added after recording"
            )

    def _too_long(self) -> str:
        return f"line longer than {MAX_LINE_BYTES >> 20} MiB: not a trace record"

    def _damage(self, lineno: int, what: str, fix: str | None = None) -> TraceFileError:
        if fix is None:
            keep = lineno - 1
            if self.compressed:
                salvage = f"zstd -dc {self.path} | head -n {keep} > repaired.trace"
            else:
                salvage = f"head -n {keep} {self.path} > repaired.trace"
            fix = f"the trace is damaged at that line; to replay what comes before it: {salvage}"
        return TraceFileError(f"{self.path} line {lineno}: {what}", fix)


def _fmt_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "no events"
