"""Writing a trace file: `TraceWriter` owns the file from creation to footer.

What it guarantees, because a trace is most wanted after something went wrong:

* The file is created mode 0600 (traces hold command lines and paths) and never through a
  symbolic link at the final path (``O_NOFOLLOW``): a link planted where the trace goes could
  otherwise point a root-run recorder at any file.
* Records are buffered in memory and written in chunks that end on a whole line, at least every
  ``flush_every`` records, every ``flush_bytes`` bytes and on `TraceWriter.flush`. A recorder
  killed between chunks leaves whole lines only; one killed in the middle of a chunk leaves at
  most one torn last line, which the reader skips with a warning.
* A failed write (disk full, I/O error) truncates the file back to its last whole record before
  raising `OutputError`, so the file stays readable; an exception that interrupts a write
  (Ctrl-C arriving mid-chunk) is rolled back the same way and the unwritten records stay
  buffered for the next flush.
* A path ending in ``.zst`` is written zstd-compressed, one independent frame per chunk, so a
  file cut anywhere still decodes up to its last whole frame. zstd needs the optional
  ``zstandard`` package.

Callers flush from their drain loop (a flush with nothing buffered costs nothing) and right after
an event they cannot afford to lose, such as an OOM kill: a recorder that is itself OOM-killed
loses what was still buffered.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
import orjson

from tracer.errors import OutputError
from tracer.events import KINDS, Event, Lost
from tracer.trace.format import MAX_LINE_BYTES, ZSTD_SUFFIX, TraceFooter, TraceHeader

# The one system call that puts bytes in the file; a module-level name so that tests can inject
# the faults (EIO, a short write) that a real disk rarely produces on demand.
_os_write: Callable[[int, bytes | memoryview], int] = os.write

DEFAULT_FLUSH_EVERY = 256  # records: what a recorder killed outright can lose
DEFAULT_FLUSH_BYTES = 256 * 1024
DEFAULT_ZSTD_LEVEL = 3  # zstd's default: fast, and JSON-lines traces shrink many times over

_DUMPS_OPTS = orjson.OPT_APPEND_NEWLINE
_ENCODER = msgspec.json.Encoder()

# errno -> how a user would say it, for write failures.
_WRITE_REASONS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EIO: "I/O error",
    errno.EFBIG: "file too large for this file system or process limit",
}


def _errname(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


# errno -> (what went wrong, the fix) when the trace cannot be created; {where}: its directory,
# {name}: the errno's name. _ENOENT_DIR: the directory is there but makes no files (/proc, /sys).
_ENOENT_DIR = -errno.ENOENT
_OPEN_PROBLEMS: dict[int, tuple[str, str]] = {
    errno.EEXIST: ("it exists", "choose another path, or replace it with --force"),
    _ENOENT_DIR: (
        "{where} does not accept new files",
        "choose a path on an ordinary file system",
    ),
    errno.ENOENT: (
        "directory {where} does not exist",
        "create it (mkdir -p {where}) or choose another path",
    ),
    errno.EACCES: (
        "permission denied: choose a writable path",
        "write it to a directory you can write to, or run as a user that can write {where}",
    ),
    errno.EROFS: (
        "read-only file system: choose a writable path",
        "write it to a writable file system (e.g. under /tmp or /var/tmp)",
    ),
    errno.EISDIR: ("it is a directory", "give a file name inside it"),
    errno.ENOTDIR: ("a component of {where} is not a directory", "choose another path"),
    errno.ENOSPC: (
        "disk full ({name})",
        "free space on that file system or write the trace to another one",
    ),
    errno.ENXIO: (
        "it is a FIFO or device, not a regular file",
        "choose a path for a regular file",
    ),
}
_OPEN_PROBLEMS[errno.EPERM] = _OPEN_PROBLEMS[errno.EACCES]
_OPEN_PROBLEMS[errno.EDQUOT] = _OPEN_PROBLEMS[errno.ENOSPC]


def _open_error(path: str, exc: OSError) -> OutputError:
    """An `OutputError` for a failed open of the trace path, naming the cause and the fix."""
    where = os.path.dirname(path) or "."
    code = exc.errno or 0
    if code == errno.EEXIST and os.path.islink(path):
        code = errno.ELOOP  # same answer as a link met without O_EXCL
    elif code == errno.EEXIST and os.path.isdir(path):
        code = errno.EISDIR
    elif code == errno.ENOENT and os.path.isdir(where):
        code = _ENOENT_DIR
    if code == errno.ELOOP and os.path.islink(path):
        return OutputError(
            f"refusing to write trace {path}: it is a symbolic link",
            "remove the link or choose another path (a trace is never written through a link, "
            "which could point it at another file)",
        )
    problem, fix = _OPEN_PROBLEMS.get(code, ("{strerror} ({name})", "choose another path"))
    names = {"where": where, "name": _errname(exc), "strerror": exc.strerror}
    return OutputError(
        f"cannot create trace {path}: {problem.format(**names)}", fix.format(**names)
    )


class TraceWriter:
    """Writes one trace: the header at `open`, events with `write`, the footer at `close`.

    Not thread-safe: one recorder thread owns it. Use `TraceWriter.open`, not the constructor.
    As a context manager it calls `abort` on leaving if `close` was not called, so a recording
    that died keeps its events and honestly lacks a footer.
    """

    def __init__(
        self,
        path: str,
        fd: int,
        compressor: Any,
        flush_every: int,
        flush_bytes: int,
    ) -> None:
        self.path = path
        self._fd = fd
        # A zstandard.ZstdCompressor, or None for plain JSON lines. Typed Any so that this module
        # type-checks where the optional package is not installed.
        self._cctx = compressor
        self._flush_every = max(1, flush_every)
        self._flush_bytes = max(1, flush_bytes)
        # Buffered lines and, in parallel, the event each one holds (None for header/footer):
        # a rolled-back chunk must know which events did reach the file.
        self._buf_lines: list[bytes] = []
        self._buf_events: list[Event | None] = []
        self._buf_bytes = 0
        self._counts: dict[str, int] = {}  # events on disk, per kind
        self._lost = 0  # sum of Lost.count on disk
        self._events_on_disk = 0
        self._bytes_written = 0
        self._failure: OutputError | None = None  # set once a write failed; the writer is dead

    # -----------------------------------------------------------------------------------------
    # Opening

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        header: TraceHeader,
        *,
        flush_every: int = DEFAULT_FLUSH_EVERY,
        flush_bytes: int = DEFAULT_FLUSH_BYTES,
        zstd_level: int = DEFAULT_ZSTD_LEVEL,
        overwrite: bool = False,
    ) -> TraceWriter:
        """Create the trace at ``path`` and write its header to disk at once.

        The file is created with O_EXCL: an existing file is never written through (a file
        or hard link planted in a world-writable directory would otherwise let a root-run
        recorder clobber any file). ``overwrite`` first unlinks an existing regular file at the
        path (unlinking never follows a link), then creates a new one the same way.

        The header reaches the file before this returns, so even a recording killed at once
        leaves a trace that says what it was. Raises `OutputError` for every failure.
        """
        spath = os.fspath(path)
        try:
            # Before creating the file, like every check that can fail on the caller's input.
            header_line = orjson.dumps(header.to_record(), option=_DUMPS_OPTS)
        except orjson.JSONEncodeError as exc:
            raise ValueError(f"cannot write the trace header: {exc}") from exc
        compressor: Any = None
        if spath.endswith(ZSTD_SUFFIX):
            # Before creating the file: a missing package must not leave an empty trace behind.
            compressor = _zstd_compressor(spath, zstd_level)
        # O_NONBLOCK: opening a FIFO for writing would otherwise block until a reader comes; with
        # it the open fails (ENXIO) and a regular file is unaffected. O_APPEND: after a rollback
        # truncates the file, the next write lands at the new end instead of leaving a hole.
        if overwrite:
            with contextlib.suppress(FileNotFoundError):
                st0 = os.lstat(spath)
                if stat.S_ISREG(st0.st_mode) or stat.S_ISLNK(st0.st_mode):
                    os.unlink(spath)
        flags = (
            os.O_WRONLY
            | os.O_CREAT
            | os.O_EXCL
            | os.O_APPEND
            | os.O_NOFOLLOW
            | os.O_CLOEXEC
            | os.O_NONBLOCK
        )
        try:
            fd = os.open(spath, flags, 0o600)
        except OSError as exc:
            raise _open_error(spath, exc) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OutputError(
                    f"cannot create trace {spath}: it exists and is not a regular file",
                    "choose a path for a regular file",
                )
            os.set_blocking(fd, True)
            # The mode given to open() applies only to a new file and is narrowed by the umask;
            # an existing trace being overwritten keeps its old mode unless set here.
            if stat.S_IMODE(st.st_mode) != 0o600:
                os.fchmod(fd, 0o600)
        except OSError as exc:
            os.close(fd)
            raise OutputError(
                f"cannot prepare trace {spath}: {exc.strerror} ({_errname(exc)})",
                "choose another path",
            ) from exc
        except BaseException:
            os.close(fd)
            raise
        writer = cls(spath, fd, compressor, flush_every, flush_bytes)
        try:
            writer._append(header_line, None)
            writer.flush()
        except BaseException:
            writer.abort()
            raise
        return writer

    # -----------------------------------------------------------------------------------------
    # Writing

    def write(self, event: Event) -> None:
        """Buffer one event; it reaches the file at the next flush (automatic or explicit)."""
        self._check_writable()
        self._append(self._encode(event), event)
        if len(self._buf_lines) >= self._flush_every or self._buf_bytes >= self._flush_bytes:
            self.flush()

    def write_many(self, events: Iterable[Event]) -> None:
        """`write` for a batch (a ring-buffer drain), with the same flush rules."""
        self._check_writable()
        for event in events:
            self._append(self._encode(event), event)
            if len(self._buf_lines) >= self._flush_every or self._buf_bytes >= self._flush_bytes:
                self.flush()

    def flush(self) -> None:
        """Write everything buffered, as one chunk of whole lines (one zstd frame)."""
        self._check_writable()
        if not self._buf_lines:
            return
        data = b"".join(self._buf_lines)
        payload = self._cctx.compress(data) if self._cctx is not None else data
        start = self._bytes_written
        written = 0
        view = memoryview(payload)
        try:
            while written < len(payload):
                n = _os_write(self._fd, view[written:])
                if n <= 0:  # a regular file never does this; do not spin if one does
                    raise OSError(errno.EIO, "write returned 0")
                written += n
        except BaseException as exc:
            self._roll_back(payload, start, written, exc)
            raise  # _roll_back raises OutputError for OSError; anything else goes on as it was
        self._bytes_written = start + written
        self._commit(len(self._buf_lines))

    # -----------------------------------------------------------------------------------------
    # Closing

    def make_footer(
        self,
        exit: str,
        *,
        warnings: Sequence[str] = (),
        ended_ns: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> TraceFooter:
        """A footer with this writer's counts and lost total (buffered events included).

        ``ended_ns`` defaults to now on CLOCK_BOOTTIME, the trace's clock.
        """
        return TraceFooter(
            ended_ns=time.clock_gettime_ns(time.CLOCK_BOOTTIME) if ended_ns is None else ended_ns,
            exit=exit,
            counts=self.counts,
            lost=self.lost,
            warnings=tuple(warnings),
            extra=dict(extra or {}),
        )

    def close(self, footer: TraceFooter) -> None:
        """Write what is buffered and the footer, sync the file to disk and close it.

        Raises `OutputError` if any of it fails (the file then ends at its last whole record,
        without a footer). Closing a closed writer does nothing.
        """
        if self._fd < 0:
            return
        self._check_writable_or_close()
        line = orjson.dumps(footer.to_record(), option=_DUMPS_OPTS)
        self._append(line, None)
        try:
            self.flush()
        except OutputError:
            self._close_fd()
            raise
        except BaseException:
            # Interrupted and rolled back: take the footer back out so that a second close()
            # does not write two.
            if self._buf_lines and self._buf_lines[-1] is line:
                self._buf_lines.pop()
                self._buf_events.pop()
                self._buf_bytes -= len(line)
            raise
        try:
            os.fsync(self._fd)
        except OSError as exc:
            # EINVAL: a file system that cannot sync (some FUSE); the data was written.
            if exc.errno != errno.EINVAL:
                self._close_fd()
                raise self._fail(exc, "syncing") from exc
        self._close_fd()

    def abort(self) -> None:
        """Close without a footer, writing what is buffered if the disk takes it.

        For a recording that is dying of another error: it never raises, so that it cannot
        hide that error. The trace reads back as one that did not finish.
        """
        if self._fd < 0:
            return
        try:
            if self._failure is None:
                self.flush()
        except (OutputError, KeyboardInterrupt):
            pass
        finally:
            self._close_fd()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.abort()

    # -----------------------------------------------------------------------------------------
    # State

    @property
    def closed(self) -> bool:
        return self._fd < 0

    @property
    def counts(self) -> dict[str, int]:
        """Events written so far per kind, buffered ones included (a copy)."""
        counts = dict(self._counts)
        for event in self._buf_events:
            if event is not None:
                counts[event.KIND] = counts.get(event.KIND, 0) + 1
        return counts

    @property
    def lost(self) -> int:
        """The sum of the `Lost` events written so far, buffered ones included."""
        return self._lost + sum(e.count for e in self._buf_events if isinstance(e, Lost))

    @property
    def events_written(self) -> int:
        """Events that reached the file (buffered ones not included)."""
        return self._events_on_disk

    @property
    def bytes_written(self) -> int:
        """Bytes in the file so far (compressed bytes for ``.zst``; buffered ones not included)."""
        return self._bytes_written

    # -----------------------------------------------------------------------------------------
    # Internals

    def _encode(self, event: Event) -> bytes:
        # Refuse here what the reader would refuse later: a trace that cannot be replayed is
        # worse than an error while recording.
        if KINDS.get(event.KIND) is not type(event):
            raise ValueError(f"{type(event).__name__} is not a registered event kind")
        try:
            # msgspec encodes the Struct in C, tag first: the bytes of orjson.dumps(to_record())
            # (tests/test_trace_file.py checks it) in 0.41 us instead of 1.42 for an exit, the
            # larger part of an incident cut after a storm and of the agent's segment writing
            if type(event) is Lost:
                # (orjson: its count goes into the footer, which orjson writes, so one past
                # 64 bits is refused here, not at the close; other ints are read back exactly)
                line = orjson.dumps(event.to_record(), option=_DUMPS_OPTS)
            else:
                line = _ENCODER.encode(event) + b"\n"
        except (msgspec.EncodeError, orjson.JSONEncodeError, TypeError, ValueError) as exc:
            raise ValueError(f"cannot write {event.KIND} event to the trace: {exc}") from exc
        if len(line) > MAX_LINE_BYTES:
            raise ValueError(
                f"cannot write {event.KIND} event to the trace: its record is {len(line)} bytes, "
                f"over the {MAX_LINE_BYTES}-byte limit readers enforce"
            )
        return line

    def _append(self, line: bytes, event: Event | None) -> None:
        self._buf_lines.append(line)
        self._buf_events.append(event)
        self._buf_bytes += len(line)

    def _commit(self, n: int) -> None:
        """The first ``n`` buffered lines are on disk: count them and drop them from the buffer."""
        for event in self._buf_events[:n]:
            if event is None:
                continue
            self._counts[event.KIND] = self._counts.get(event.KIND, 0) + 1
            self._events_on_disk += 1
            if isinstance(event, Lost):
                self._lost += event.count
        self._buf_bytes -= sum(len(line) for line in self._buf_lines[:n])
        del self._buf_lines[:n]
        del self._buf_events[:n]

    def _roll_back(self, payload: bytes, start: int, written: int, exc: BaseException) -> None:
        """Undo a partly written chunk so that the file ends on a whole record again.

        Plain text keeps the whole lines that made it; a partial zstd frame is cut off entirely
        (its lines could be decoded, but a clean sequence of frames is simpler to trust).
        """
        keep = payload.rfind(b"\n", 0, written) + 1 if self._cctx is None else 0
        kept_lines = payload.count(b"\n", 0, keep) if self._cctx is None else 0
        truncated = True
        if written > keep:
            try:
                os.ftruncate(self._fd, start + keep)
            except OSError:
                truncated = False
        if truncated:
            self._bytes_written = start + keep
        else:
            self._bytes_written = start + written
        self._commit(kept_lines)
        if isinstance(exc, OSError):
            raise self._fail(exc, "writing", torn=not truncated) from exc
        if not truncated:
            # The file now ends mid-record and nothing more can be appended cleanly.
            self._failure = OutputError(
                f"writing trace {self.path} was interrupted and could not be undone; "
                f"the trace keeps its first {self._events_on_disk} records",
                "record again",
            )

    def _fail(self, exc: OSError, step: str, torn: bool = False) -> OutputError:
        reason = _WRITE_REASONS.get(exc.errno or 0) or exc.strerror or str(exc)
        message = (
            f"{step} trace {self.path} failed: {reason} ({_errname(exc)}); "
            f"the trace keeps its first {self._events_on_disk} records"
        )
        if torn:
            message += " and ends in a partial record, which replay skips"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = "free space on that file system, or write the trace to another one"
        else:
            fix = "check the disk (dmesg may say more), or write the trace to another disk"
        self._failure = OutputError(message, fix)
        return self._failure

    def _check_writable(self) -> None:
        if self._fd < 0:
            raise ValueError(f"trace {self.path} is closed")
        if self._failure is not None:
            raise OutputError(self._failure.message, self._failure.fix)

    def _check_writable_or_close(self) -> None:
        try:
            self._check_writable()
        except OutputError:
            self._close_fd()
            raise

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def _zstd_compressor(path: str, level: int) -> Any:
    try:
        import zstandard  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise OutputError(
            f"cannot write {path}: zstd compression needs the zstandard package",
            "pip install zstandard, or drop the .zst suffix to write plain JSON lines",
        ) from None
    # One independent frame per chunk (compress(), not a stream) so that a cut file decodes up
    # to its last whole frame; the checksum makes a damaged frame an error, not silent garbage.
    return zstandard.ZstdCompressor(level=level, write_checksum=True)
