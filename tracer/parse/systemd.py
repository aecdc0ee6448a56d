"""``systemctl show`` output: ``Key=value`` lines. Pure (``tracer.runtimes.systemd`` runs it)."""

from __future__ import annotations

__all__ = ["parse_systemctl_show"]


def parse_systemctl_show(text: str) -> dict[str, str]:
    """``Key=value`` lines → dict. Values keep their text ("[not set]" stays as it is)."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and " " not in key:
            props[key] = value
    return props
