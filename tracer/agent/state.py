"""The agent's state directory: one agent at a time (a lock), a fixed layout, and a disk budget.

Layout under ``--state-dir`` (default /var/lib/whyrestart):

  lock                 flock()ed by the running agent; holds its pid
  segments/            seg-<boot>-<first ts>.trace[.zst]: the recent ring, oldest first
  incidents/           <id>.trace[.zst]: one evidence window per notable verdict
  journal.jsonl        verdicts and restarts (tracer.agent.journal), and journal.1.jsonl, the
                       generation before (the journal rotates at a sixteenth of the budget)

The budget (``--max-disk``) counts everything here. Over it, the oldest segments go first (the
ring is a cache of the recent past) and incidents only when no segment is left to evict (they
are what someone will ask about); the journal bounds itself by rotating. Every eviction is
counted (whyrestart_evicted_files_total) and an evicted incident is said.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from dataclasses import dataclass

from tracer.errors import OutputError, PermissionProblem, UsageError

DEFAULT_STATE_DIR = "/var/lib/whyrestart"
STATE_DIR_ENV = "WHYRESTART_STATE_DIR"
SEGMENTS = "segments"
INCIDENTS = "incidents"
# An incident is cut under PARTIAL + its name (same suffix: it says how the file is encoded) and
# renamed when complete: `replay ID`, a copier or a wait for the file never reads half of one
# (a cut after a storm takes a second).
PARTIAL = ".partial-"
JOURNAL = "journal.jsonl"
JOURNAL_OLD = "journal.1.jsonl"  # the previous generation, after a rotation
LOCK = "lock"


def default_state_dir() -> str:
    """$WHYRESTART_STATE_DIR, else /var/lib/whyrestart (what --state-dir defaults to)."""
    return os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR


@dataclass(frozen=True, slots=True)
class Evicted:
    path: str
    size: int
    kind: str  # "segment" or "incident"


def _files(directory: str) -> list[tuple[str, int, float]]:
    """(path, size, mtime) of the plain files in ``directory``, oldest first (by name: names
    begin with a time stamp, so a clock change does not reorder them)."""
    out: list[tuple[str, int, float]] = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return out
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if os.path.isfile(path) and not os.path.islink(path):
            out.append((path, st.st_size, st.st_mtime))
    return out


class StateDir:
    """The directory, opened and locked by one agent (`open`), or read by `history` and friends
    (`StateDir(path)` without a lock)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.segments = os.path.join(self.path, SEGMENTS)
        self.incidents = os.path.join(self.path, INCIDENTS)
        self.journal = os.path.join(self.path, JOURNAL)
        self.journal_old = os.path.join(self.path, JOURNAL_OLD)
        self._lock_fd: int | None = None

    @classmethod
    def open(cls, path: str) -> StateDir:
        """Create the layout and take the lock; errors name the fix."""
        sd = cls(path)
        parent = os.path.dirname(sd.path)
        if not os.path.isdir(parent):
            raise UsageError(
                f"state directory {sd.path}: {parent} does not exist",
                "create the parent directory or choose another --state-dir",
            )
        try:
            for d in (sd.path, sd.segments, sd.incidents):
                os.makedirs(d, mode=0o700, exist_ok=True)
            fd = os.open(os.path.join(sd.path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise _dir_error(sd.path, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise UsageError(
                f"another whyrestart agent (pid {holder}) is using {sd.path}",
                "stop that agent first, or give this one its own --state-dir",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        sd._lock_fd = fd
        if not os.access(sd.path, os.W_OK):
            sd.close()
            raise _dir_error(sd.path, OSError(errno.EACCES, os.strerror(errno.EACCES)))
        return sd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # -- the budget -------------------------------------------------------------------------

    def segment_files(self) -> list[tuple[str, int, float]]:
        return _files(self.segments)

    def incident_files(self) -> list[tuple[str, int, float]]:
        """The incidents kept (not one being cut: it is written under a PARTIAL name)."""
        return [f for f in _files(self.incidents) if not os.path.basename(f[0]).startswith(PARTIAL)]

    def incident_bytes(self) -> int:
        """What the incidents take, the one being cut included."""
        return sum(s for _, s, _ in _files(self.incidents))

    def journal_bytes(self) -> int:
        total = 0
        for path in (self.journal, self.journal_old):
            with contextlib.suppress(OSError):
                total += os.path.getsize(path)
        return total

    def used(self) -> int:
        """Bytes the budget counts: segments, incidents and the journal."""
        return (
            sum(s for _, s, _ in self.segment_files())
            + self.incident_bytes()
            + self.journal_bytes()
        )

    def enforce(self, max_bytes: int, keep: str | None = None) -> list[Evicted]:
        """Evict until at most ``max_bytes`` are used: oldest segments first (never ``keep``,
        the one being written), then the oldest incidents."""
        segs = [f for f in self.segment_files() if f[0] != keep]
        incs = self.incident_files()
        used = sum(s for _, s, _ in segs) + self.incident_bytes() + self.journal_bytes()
        if keep is not None:
            with contextlib.suppress(OSError):
                used += os.path.getsize(keep)
        out: list[Evicted] = []
        for kind, files in (("segment", segs), ("incident", incs)):
            for path, size, _ in files:
                if used <= max_bytes:
                    return out
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                used -= size
                out.append(Evicted(path, size, kind))
        return out

    def expire_segments(self, older_than: float, keep: str | None = None) -> list[Evicted]:
        """Remove segments last written before ``older_than`` (a time.time() value)."""
        out: list[Evicted] = []
        for path, size, mtime in self.segment_files():
            if path != keep and mtime < older_than:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                out.append(Evicted(path, size, "segment"))
        return out

    def incident_path(self, incident_id: str) -> str | None:
        """The trace of an incident by its id, or None."""
        for suffix in (".trace.zst", ".trace"):
            path = os.path.join(self.incidents, incident_id + suffix)
            if os.path.isfile(path):
                return path
        return None


def _dir_error(path: str, exc: OSError) -> Exception:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PermissionProblem(
            f"state directory {path} is not writable ({exc.strerror})",
            "run the agent as root, or choose a writable --state-dir",
        )
    if exc.errno == errno.EROFS:
        return OutputError(
            f"state directory {path} is on a read-only file system",
            "mount a writable volume there, or choose another --state-dir",
        )
    return OutputError(
        f"state directory {path}: {exc.strerror or exc}", "choose another --state-dir"
    )
