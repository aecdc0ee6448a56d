"""ELF symbol tables: the file offsets of exported functions (what a uprobe is attached at).

Pure: ``symbol_offsets`` takes the bytes (or a read-only mapping) of a 64-bit ELF image and
never touches the file system; ``tracer.bpf.gpuhooks`` maps the library file and asks. Why our
own lookup rather than libbpf's is said in ``tracer.gpu.libcuda``.
"""

from __future__ import annotations

import mmap
import struct

__all__ = ["ElfError", "symbol_offsets"]


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
