"""One exception hierarchy for every failure a user can meet, each with its exit code.

Errors are raised at the boundary where they happen (a libbpf call, a file open, a cgroup
lookup) with a message that names the step and the fix; the CLI maps each class to its exit
code and prints ``whyrestart: <message>`` without a traceback.
"""

from __future__ import annotations


class WhyrestartError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class UsageError(WhyrestartError):
    """Bad arguments: a pid or cgroup that does not exist, conflicting options."""

    exit_code = 2


class PermissionProblem(WhyrestartError):
    """Not root, or a capability is missing."""

    exit_code = 3


class KernelUnsupported(WhyrestartError):
    """The kernel cannot do what is needed: no BTF, no tracefs, no hook attached."""

    exit_code = 4


class BpfError(WhyrestartError):
    """A libbpf step failed (open, load, attach, poll, map access)."""

    exit_code = 5

    def __init__(self, step: str, errno_: int, fix: str | None = None) -> None:
        import errno as _errno
        import os

        name = _errno.errorcode.get(errno_, str(errno_))
        super().__init__(f"{step}: {name} ({os.strerror(errno_)})", fix)
        self.step = step
        self.errno = errno_


class TraceFileError(WhyrestartError):
    """A trace file that is missing, empty, corrupt, foreign or from a newer schema."""

    exit_code = 6


class OutputError(WhyrestartError):
    """The output cannot be written (unwritable path, disk full)."""

    exit_code = 7
