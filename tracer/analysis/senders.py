"""Who sent a fatal signal: a supervisor stopping its service, a user-space OOM killer, the
kubelet, or someone else. Pure: decided from the sender's name and cgroup as recorded.

The names are the process names (``comm``, at most 15 characters) these programs run as.
"""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
class Sender:
    role: str
    description: str  # e.g. "systemd-oomd (a user-space OOM killer)"


def _matches(comm: str, names: tuple[str, ...]) -> bool:
    # comm is truncated to 15 characters by the kernel: compare on that length, whole names
    # only (a prefix would make initdb an init, runcached a runc, dockerize a docker)
    return any(comm == n[:15] for n in names)


def classify(
    comm: str,
    pid: int,
    target_pid: int,
    kernel: bool = False,
    supervisor_pids: frozenset[int] = frozenset(),
) -> Sender:
    if kernel:
        return Sender(ROLE_KERNEL, "the kernel")
    if pid == target_pid:
        return Sender(ROLE_SELF, "the process itself")
    if _matches(comm, OOM_DAEMONS):
        return Sender(ROLE_OOM_DAEMON, f"{comm} (a user-space OOM killer)")
    if _matches(comm, KUBELET):
        return Sender(ROLE_KUBELET, "the kubelet")
    if pid in supervisor_pids or pid == 1 or _matches(comm, SUPERVISORS):
        return Sender(ROLE_SUPERVISOR, f"{comm} (pid {pid}, a supervisor)")
    return Sender(ROLE_OTHER, f"{comm} (pid {pid})")


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


def is_process_supervisor(comm: str) -> bool:
    return _matches(comm, PROCESS_SUPERVISORS)


# Container runtimes' own setup processes inside a container's cgroup ("runc init" renames
# itself runc:[0:PARENT], runc:[1:CHILD], runc:[2:INIT] before it execs the entrypoint).
PLUMBING = ("runc:[", "runc", "crun", "conmon", "youki", "runsc")


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
