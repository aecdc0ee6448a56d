"""Where a libcuda is, as text says it: ``/proc/PID/maps`` lines and ``ldconfig -p`` output.

Pure (``tracer.gpu.libcuda`` does the reading): each function takes text and returns data.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

__all__ = ["Mapping", "is_libcuda", "parse_ldconfig", "parse_maps"]

# libcuda.so.1 is a symlink to libcuda.so.<driver version>; a process maps the target.
_LIBCUDA_RE = re.compile(r"(?:^|/)libcuda\.so(?:\.[0-9]+)*$")
_DELETED = " (deleted)"


def is_libcuda(path: str) -> bool:
    return _LIBCUDA_RE.search(path) is not None


@dataclass(frozen=True, slots=True)
class Mapping:
    """A libcuda file mapped by a process, as /proc/PID/maps shows it."""

    path: str  # inside the process's mount namespace
    dev: int  # st_dev of the mapped file (the inode uprobes are keyed by)
    inode: int
    start: int  # first mapping's address range, for /proc/PID/map_files
    end: int
    deleted: bool  # replaced on disk since it was mapped (a driver upgrade)

    @property
    def key(self) -> tuple[int, int]:
        return (self.dev, self.inode)


def parse_maps(text: str) -> list[Mapping]:
    """The libcuda files in a /proc/PID/maps text, one per file (first mapping)."""
    out: dict[tuple[int, int], Mapping] = {}
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6:
            continue
        path = parts[5]
        deleted = path.endswith(_DELETED)
        if deleted:
            path = path[: -len(_DELETED)]
        if not is_libcuda(path):
            continue
        try:
            lo, hi = (int(x, 16) for x in parts[0].split("-", 1))
            major, minor = (int(x, 16) for x in parts[3].split(":", 1))
            inode = int(parts[4])
        except ValueError:
            continue
        m = Mapping(path, os.makedev(major, minor), inode, lo, hi, deleted)
        out.setdefault(m.key, m)
    return list(out.values())


def parse_ldconfig(text: str) -> list[str]:
    """Paths of libcuda.so.1 in ``ldconfig -p`` output."""
    out = []
    for line in text.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if sep and name.split(" ", 1)[0] == "libcuda.so.1":
            out.append(path.strip())
    return out
