"""Where the CUDA driver library is: the libcuda a process maps, the host's own copy, and the
file offsets of the allocation entry points in it.

Pure parsers (``parse_maps``, ``parse_ldconfig``, ``symbol_offsets`` on bytes-like input) plus
thin readers of /proc and the file system, so everything here is tested without root or a GPU.

Why our own ELF symbol lookup rather than libbpf's ``func_name`` resolution: it reads the
symbol table once per library instead of once per probe, says which entry points a driver
version lacks before anything is attached, and finds entry points that are aliases of one
another (the same code under two names). Probing both names of one address would fire two
programs on every call and count each failure twice.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import subprocess
from dataclasses import dataclass

__all__ = [
    "ALLOC_FUNCTIONS",
    "FREE_FUNCTIONS",
    "ElfError",
    "Mapping",
    "attach_path",
    "host_libraries",
    "is_libcuda",
    "mappings_of",
    "parse_ldconfig",
    "parse_maps",
    "read_symbol_offsets",
    "symbol_offsets",
]

# The allocation entry points whose failures are caught (the BPF program names are in
# tracer.bpf.gpuprobe), and the frees that keep the per-process held bytes right.
ALLOC_FUNCTIONS = (
    "cuMemAlloc_v2",
    "cuMemAllocManaged",
    "cuMemAllocPitch_v2",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemCreate",
)
FREE_FUNCTIONS = ("cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemRelease")

# libcuda.so.1 is a symlink to libcuda.so.<driver version>; a process maps the target.
_LIBCUDA_RE = re.compile(r"(?:^|/)libcuda\.so(?:\.[0-9]+)*$")
_DELETED = " (deleted)"
# Directories the driver installs into, for hosts without ldconfig's cache.
_DRIVER_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/lib/wsl/lib",
)


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


def parse_ldconfig(text: str) -> list[str]:
    """Paths of libcuda.so.1 in ``ldconfig -p`` output."""
    out = []
    for line in text.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if sep and name.split(" ", 1)[0] == "libcuda.so.1":
            out.append(path.strip())
    return out


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


# ---------------------------------------------------------------------------------------------
# ELF: file offsets of exported functions


class ElfError(ValueError):
    """Not an ELF shared object this module can read."""


_SHT_SYMTAB, _SHT_DYNSYM = 2, 11
_PT_LOAD = 1
_STT_FUNC = 2
_SHN_UNDEF = 0
_EXPORTED = (1, 2)  # STB_GLOBAL, STB_WEAK: a static function of the same name is not the API


def symbol_offsets(buf: bytes | mmap.mmap, names: tuple[str, ...]) -> dict[str, int]:
    """File offsets (what a uprobe is attached at) of the defined global functions among
    ``names`` in a 64-bit ELF image. Missing names are absent from the result. GNU indirect
    functions (STT_GNU_IFUNC) are left out on purpose: their symbol is the resolver, not the
    code."""
    if len(buf) < 64 or buf[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    if buf[4] != 2:
        raise ElfError("not a 64-bit ELF file")
    if buf[5] not in (1, 2):
        raise ElfError("unknown ELF byte order")
    end = "<" if buf[5] == 1 else ">"
    try:
        return _offsets(buf, end, names)
    except struct.error as exc:
        raise ElfError(f"truncated ELF file ({exc})") from exc


def _offsets(buf: bytes | mmap.mmap, end: str, names: tuple[str, ...]) -> dict[str, int]:
    (_, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = struct.unpack_from(
        end + "HHIQQQIHHHHHH", buf, 16
    )
    loads: list[tuple[int, int, int]] = []  # (vaddr, filesz, offset)
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
            end + "IIQQQQQQ", buf, phoff + i * phentsize
        )
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_filesz, p_offset))
    sections = [
        struct.unpack_from(end + "IIQQQQIIQQ", buf, shoff + i * shentsize) for i in range(shnum)
    ]
    if not sections:
        raise ElfError("no section headers")
    wanted = {n.encode(): n for n in names}
    found: dict[str, int] = {}
    # .symtab first (unstripped libraries), then .dynsym (what a driver library exports)
    for kind in (_SHT_SYMTAB, _SHT_DYNSYM):
        for sh in sections:
            if sh[1] != kind or sh[9] == 0 or sh[6] >= len(sections):
                continue
            _, _, _, _, sym_off, sym_size, link, _, _, entsize = sh
            str_off, str_size = sections[link][4], sections[link][5]
            strtab = buf[str_off : str_off + str_size]
            for j in range(sym_size // entsize):
                st_name, st_info, _, st_shndx, st_value, _ = struct.unpack_from(
                    end + "IBBHQQ", buf, sym_off + j * entsize
                )
                if (
                    st_info & 0xF != _STT_FUNC
                    or st_info >> 4 not in _EXPORTED
                    or st_shndx == _SHN_UNDEF
                    or st_value == 0
                ):
                    continue
                stop = strtab.find(b"\0", st_name)
                raw = strtab[st_name : stop if stop >= 0 else len(strtab)].split(b"@", 1)[0]
                name = wanted.get(raw)
                if name is None or name in found:
                    continue
                for vaddr, filesz, offset in loads:
                    if vaddr <= st_value < vaddr + filesz:
                        found[name] = st_value - vaddr + offset
                        break
    return found


def read_symbol_offsets(path: str, names: tuple[str, ...]) -> dict[str, int]:
    """``symbol_offsets`` of a file, mapped rather than read: libcuda is tens of MiB and only
    its headers and symbol tables are looked at."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 64:
            raise ElfError("not an ELF file")
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            return symbol_offsets(mm, names)
