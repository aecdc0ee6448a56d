"""Memory accounting text: ``/proc/meminfo``, PSI, ``/proc/PID/status``, memcg stat files.

This module owns the pure parsing steps of the memory samplers (``tracer.sources.samplers``
does the reading): each function takes the text of one file and returns data, never touching
the filesystem or a clock. Real files change shape between kernels (fields appear, v1 and v2
spell things differently), so every parser is defensive: a line it does not understand is
skipped, a field the kernel did not print is simply absent, and nothing here raises on odd
input (a property test feeds them arbitrary text).

Numbers are read with ASCII digits only, bounded in length, so Unicode digits or a runaway
digit string never reach ``int()`` (whose digit limit would raise).

Files and their shapes::

    /proc/meminfo          "MemTotal:       24684092 kB"   (kB, some lines unit-less counts)
    */pressure, memory.pressure (PSI, Linux 4.20+)
                           "some avg10=0.00 avg60=0.00 avg300=0.00 total=6017"
                           "full avg10=0.00 avg60=0.00 avg300=0.00 total=3639"
    /proc/PID/status       "RssAnon:\t     112 kB"        (RssAnon/RssFile/RssShmem: 4.5+)
    memory.oom_control     "oom_kill_disable 0\\nunder_oom 0\\noom_kill 3"  (v1; oom_kill 4.13+)
    memory.stat            "anon 4096\\n..." (v2) / "rss 4096\\n...total_rss 8192" (v1)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "STAT_KEYS",
    "Pressure",
    "normalize_stat",
    "parse_meminfo",
    "parse_oom_control",
    "parse_pressure",
    "parse_proc_status",
    "parse_stat",
    "parse_uint",
    "proc_status_state",
]

# Longest decimal we accept: 2**64 has 20 digits. Anything longer is garbage, not a counter.
_MAX_DIGITS = 20


def parse_uint(text: str) -> int | None:
    """A non-negative decimal integer (surrounding whitespace allowed), or None.

    For single-value files such as ``memory.current`` or ``memory.failcnt``.
    """
    s = text.strip()
    if not s or len(s) > _MAX_DIGITS or not (s.isascii() and s.isdigit()):
        return None
    return int(s)


def _line_after(text: str, prefix: str) -> str | None:
    """The rest of the first line that starts with ``prefix``, or None.

    Why: a sampler needs 4 to 20 keys of a file of 40 to 60 lines, and looking each one up
    with ``str.find`` (in C) costs a fraction of a Python loop over every line (about 10 µs
    against 40 µs for /proc/meminfo on the development VMs).
    """
    if text.startswith(prefix):
        start = len(prefix)
    else:
        i = text.find("\n" + prefix)
        if i < 0:
            return None
        start = i + 1 + len(prefix)
    end = text.find("\n", start)
    return text[start:] if end < 0 else text[start:end]


# ---------------------------------------------------------------------------------------------
# /proc/meminfo and /proc/PID/status: "Key:   value [kB]"


def _kb_value(rest: str, *, counts: bool) -> int | None:
    parts = rest.split()
    if len(parts) == 2 and parts[1] == "kB":
        n = parse_uint(parts[0])
        return None if n is None else n * 1024
    if counts and len(parts) == 1:
        return parse_uint(parts[0])
    return None


def _kb_keys(text: str, keys: Iterable[str], *, counts: bool) -> dict[str, int]:
    out: dict[str, int] = {}
    for key in keys:
        rest = _line_after(text, key + ":")
        if rest is not None:
            value = _kb_value(rest, counts=counts)
            if value is not None:
                out[key] = value
    return out


def _kb_lines(text: str, *, counts: bool) -> dict[str, int]:
    """``Key: N kB`` lines as bytes; with ``counts`` also unit-less ``Key: N`` lines as is."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep or not key or key != key.strip():
            continue
        value = _kb_value(rest, counts=counts)
        if value is not None:
            out[key] = value
    return out


def parse_meminfo(text: str, keys: Iterable[str] | None = None) -> dict[str, int]:
    """``/proc/meminfo`` → ``{"MemTotal": bytes, ...}``: every line, or only ``keys``.

    ``kB`` values are converted to bytes (the kernel's "kB" is KiB). The few unit-less lines
    (``HugePages_Total: 0``, page counts) are kept as the plain numbers they are. Keys keep the
    kernel's spelling (``Active(anon)``). ``MemAvailable`` is absent before Linux 3.14. With
    ``keys`` each is looked up directly (the first line that has it), which is much cheaper
    than parsing the whole file.
    """
    if keys is not None:
        return _kb_keys(text, keys, counts=True)
    return _kb_lines(text, counts=True)


