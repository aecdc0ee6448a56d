"""Who sent a fatal signal: a supervisor stopping its service, a user-space OOM killer, the
kubelet, or someone else. Pure: decided from what the kernel saw of the sender.

A process chooses its own name (``comm``, 15 characters, prctl), so the name is the weakest
witness. Stronger ones, when the recording has them: the sender's **executable** (from its exec
event, or read from /proc when its signal was recorded: ``Signal.sender_exe``), its **cgroup**
(``systemd-oomd.service``, ``earlyoom.service``) and its **relation to the victim** (its parent
or an ancestor in the recorded process tree: whoever started a process and kills it is its
supervisor, whatever it is called). A name that the executable contradicts is not believed.
"""

from __future__ import annotations

import functools
import posixpath
from dataclasses import dataclass

from tracer.events import Signal

# User-space OOM killers act on memory pressure (PSI or free memory) before the kernel does.
OOM_DAEMONS = ("systemd-oomd", "earlyoom", "oomd", "nohang", "low-memory-monitor", "lmkd")
# Runtimes and supervisors stop (SIGTERM, then SIGKILL after a grace period) and restart.
SUPERVISORS = (
    "systemd",
    "init",
    "conmon",
    "containerd-shim",
    "containerd-shim-runc-v2",
    "runc",
    "crun",
    "dockerd",
    "containerd",
    "docker",
    "podman",
    "supervisord",
    "s6-supervise",
    "runsv",
    "docker-init",
    "tini",
    "dumb-init",
    "crio",
    "conmon-rs",
)
KUBELET = ("kubelet",)

ROLE_OOM_DAEMON = "oom_daemon"
ROLE_SUPERVISOR = "supervisor"
ROLE_KUBELET = "kubelet"
ROLE_SELF = "self"
ROLE_KERNEL = "kernel"
ROLE_OTHER = "other"
ROLES = (ROLE_OOM_DAEMON, ROLE_SUPERVISOR, ROLE_KUBELET, ROLE_SELF, ROLE_KERNEL, ROLE_OTHER)

# how a sender was recognised, strongest first
BY_EXECUTABLE = "executable"
BY_CGROUP = "cgroup"
BY_TREE = "process tree"
BY_PID = "pid"
BY_NAME = "name"


@dataclass(frozen=True, slots=True)
class Sender:
    role: str
    description: str  # e.g. "systemd-oomd (a user-space OOM killer)"
    identified_by: str = BY_NAME  # BY_*: what told us the role
    doubt: str = ""  # when the name claims a role the executable or cgroup contradicts


def _matches(comm: str, names: tuple[str, ...]) -> bool:
    # comm is truncated to 15 characters by the kernel: compare on that length, whole names
    # only (a prefix would make initdb an init, runcached a runc, dockerize a docker)
    return comm in _truncated(names)


