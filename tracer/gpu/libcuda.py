"""Where the CUDA driver library is: the libcuda a process maps, the host's own copy, and the
file offsets of the allocation entry points in it.

Thin readers of /proc and the file system over pure parsers (``tracer.parse.libcuda``:
``parse_maps``, ``parse_ldconfig``), so everything here is tested without root or a GPU. The
entry points' file offsets are read from the ELF symbol tables by ``tracer.parse.elf`` (the
uprobe loader, ``tracer.bpf.gpuhooks``, looks them up when it attaches a library).

Why our own ELF symbol lookup rather than libbpf's ``func_name`` resolution: it reads the
symbol table once per library instead of once per probe, says which entry points a driver
version lacks before anything is attached, and finds entry points that are aliases of one
another (the same code under two names). Probing both names of one address would fire two
programs on every call and count each failure twice.
"""

from __future__ import annotations

import os
import subprocess

from tracer.parse.libcuda import Mapping, parse_ldconfig, parse_maps

__all__ = [
    "Mapping",
    "attach_path",
    "host_libraries",
    "mappings_of",
]

# Directories the driver installs into, for hosts without ldconfig's cache.
_DRIVER_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/lib/wsl/lib",
)


def mappings_of(pid: int, proc: str = "/proc") -> list[Mapping]:
    """The libcuda files process ``pid`` maps; [] when it maps none or is gone."""
    try:
        with open(f"{proc}/{pid}/maps", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    return parse_maps(text)


def attach_path(pid: int, m: Mapping, proc: str = "/proc") -> str | None:
    """A path, valid in our mount namespace, to the very file the process maps.

    /proc/PID/map_files/<range> is that file even when it was replaced on disk or lives in a
    container's overlay (root only); /proc/PID/root/<path> is the fallback, accepted only when
    its inode matches. None when neither can be opened (the process is gone)."""
    candidates = (f"{proc}/{pid}/map_files/{m.start:x}-{m.end:x}", f"{proc}/{pid}/root{m.path}")
    for i, path in enumerate(candidates):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if i == 0 or (st.st_ino == m.inode and st.st_dev == m.dev):
            return path
    return None


def host_libraries() -> list[str]:
    """The host's libcuda.so.1 files (symlinks resolved, each file once), for probing before
    any process maps them: a process then has its first allocation caught too."""
    found: list[str] = []
    try:
        res = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=5, check=False
        )
        found = parse_ldconfig(res.stdout)
    except (OSError, subprocess.SubprocessError):
        pass
    found += [os.path.join(d, "libcuda.so.1") for d in _DRIVER_DIRS]
    out: list[str] = []
    seen: set[tuple[int, int]] = set()
    for path in found:
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            out.append(real)
    return out


def file_key(st: os.stat_result) -> tuple[int, int, int]:
    """One driver library file, however it is reached: the same key through every container's
    overlay mount of an image, through the host path, /proc/PID/fd or /proc/PID/map_files.
    Neither st_dev (each overlay mount has its own; /proc/PID/maps shows it too since 6.8) nor
    the path can say that; the real inode's number can (overlayfs reports it where the layers
    share a file system, as gpu.bpf.c's hold key assumes), with the size and modification time
    so that files of two file systems that happen to share a number stay apart."""
    return (st.st_ino, st.st_size, st.st_mtime_ns)
