"""Values as a user writes them: sizes, durations, spans of time and comma lists. Pure.

One parser per kind of value, shared by every option and by ``repro``'s plan, so that ``64M``
or ``500ms`` mean the same thing on every command. Bad text is a `UsageError` that names what
was wrong and the forms that are accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TypeVar

from tracer.errors import UsageError

__all__ = [
    "DURATION_FORMS",
    "SIZE_FORMS",
    "parse_duration",
    "parse_list",
    "parse_size",
    "parse_span",
]

T = TypeVar("T")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?b?\s*$", re.IGNORECASE)
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}
SIZE_FORMS = "bytes (67108864) or a number with K, M, G or T (64M, 1.5G; 512Mi and 1Gi too)"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)?\s*$")
DURATION_FORMS = "seconds (0.5), milliseconds (500ms) or seconds with a unit (2s)"

_SPAN_UNITS = {"m": 60, "h": 3600, "d": 86400}
SPAN_FORMS = "minutes, hours or days (30m, 1h, 2d), or seconds (90s)"


def parse_size(text: str) -> int:
    """``64M`` / ``1G`` / ``512Mi`` / ``1.5g`` / ``67108864`` → bytes.

    K, M, G and T are powers of 1024 with or without the ``i`` (as ``docker run --memory 64m``
    means 64 MiB); a trailing ``B`` is allowed. Zero and fractions of a byte are refused.
    """
    m = _SIZE.match(text)
    if m is None:
        raise UsageError(f"bad size {text!r}", fix=f"write {SIZE_FORMS}")
    number, unit = m.group(1), m.group(2)
    value = float(number) * (1024 ** _POWERS[unit.lower()] if unit else 1)
    if value < 1 or value != int(value):
        raise UsageError(f"bad size {text!r}: not a whole number of bytes above zero")
    return int(value)


def parse_duration(text: str) -> float:
    """``0.5`` / ``500ms`` / ``2s`` / ``1.5s`` → seconds (float). Zero, negative, non-finite or
    other units are a ``UsageError``."""
    m = _DURATION.match(text)
    if m is None:
        raise UsageError(f"bad duration {text!r}", fix=f"write {DURATION_FORMS}")
    value = float(m.group(1))
    if m.group(2) == "ms":
        value /= 1000.0
    if not math.isfinite(value) or value <= 0:
        raise UsageError(
            f"bad duration {text!r}: must be more than zero", fix=f"write {DURATION_FORMS}"
        )
    return value


def parse_span(option: str, text: str) -> float:
    """A span of history (``--since``, ``--retain``): ``30m``, ``1h``, ``2d`` or a duration
    (``90s``) → seconds, above zero; a refusal names ``option``."""
    t = text.strip()
    try:
        if t[-1:] in _SPAN_UNITS and t[:-1].replace(".", "", 1).isdigit():
            value = float(t[:-1]) * _SPAN_UNITS[t[-1]]
        else:
            value = parse_duration(t)
    except (UsageError, ValueError):
        raise UsageError(f"{option} {text}: not a duration", f"write {SPAN_FORMS}") from None
    if value <= 0:
        raise UsageError(f"{option} {text}: must be positive", f"write {SPAN_FORMS}")
    return value


def parse_list(option: str, text: str, parse_one: Callable[[str], T]) -> list[tuple[str, T]]:
    """``"32M,256M"`` → ``[("32M", 33554432), ("256M", ...)]``: each value as written and as
    parsed; an empty value or one listed twice is refused, naming ``option``."""
    parts = [p.strip() for p in text.split(",")]
    if any(not p for p in parts):
        raise UsageError(
            f"bad {option} {text!r}: an empty value", fix="separate values with commas"
        )
    values = [(p, parse_one(p)) for p in parts]
    seen: dict[T, str] = {}
    for written, value in values:
        if value in seen:
            raise UsageError(
                f"bad {option} {text!r}: {seen[value]} and {written} are the same value",
                fix="list each value once; --runs N repeats every value N times",
            )
        seen[value] = written
    return values