def parse_proc_status(text: str, keys: Iterable[str] | None = None) -> dict[str, int]:
    """The ``kB`` fields of ``/proc/PID/status`` in bytes (``{"RssAnon": ..., "VmSwap": ...}``).

    Only lines with a ``kB`` unit are kept (VmPeak, VmRSS, RssAnon, RssFile, RssShmem, VmSwap,
    HugetlbPages...); with ``keys``, only those (looked up directly). A kernel thread or a
    zombie prints none of the Vm*/Rss* lines, and RssAnon/RssFile/RssShmem exist only since
    Linux 4.5: absent keys, not errors.
    """
    if keys is not None:
        return _kb_keys(text, keys, counts=False)
    return _kb_lines(text, counts=False)


def proc_status_state(text: str) -> str | None:
    """The one-letter process state from ``/proc/PID/status`` (``"R"``, ``"S"``, ``"Z"``...)."""
    rest = _line_after(text, "State:")
    if rest is None:
        return None
    parts = rest.split()
    return parts[0] if parts and len(parts[0]) == 1 else None


# ---------------------------------------------------------------------------------------------
# PSI


@dataclass(frozen=True, slots=True)
class Pressure:
    """One PSI file: the share of time tasks stalled on a resource (percent) and the total stall
    time (microseconds). "some": at least one task stalled; "full": all non-idle tasks stalled
    at once. ``full_*`` is None where the kernel printed no "full" line (system-wide CPU PSI
    before Linux 5.13); memory PSI always has both."""

    some_avg10: float
    some_avg60: float
    some_total_us: int
    full_avg10: float | None = None
    full_avg60: float | None = None
    full_total_us: int | None = None


def _psi_line(fields: list[str]) -> tuple[float, float, int] | None:
    values: dict[str, str] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if sep:
            values[key] = value
    try:
        avg10 = float(values["avg10"])
        avg60 = float(values["avg60"])
    except (KeyError, ValueError):
        return None
    total = parse_uint(values.get("total", ""))
    # float() accepts "nan", "inf", "1_0": only finite non-negative shares are real.
    if total is None or not all(math.isfinite(a) and a >= 0 for a in (avg10, avg60)):
        return None
    return avg10, avg60, total


def parse_pressure(text: str) -> Pressure | None:
    """A PSI file (``/proc/pressure/memory``, a cgroup's ``memory.pressure``) or None.

    None when there is no well-formed "some" line. A malformed "full" line is treated as
    absent. Extra fields (avg300) and unknown lines are ignored.
    """
    some: tuple[float, float, int] | None = None
    full: tuple[float, float, int] | None = None
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "some" and some is None:
            some = _psi_line(fields[1:])
        elif fields[0] == "full" and full is None:
            full = _psi_line(fields[1:])
    if some is None:
        return None
    if full is None:
        return Pressure(some[0], some[1], some[2])
    return Pressure(some[0], some[1], some[2], full[0], full[1], full[2])


# ---------------------------------------------------------------------------------------------
# memcg files


