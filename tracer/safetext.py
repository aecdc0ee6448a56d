"""Untrusted text made safe for a terminal: the one place where workload-chosen strings are
escaped before they are printed.

A process picks its own name (``prctl(PR_SET_NAME)``, no privilege), its executable's path, its
container's and unit's names, what its health endpoint answers and what it writes to the kernel
log. Printed raw to the root operator's terminal, a name like ``ESC]0;pwned BEL ESC[2K`` retitles
the window, erases lines or forges a verdict. Like kubectl's terminal escaping, every text
output passes that text through here once, where it reaches the terminal; JSON keeps the exact
value (orjson escapes C0 controls itself, :func:`json_text` the rest), HTML escapes its own way.

Escaped: every control character (C0, DEL, C1: category Cc), the Unicode line and paragraph
separators, and the bidirectional overrides that reorder what is displayed ("Trojan source").
They are shown as ``\\xNN`` / ``\\uNNNN``, so the value can still be read and searched.
"""

from __future__ import annotations

import re

# C1 and DEL; LINE/PARAGRAPH SEPARATOR; the bidi marks, embeddings, overrides and isolates
# (U+061C ALM, U+200E/F LRM/RLM, U+202A-E, U+2066-9). Fields also lose every C0 character (TAB,
# LF and CR included); a block keeps its LF.
_BEYOND_C0 = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE_FIELD = re.compile(f"[\x00-\x1f{_BEYOND_C0}]")
_UNSAFE_BLOCK = re.compile(f"[\x00-\x09\x0b-\x1f{_BEYOND_C0}]")
# JSON: orjson writes C0 as \\u escapes (RFC 8259 requires it) but DEL, C1 and the rest as raw
# UTF-8, which a terminal showing `--json` output would still obey (U+009B is CSI on many).
_UNSAFE_JSON = re.compile(f"[{_BEYOND_C0}]")

# Past this many characters a table cell is cut in the middle (a 4 KiB cgroup path or unit
# name would otherwise widen every row); evidence lines keep the whole value.
CELL_MAX = 60


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def field(text: str) -> str:
    """One value shown on one line (a name, a path, an error string): every control character,
    line break included, escaped."""
    if text.isprintable():  # the common case, decided in C
        return text
    return _UNSAFE_FIELD.sub(_escape, text)


def block(text: str) -> str:
    """Text that we laid out in lines (a table, a report): line breaks kept, every other
    control character escaped. Fields inside it should have gone through :func:`field`, so
    that a name cannot add a line; this is the last guard before the terminal."""
    if text.isprintable():
        return text
    return _UNSAFE_BLOCK.sub(_escape, text)


def cell(text: str, width: int = CELL_MAX) -> str:
    """A table cell: :func:`field`, then cut in the middle past ``width`` characters."""
    text = field(text)
    if len(text) <= width:
        return text
    keep = width - 1
    return text[: keep - keep // 2] + "…" + text[len(text) - keep // 2 :]


def json_text(text: str) -> str:
    """JSON text (from orjson) with the control characters it leaves raw written as ``\\uNNNN``
    escapes: the same value for a JSON reader, nothing a terminal obeys."""
    return _UNSAFE_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
