"""The kernel log device: reading new ``/dev/kmsg`` records, and their clock.

This module owns the file descriptor and nothing else: ``KmsgReader`` opens ``/dev/kmsg``
non-blocking, skips what was logged before it started, and hands back parsed records
(``tracer.parse.kmsg.parse_record``) for the OOM assembler. ``/dev/kmsg`` returns exactly one
record per ``read(2)`` and reports records the kernel overwrote before we read them with
``EPIPE``, which is why it cannot be read like a regular file.

Record timestamps are on the kernel's ``local_clock()`` (CLOCK_MONOTONIC, near enough) while
every whyrestart event is stamped on CLOCK_BOOTTIME; ``record_ts_ns`` bridges the two with
``tracer.clock``'s offset.
"""

from __future__ import annotations

import errno
import os

from tracer.clock import monotonic_to_boottime
from tracer.errors import KernelUnsupported, PermissionProblem, WhyrestartError
from tracer.parse.kmsg import KmsgRecord, parse_record

__all__ = ["KmsgReader", "record_ts_ns"]

DEFAULT_PATH = "/dev/kmsg"

# One record is at most ~1 KiB of text plus its dictionary; the kernel's own limit for a
# formatted record is CONSOLE_EXT_LOG_MAX (8 KiB), so EINVAL ("buffer too small") cannot
# happen at this size. The retry size is there in case a future kernel raises the limit.
_BUFSIZE = 8192
_RETRY_BUFSIZE = 65536

_PERMISSION_FIX = (
    "run whyrestart as root (reading the kernel log needs CAP_SYSLOG), "
    "or allow it with `sysctl kernel.dmesg_restrict=0`"
)


class KmsgReader:
    """Non-blocking reader of new kernel log records.

    ``read_available()`` returns every record logged since the previous call (or since the
    reader was opened) and never blocks; use ``fileno()`` with select/poll to wait.
    ``overwritten`` counts records the kernel dropped before they could be read, ``malformed``
    records that did not parse, ``skipped`` records passed over because they did not fit.
    """

    def __init__(self, path: str = DEFAULT_PATH, *, from_end: bool = True) -> None:
        self.path = path
        self.overwritten = 0
        self.malformed = 0
        self.skipped = 0
        self._last_seq: int | None = None
        self._epipe = False
        self._fd: int | None = None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise _open_error(path, exc) from exc
        try:
            if from_end:
                # Only what happens while we watch is evidence; old OOMs would be misattributed.
                os.lseek(fd, 0, os.SEEK_END)
        except OSError as exc:
            os.close(fd)
            raise KernelUnsupported(
                f"cannot seek in the kernel log {path}: {exc.strerror}",
                fix=f"{path} must be the kernel log character device (/dev/kmsg)",
            ) from exc
        self._fd = fd

    # -- lifecycle -------------------------------------------------------------------------

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError("KmsgReader is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> KmsgReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------

    def read_available(self) -> list[KmsgRecord]:
        """Every record available now, oldest first; ``[]`` when there is none."""
        fd = self.fileno()
        records: list[KmsgRecord] = []
        while True:
            raw = self._read_one(fd)
            if raw is None:
                return records
            if not raw:
                continue  # a record skipped or overwritten: keep going
            rec = parse_record(raw)
            if rec is None:
                self.malformed += 1
                continue
            self._account(rec)
            records.append(rec)

    def _read_one(self, fd: int) -> bytes | None:
        """One raw record; ``b""`` when a record was lost but more may follow; ``None`` at
        the end of what is available."""
        try:
            data = os.read(fd, _BUFSIZE)
        except BlockingIOError:  # EAGAIN: nothing more for now
            return None
        except BrokenPipeError:
            # EPIPE: the kernel overwrote records we had not read yet; the file position has
            # moved to the oldest record still there. How many were lost shows in the next
            # record's sequence number (see _account).
            self._epipe = True
            return b""
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise WhyrestartError(
                    f"reading the kernel log {self.path}: {exc.strerror}"
                ) from exc
            return self._read_oversized(fd)
        # A zero-length read is not something /dev/kmsg does; treat it as the end rather than
        # spinning.
        return data if data else None

    def _read_oversized(self, fd: int) -> bytes | None:
        # EINVAL: the record does not fit the buffer. The kernel does not advance past it, so
        # retry with a larger buffer, and if that fails too jump to the end of the log rather
        # than fail on the same record forever.
        try:
            return os.read(fd, _RETRY_BUFSIZE) or None
        except BlockingIOError:
            return None
        except BrokenPipeError:
            self._epipe = True  # the record was overwritten meanwhile
            return b""
        except OSError:
            os.lseek(fd, 0, os.SEEK_END)
            self.skipped += 1
            self._last_seq = None  # the jump is not an overwrite: don't count it as one
            self._epipe = False
            return None

    def _account(self, rec: KmsgRecord) -> None:
        lost = 0
        if self._last_seq is not None and rec.seq > self._last_seq + 1:
            lost = rec.seq - self._last_seq - 1
        if self._epipe and lost == 0:
            lost = 1  # EPIPE before our first record: at least one was lost, count unknown
        self.overwritten += lost
        self._epipe = False
        self._last_seq = rec.seq


def _open_error(path: str, exc: OSError) -> WhyrestartError:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PermissionProblem(
            f"cannot read the kernel log {path}: {exc.strerror}", fix=_PERMISSION_FIX
        )
    if exc.errno in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
        return KernelUnsupported(
            f"the kernel log {path} is not available: {exc.strerror}",
            fix="run on the host or mount /dev (devtmpfs) into the container; "
            "the kernel needs CONFIG_PRINTK",
        )
    return WhyrestartError(f"cannot open the kernel log {path}: {exc.strerror}")


# ---------------------------------------------------------------------------------------------
# Clocks


def record_ts_ns(rec: KmsgRecord, monotonic_offset: int) -> int:
    """The record's time on CLOCK_BOOTTIME (ns), given ``tracer.clock.monotonic_offset_ns()``."""
    return monotonic_to_boottime(rec.ts_us * 1000, monotonic_offset)
