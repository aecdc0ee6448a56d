"""Files kept open and re-read with ``pread`` (the samplers' one way to read a file), and the
bookkeeping every sampler shares: the problems already said (`ProblemLog`) and what sampling
cost (`SourceStats`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tracer.events import SampleError

READ_SIZE = 65536
O_READ = os.O_RDONLY | os.O_CLOEXEC

# PSI is absent without CONFIG_PSI, and disabled (files absent, or EOPNOTSUPP on read) by psi=0.
PSI_MISSING = "PSI needs Linux 4.20+ built with CONFIG_PSI=y, not booted with psi=0"


class ProblemLog:
    """Which problems were already reported, so that each is said once.

    A problem is (source, target, message). Samplers that share one log (those of a
    ``SamplerSet``) say a kernel-wide problem, such as a file this kernel lacks, once in all.
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, str, str]] = set()

    def once(self, ts: int, source: str, target: str, message: str) -> SampleError | None:
        """A ``SampleError`` the first time this problem is seen, else None."""
        key = (source, target, message)
        if key in self._seen:
            return None
        self._seen.add(key)
        return SampleError(ts=ts, source=source, target=target, message=message)

    def forget(self, source: str, target: str) -> None:
        """Forget the problems of one target: a target watched anew may report them again."""
        self._seen = {k for k in self._seen if (k[0], k[1]) != (source, target)}

    def __len__(self) -> int:
        return len(self._seen)


@dataclass(slots=True)
class SourceStats:
    """What one kind of sampler has cost: ``calls`` to ``sample``, the ``SampleError`` events
    they returned, and the time spent in them (``perf_counter`` ns)."""

    calls: int = 0
    errors: int = 0
    total_ns: int = 0

    @property
    def mean_us(self) -> float:
        return self.total_ns / self.calls / 1000 if self.calls else 0.0


class KeptFile:
    """One file kept open and re-read from offset 0 with ``pread``.

    ``read`` raises OSError. After a failed read the descriptor is closed; with ``reopen``
    the file is opened again once, at once (a file can fail transiently). Opens go through
    ``dir_fd`` when one is given (``openat``: never a namesake of a removed directory).
    """

    __slots__ = ("absent", "dir_fd", "fd", "name", "reopen")

    def __init__(self, name: str, dir_fd: int | None = None, *, reopen: bool = True) -> None:
        self.name = name
        self.dir_fd = dir_fd
        self.reopen = reopen
        self.fd: int | None = None
        self.absent = False  # missing on this host: not tried again

    def _open(self) -> int:
        fd = os.open(self.name, O_READ, dir_fd=self.dir_fd)
        self.fd = fd
        return fd

    def _pread_all(self, fd: int) -> bytes:
        data = os.pread(fd, READ_SIZE, 0)
        if len(data) < READ_SIZE:
            return data
        chunks = [data]
        offset = len(data)
        while True:  # a file larger than one read (none of ours is, today)
            chunk = os.pread(fd, READ_SIZE, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def read(self) -> str:
        fd = self.fd if self.fd is not None else self._open()
        try:
            data = self._pread_all(fd)
        except OSError:
            self.close()
            if not self.reopen:
                raise
            fd = self._open()
            try:
                data = self._pread_all(fd)
            except OSError:
                self.close()
                raise
        return data.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


def strerror(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)