@functools.lru_cache(maxsize=16)
def _truncated(names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(n[:15] for n in names)


# An interpreter's executable says nothing about the script it runs (nohang is Python, so its
# /proc/PID/exe is python3): then the name and the cgroup are all there is.
_INTERPRETERS = ("python", "perl", "ruby", "node", "sh", "bash", "dash", "busybox")


def _program(exe: str) -> str:
    """The program an executable path runs: its file name (``/usr/lib/systemd/systemd-oomd``
    -> ``systemd-oomd``); "" for an interpreter or when unknown."""
    name = posixpath.basename(exe) if exe else ""
    if name.rstrip("0123456789.") in _INTERPRETERS:
        return ""
    return name


def _service(cgroup: str) -> str:
    """The systemd service (or scope) a cgroup path belongs to, without its suffix
    (``/system.slice/earlyoom.service`` -> ``earlyoom``); "" when none."""
    for part in reversed(cgroup.split("/")):
        for suffix in (".service", ".scope"):
            if part.endswith(suffix):
                stem = part[: -len(suffix)]
                return stem.split("@", 1)[0]
    return ""


def _identify(comm: str, exe: str, cgroup: str, names: tuple[str, ...]) -> str | None:
    """How the sender is one of ``names``: by its executable, its service's cgroup, or only its
    name (None: it is not, or its name says so and its executable says otherwise)."""
    program, service = _program(exe), _service(cgroup)
    if program and program in names:
        return BY_EXECUTABLE
    if service and service in names:
        return BY_CGROUP
    if _matches(comm, names) and not program:
        return BY_NAME
    return None


def classify(
    comm: str,
    pid: int,
    target_pid: int,
    kernel: bool = False,
    supervisor_pids: frozenset[int] = frozenset(),
    *,
    exe: str = "",
    cgroup: str = "",
    ancestor: bool = False,
) -> Sender:
    """The sender's role. ``exe``: its executable when known; ``cgroup``: its cgroup path when
    known; ``ancestor``: it is the victim's parent or an ancestor in the recorded tree."""
    if kernel:
        return Sender(ROLE_KERNEL, "the kernel")
    if pid == target_pid:
        return Sender(ROLE_SELF, "the process itself")
    program = _program(exe)
    name = program or comm
    how = _identify(comm, exe, cgroup, OOM_DAEMONS)
    if how is not None:
        return Sender(ROLE_OOM_DAEMON, f"{name} (pid {pid}, a user-space OOM killer)", how)
    how = _identify(comm, exe, cgroup, KUBELET)
    if how is not None:
        return Sender(ROLE_KUBELET, f"the kubelet (pid {pid})", how)
    if ancestor:
        return Sender(ROLE_SUPERVISOR, f"{name} (pid {pid}, the process that started it)", BY_TREE)
    if pid in supervisor_pids:
        return Sender(ROLE_SUPERVISOR, f"{name} (pid {pid}, the --supervisor)", BY_PID)
    if pid == 1:
        return Sender(ROLE_SUPERVISOR, f"{name} (pid 1, the init system)", BY_PID)
    how = _identify(comm, exe, cgroup, SUPERVISORS)
    if how is not None:
        return Sender(ROLE_SUPERVISOR, f"{name} (pid {pid}, a supervisor)", how)
    doubt = ""
    if program and _matches(comm, OOM_DAEMONS + KUBELET + SUPERVISORS):
        doubt = f"it is named {comm}, but runs {exe}: not taken for what its name claims"
    return Sender(ROLE_OTHER, f"{name} (pid {pid})", BY_EXECUTABLE if program else BY_NAME, doubt)


# signal_generate results that left the signal pending (TRACE_SIGNAL_DELIVERED, and LOSE_INFO:
# queued without its siginfo); IGNORED, ALREADY_PENDING and OVERFLOW_FAIL did not.
_DELIVERED = (0, 4)


def fatal_signal(signals: list[Signal]) -> Signal | None:
    """Of the signals of the number a process died of, the one that killed it: the first that
    the kernel delivered. Once a fatal signal is delivered the group is exiting and every later
    one comes back ignored (prepare_signal()), e.g. conmon's redundant SIGKILL after a user's;
    blaming the last one would name the latecomer. Without a delivered one (events missed),
    the last one seen."""
    for s in signals:
        if s.result in _DELIVERED:
            return s
    return signals[-1] if signals else None


# Supervisors that run programs as direct children and restart them (not container runtimes,
# whose children are in their own cgroups and units).
PROCESS_SUPERVISORS = ("supervisord", "s6-supervise", "runsv", "circusd", "pm2")


# pm2's daemon renames itself (process.title, which libuv makes its comm too):
# "PM2 v5.3.1: God Daemon (/root/.pm2)", truncated to "PM2 v5.3.1: God". The BPF filter
# matches the same prefix (whyrestart.bpf.c is_supervisor).
PM2_TITLE = "PM2 v"


def process_supervisor(comm: str) -> str | None:
    """The supervisor a process of this comm is (its usual name), or None."""
    if comm in SUPERVISOR_COMMS:
        return comm
    return "pm2" if comm.startswith(PM2_TITLE) else None


# (the process table asks at every exec: one set lookup)
SUPERVISOR_COMMS = _truncated(PROCESS_SUPERVISORS)


# Container runtimes' own setup processes inside a container's cgroup ("runc init" renames
# itself runc:[0:PARENT], runc:[1:CHILD], runc:[2:INIT] before it execs the entrypoint).
PLUMBING = ("runc:[", "runc", "crun", "conmon", "youki", "runsc")

# A program executing /proc/self/exe runs itself again: it starts nothing new. runc does it in
# the process that becomes the container (its init, then a copy of itself: CVE-2019-5736,
# comm "exe", then "runc"); on a loaded host that exec lands in the container's new cgroup
# before the entrypoint's, and was taken for the container's first program (its main process):
# 1 restart of 301 went unlinked.
SELF_EXE = "/proc/self/exe"


class _Plumbing(dict[str, bool]):
    """comm -> whether it names a runtime's setup process, worked out once per name: the replay
    loop asks at every exec and exit (``IS_PLUMBING[comm]``: a dict lookup, a third of a
    ``startswith`` of six prefixes). Cleared when it holds 4096 names."""

    def __missing__(self, comm: str) -> bool:
        if len(self) >= 4096:
            self.clear()
        answer = self[comm] = comm.startswith(PLUMBING)
        return answer


IS_PLUMBING: dict[str, bool] = _Plumbing()
