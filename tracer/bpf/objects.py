"""Where the compiled CO-RE objects are: a checkout's ``bpf/`` (built by scripts/setup), else
the copies the wheel carries in ``tracer/bpf/_bundled/`` (scripts/build puts them there)."""

from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT_DIR = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "bpf")
BUNDLED_DIR = os.path.join(_HERE, "_bundled")


def default_object(name: str) -> str:
    """``bpf/NAME`` of a checkout when it exists (a fresh build wins over any bundled copy),
    else the wheel's copy; the checkout's path when neither exists (doctor says it is missing,
    and where scripts/setup would build it)."""
    built = os.path.join(CHECKOUT_DIR, name)
    bundled = os.path.join(BUNDLED_DIR, name)
    if not os.path.exists(built) and os.path.exists(bundled):
        return bundled
    return built