def _flat_keyed(text: str) -> dict[str, int]:
    """ "key value" lines with a non-negative integer value; the last of a repeated key wins."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        n = parse_uint(parts[1])
        if n is not None:
            out[parts[0]] = n
    return out


def parse_oom_control(text: str) -> dict[str, int]:
    """v1 ``memory.oom_control`` → ``{"oom_kill_disable": 0, "under_oom": 0, "oom_kill": 3}``.

    ``oom_kill`` (the count of OOM kills in this cgroup) exists since Linux 4.13; older kernels
    print only the first two lines.
    """
    return _flat_keyed(text)


# The memory.stat keys kept, in v2 spelling. Bytes, except the event counters pgmajfault and
# workingset_refault_* (counts). Keys appear over kernel releases (e.g. workingset_refault_anon
# and _file replaced workingset_refault in 5.9, "kernel" came in 5.18): whatever exists is kept.
STAT_KEYS: tuple[str, ...] = (
    "anon",
    "file",
    "file_mapped",
    "shmem",
    "kernel",
    "kernel_stack",
    "slab",
    "sock",
    "pagetables",
    "anon_thp",
    "active_anon",
    "inactive_anon",
    "active_file",
    "inactive_file",
    "file_dirty",
    "file_writeback",
    "swapcached",
    "pgmajfault",
    "workingset_refault_anon",
    "workingset_refault_file",
)

# v1 name → v2 name, for the v1 keys whose meaning matches a v2 key. ("rss" is anon plus swap
# cache in v1; close enough to v2's "anon" for a breakdown, and the only anon figure v1 has.)
_V1_TO_V2 = {
    "rss": "anon",
    "cache": "file",
    "mapped_file": "file_mapped",
    "rss_huge": "anon_thp",
    "dirty": "file_dirty",
    "writeback": "file_writeback",
}
# v1 keys kept under their own names: same name and meaning in v2, or ("swap") no v2 twin in
# memory.stat (v2 reports swap in memory.swap.current).
_V1_SAME = frozenset(
    {
        "shmem",
        "active_anon",
        "inactive_anon",
        "active_file",
        "inactive_file",
        "swapcached",
        "pgmajfault",
        "workingset_refault_anon",
        "workingset_refault_file",
        "swap",
    }
)


def normalize_stat(raw: Mapping[str, int], version: int) -> dict[str, int]:
    """The kept subset of a parsed ``memory.stat``, in v2 names, covering the whole subtree.

    ``version`` 2: the keys of ``STAT_KEYS`` that exist. v2's memory.stat is hierarchical (it
    counts the cgroup and all its descendants), like ``memory.current``.

    ``version`` 1: v1's plain keys count only the cgroup's own pages, while its ``total_*``
    twins count the subtree, as ``memory.usage_in_bytes`` does. So each key is taken from
    ``total_<key>`` when the kernel prints it, else from ``<key>``, and renamed to v2's
    spelling: rss→anon, cache→file, mapped_file→file_mapped, rss_huge→anon_thp,
    dirty→file_dirty, writeback→file_writeback; shmem, the LRU sizes, swapcached, pgmajfault
    and workingset_refault_* keep their names, and v1's ``swap`` (swap used by the subtree) is
    kept as ``swap``. The v1 names themselves are not repeated in the result.

    Any other version gives ``{}``.
    """
    out: dict[str, int] = {}
    if version == 2:
        for key in STAT_KEYS:
            value = raw.get(key)
            if isinstance(value, int):
                out[key] = value
        return out
    if version != 1:
        return out
    for key in _V1_KEYS:
        value = raw.get("total_" + key)
        if not isinstance(value, int):
            value = raw.get(key)
        if isinstance(value, int):
            out[_V1_TO_V2.get(key, key)] = value
    return out


_V1_KEYS = (*_V1_TO_V2, *sorted(_V1_SAME))
# Precomputed "\nkey " needles for parse_stat: (needles to try in order, result key).
_STAT_NEEDLES = {
    2: tuple(((f"\n{k} ",), k) for k in STAT_KEYS),
    1: tuple(((f"\ntotal_{k} ", f"\n{k} "), _V1_TO_V2.get(k, k)) for k in _V1_KEYS),
}


def parse_stat(text: str, version: int) -> dict[str, int]:
    """``normalize_stat(parse_flat_keyed(text), version)``, computed faster.

    The kept keys are looked up directly with ``str.find`` instead of parsing every line (a v2
    memory.stat has about 60 lines, of which 20 are kept): about 20 µs instead of 35 µs for a
    v1 memory.stat on the development VMs. Same result for the files the kernel writes (one
    "key value" per line, each key once; where a key repeats, this takes the first).
    """
    out: dict[str, int] = {}
    needles = _STAT_NEEDLES.get(version)
    if needles is None:
        return out
    text = "\n" + text
    find = text.find
    for candidates, name in needles:
        for needle in candidates:
            i = find(needle)
            if i < 0:
                continue
            start = i + len(needle)
            end = find("\n", start)
            value = text[start:] if end < 0 else text[start:end]
            if not (value.isdigit() and value.isascii() and len(value) <= _MAX_DIGITS):
                n = parse_uint(value)
                if n is None:
                    continue
                out[name] = n
            else:
                out[name] = int(value)
            break
    return out
