"""The recorder protects the host from itself: it must never be the process that takes a host
down, nor the one the OOM killer spares the workload for.

* ``oom_score_adj`` is lowered to -900, so that under a host-wide OOM the kernel kills the
  workload it is watching before it kills the witness (not -1000: on a host that is truly out of
  memory the tracer should still be killable rather than wedge the machine);
* its data size is capped with RLIMIT_DATA (heap and private mappings, kernel 4.7+), so a bug
  or an event flood ends the recording with a MemoryError (and a trace footer) instead of
  growing without bound. The normal footprint is 30-45 MB (the 2 MiB ring buffer, mapped twice,
  is 4 MB of it);
* ``trim_heap`` hands freed heap back to the kernel (glibc ``malloc_trim``): loading the BPF
  object makes libbpf parse the kernel's whole BTF (about 11 MB here) and free it again, and
  glibc keeps freed heap mapped unless asked; called after start-up and once a minute.

Both limits are restored when the recording ends, and written into the trace header. Both are
inherited across fork, so the recorded command undoes them in its child before exec
(`Guard.reset_in_child`): the workload must keep its own OOM score and limits. They are the
whole process's, though, so every other child started while the recording runs inherits them
too: a program that records in one of its threads while it starts other programs (the tests,
which start containers beside a recording) turns the guard off (``guarded(apply=False)``,
through the recorder profile's ``self_guard``) rather than hand it to them.
"""

from __future__ import annotations

import contextlib
import ctypes
import resource
from collections.abc import Iterator
from typing import Any

OOM_SCORE_ADJ = -900
DATA_LIMIT_BYTES = 1 << 30


OFF = "off: the recording shares its process with other work (Profile.self_guard)"


class Guard:
    def __init__(self, proc_root: str) -> None:
        self.path = f"{proc_root}/self/oom_score_adj"
        self.applied: dict[str, Any] = {}
        self.old_adj: str | None = None
        self.old_limit = resource.getrlimit(resource.RLIMIT_DATA)
        self._on = False

    def apply(self) -> None:
        self._on = True
        try:
            with open(self.path) as f:
                self.old_adj = f.read().strip()
            with open(self.path, "w") as f:
                f.write(str(OOM_SCORE_ADJ))
            self.applied["oom_score_adj"] = OOM_SCORE_ADJ
        except OSError as exc:
            # e.g. a container without CAP_SYS_RESOURCE: say so in the header, go on
            self.applied["oom_score_adj_error"] = exc.strerror or str(exc)
        soft, hard = self.old_limit
        want = DATA_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(DATA_LIMIT_BYTES, hard)
        if soft == resource.RLIM_INFINITY or soft > want:
            try:
                resource.setrlimit(resource.RLIMIT_DATA, (want, hard))
                self.applied["data_limit_bytes"] = want
            except (ValueError, OSError) as exc:
                self.applied["data_limit_error"] = str(exc)

    def reset_in_child(self) -> None:
        """In the forked command, before exec: give it back what the recorder had."""
        if not self._on:
            return
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_DATA, self.old_limit)
        if self.old_adj is not None:
            with contextlib.suppress(OSError), open(self.path, "w") as f:
                f.write(self.old_adj)

    def restore(self) -> None:
        self.reset_in_child()


@contextlib.contextmanager
def guarded(proc_root: str = "/proc", apply: bool = True) -> Iterator[Guard]:
    """Apply the protections for the duration of a recording (``apply`` False: none, and the
    header says they are off)."""
    guard = Guard(proc_root)
    if apply:
        guard.apply()
    else:
        guard.applied["off"] = OFF
    try:
        yield guard
    finally:
        guard.restore()


def trim_heap() -> None:
    """Return free heap pages to the kernel; a no-op where libc has no ``malloc_trim`` (musl)."""
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
