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
blocks and each block's lines, joined into one JSON array, are decoded by msgspec straight into
typed, checked events in one C call (about 2 million events a second); only a block that fails
that fast path is read again line by line, and a line that fails there is looked at slowly, with
orjson, to say what is wrong with it.
"""

from __future__ import annotations

import os
import stat
import types
import typing
from collections import Counter
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import IO, Any, Union, cast

import msgspec
import orjson

from tracer.errors import TraceFileError
from tracer.events import KINDS, Event, RecordError, from_record
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
# Decoding events fast

# Events are msgspec Structs tagged by their kind ("t"): one decoder turns a whole block of lines,
# joined into a JSON array, into typed, validated events in C (`TraceReader._fast_block`).
_EVENT = Union[tuple(KINDS.values())]  # type: ignore[valid-type]  # noqa: UP007
_decode_block = msgspec.json.Decoder(list[_EVENT]).decode  # type: ignore[valid-type]
_decode_line = msgspec.json.Decoder(_EVENT).decode

# orjson, which reads a record on the slow path, takes integers of 64 bits at most (beyond, it
# gives floats, which the field checks then refuse); msgspec takes any size. A block holding a
# run of 20 digits, or a minus and 19, is read on the slow path so that both paths agree (and no
# 80-bit timestamp reaches a datetime). Translating digits and minus to "0" and the rest to space
# makes that one find (what else it finds, such as "--" before 18 digits, is only read slowly).
_DIGIT_MAP = bytes(0x30 if 0x30 <= i <= 0x39 or i == 0x2D else 0x20 for i in range(256))
_HUGE = b"0" * 20


def _has_huge_int(part: bytes) -> bool:
    return part.translate(_DIGIT_MAP).find(_HUGE) >= 0


def _has_long_line(data: bytes, end: int, limit: int) -> bool:
    """Whether some line of ``data[:end]`` is longer than ``limit`` bytes, without splitting
    it: a line that long spans one of the offsets that are multiples of ``limit // 2``."""
    step = max(limit // 2, 1)
    for at in range(step, end, step):
        start = data.rfind(b"\n", 0, at) + 1
        stop = data.find(b"\n", at, end)
        if (end if stop < 0 else stop) - start > limit:
            return True
    return False


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
    return None  # containers: msgspec checks their contents when the event is built


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    allowed: tuple[type, ...] | None
    required: bool


def _field_specs(cls: type[Event]) -> tuple[_FieldSpec, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        _FieldSpec(name=f.name, allowed=_allowed_types(hints[f.name]), required=f.required)
        for f in msgspec.structs.fields(cls)
    )


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

    Large on purpose (over 400 lines): the one reader of the format (plain and zstd, the
    block-at-once fast path and the line-by-line path that names damage) keeps one position
    (line number, bytes consumed, a torn frame) that every path reports from.
    """

    def __init__(self, path: str | os.PathLike[str], block_bytes: int = READ_BLOCK) -> None:
        """``block_bytes``: how much text is decoded at once. The default is fastest; a smaller
        block bounds the memory a read takes (the always-on agent cuts incidents with 128 KiB:
        a 1 MiB block of a storm's exits is 10,000 events in one list, 13 MB at the peak)."""
        self.path = os.fspath(path)
        self._block = max(1, block_bytes)
        self.footer: TraceFooter | None = None
        self.warnings: list[str] = []
        self.counts: dict[str, int] = {}  # events read per kind
        self.compressed = False
        self._frame_cut_at: int | None = None  # compressed offset of a torn last zstd frame
        self._consumed = 0  # decoded bytes taken from the block iterator
        self._iterator: Generator[list[Event], None, None] | None = None
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
        self._iterator = self._batches()
        # (the events of a block come as one list: chaining them in C saves a generator step
        # per event, a tenth of a replay)
        return chain.from_iterable(self._iterator)

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
            # O_NONBLOCK for the open only: a FIFO with no writer would block it for ever (it
            # reads as empty instead); a pipe with a writer (`replay <(zstdcat x)`) streams.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.close(fd)
                raise IsADirectoryError
            os.set_blocking(fd, True)
            # Unbuffered: the reader asks for 1 MiB blocks itself, a second buffer would copy.
            # Closed by close(), by the end of iteration, or by __init__ on a bad header.
            return open(fd, "rb", buffering=0)
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
                block = self._file.read(self._block)
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

        Decoded output is yielded as it comes (in blocks of about ``block_bytes``), so a torn
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
                if out_len >= self._block:
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

    def _batches(self) -> Generator[list[Event], None, None]:
        counts = self.counts
        rem = self._rest
        lineno = 1
        try:
            for block in chain([b""], self._blocks):
                self._consumed += len(block)
                data = rem + block if rem else block
                cut = data.rfind(b"\n") + 1
                rem = data[cut:]
                if cut:
                    events = self._fast_block(data, cut)
                    if events is None:
                        part = data[:cut]
                        events = []
                        try:
                            events.extend(self._slow_block(part, lineno))
                        except TraceFileError:
                            yield events  # what comes before the damage replays first
                            raise
                        lineno += part.count(b"\n")
                    else:
                        for cls, n in Counter[type[Event]](map(type, events)).items():
                            counts[cls.KIND] = counts.get(cls.KIND, 0) + n
                        lineno += len(events)
                    yield events
                if len(rem) > MAX_LINE_BYTES:
                    raise self._damage(lineno + 1, self._too_long())
            if rem:
                lineno += 1
                last = self._last_line(rem, lineno)
                if last is not None:
                    counts[last.KIND] = counts.get(last.KIND, 0) + 1
                    yield [last]
            self._finish()
        finally:
            self._file.close()

    def _fast_block(self, data: bytes, cut: int) -> list[Event] | None:
        """Every line of ``data[:cut]`` (whole lines, each ending in a newline) as an event,
        decoded in one call: the lines joined by commas into a JSON array. None when anything in the
        block needs a closer look (the footer, damage, a line too long, a huge integer), and
        the block is then read line by line. A line holding two records, or none, or one that
        starts with anything but a record's "{", cannot slip through: the array must hold one
        event per line that starts with "{" (counting those is 3x faster than counting lines)."""
        if (
            self.footer is not None
            or data[0] != 0x7B
            or (cut > MAX_LINE_BYTES and _has_long_line(data, cut, MAX_LINE_BYTES))
        ):
            return None
        # (two copies of the block, not six: ``data`` past ``cut`` holds no newline)
        commas = data.replace(b"\n", b",")
        try:
            events: list[Event] = _decode_block(
                b"".join((b"[", memoryview(commas)[: cut - 1], b"]"))
            )
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if len(events) != data.count(b"\n{", 0, cut) + 1 or _has_huge_int(commas):
            return None
        return events

    def _slow_block(self, part: bytes, lineno: int) -> Iterator[Event]:
        """``part`` line by line: its events up to the first damaged line, then a
        `TraceFileError` naming that line."""
        huge = _has_huge_int(part)
        counts = self.counts
        for line in part[:-1].split(b"\n"):
            lineno += 1
            if len(line) > MAX_LINE_BYTES:
                raise self._damage(lineno, self._too_long())
            try:
                if huge or self.footer is not None:
                    raise ValueError  # (read exactly, with orjson, below)
                event: Event | None = _decode_line(line)
            except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
                event = self._slow_record(line, lineno)
            if event is not None:  # (None: the footer)
                counts[event.KIND] = counts.get(event.KIND, 0) + 1
                yield event

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
            return from_record(rec)
        except RecordError as exc:  # what _what_is_wrong does not check: containers' contents
            raise self._damage(lineno, f"malformed {exc}") from None

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
