"""Units: what users restart (a container, a pod's container, a systemd unit, a recorded
command), named from cgroup paths. Pure string work, tested on real paths.

A unit's *main process* is the first process seen in it whose parent is outside it; when the
main process exits and a new one starts in the same unit, that is a restart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEX = r"[0-9a-f]{12,64}"
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # Kubernetes: .../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope (systemd
    # driver) or /kubepods/burstable/pod<uid>/<id> (cgroupfs driver)
    (
        "k8s",
        re.compile(
            rf"kubepods.*?pod([0-9a-f_-]{{36}})(?:\.slice)?/"
            rf"(?:cri-containerd-|crio-|docker-)?({_HEX})(?:\.scope)?(?:/|$)"
        ),
    ),
    # podman's conmon (and the cleanup it starts after the container ends) in a scope of its
    # own: not the container, or its cleanup would look like the container's next main process
    ("conmon", re.compile(rf"libpod-conmon-({_HEX})\.scope")),
    ("podman", re.compile(rf"libpod-({_HEX})\.scope")),
    ("podman", re.compile(rf"/libpod_parent/libpod-({_HEX})")),
    ("docker", re.compile(rf"docker-({_HEX})\.scope")),
    ("docker", re.compile(rf"/docker/({_HEX})(?:/|$)")),
    ("containerd", re.compile(rf"cri-containerd-({_HEX})\.scope")),
    ("crio", re.compile(rf"crio-({_HEX})\.scope")),
    ("systemd", re.compile(r"/([^/]+\.service)(?:/|$)")),
    ("systemd", re.compile(r"/([^/]+\.scope)$")),
)


# Units that are containers: their main process is the first program started in the cgroup.
CONTAINER_KINDS = frozenset(("podman", "docker", "containerd", "crio", "k8s"))


@dataclass(frozen=True, slots=True)
class UnitName:
    kind: str  # k8s, podman, docker, containerd, crio, systemd, conmon, cgroup, command
    key: str  # stable within one recording: container id, unit name, path
    label: str  # what to show

    def __str__(self) -> str:
        return self.label


# "not worked out yet" (compared by identity), where None is an answer: no unit
UNSET: UnitName = UnitName("", "", "")


def unit_of_cgroup(path: str | None) -> UnitName | None:
    """The unit a memory-cgroup path belongs to, or None for the root / unknown paths."""
    if not path or path == "/":
        return None
    for kind, pat in _PATTERNS:
        m = pat.search(path)
        if m is None:
            continue
        if kind == "k8s":
            pod, cid = m.group(1).replace("_", "-"), m.group(2)
            return UnitName(kind, cid, f"pod {pod[:8]} container {cid[:12]}")
        ident = m.group(1)
        if kind == "conmon":
            return UnitName(kind, f"conmon:{ident}", f"conmon of podman {ident[:12]}")
        if kind == "systemd":
            return UnitName(kind, ident, ident)
        return UnitName(kind, ident, f"{kind} {ident[:12]}")
    return UnitName("cgroup", path, path)


def from_info(kind: str, unit_id: str, name: str, pod: str = "") -> UnitName:
    """The unit a runtime named (UnitInfo): keyed by name, so a container recreated with a new
    id on restart (docker, Kubernetes) stays the same unit."""
    if pod:
        return UnitName(kind, f"{kind}:{pod}/{name}", f"pod {pod} container {name}")
    if name:
        return UnitName(kind, f"{kind}:{name}", f"{kind} {name}")
    return UnitName(kind, f"{kind}:{unit_id}", f"{kind} {unit_id[:12]}")


def supervised(supervisor: str, supervisor_pid: int, program: str) -> UnitName:
    """A program run by a process supervisor (supervisord, s6, runit): one unit per program."""
    short = program.rsplit("/", 1)[-1]
    return UnitName("supervised", f"{supervisor_pid}:{program}", f"{short} under {supervisor}")


_COMMAND = re.compile(r" \(pid \d+\)$")


def label_parts(label: str | None) -> dict[str, str]:
    """What a unit's label (``from_info``/``unit_of_cgroup``) says, as metric labels: ``unit``
    always; ``namespace``, ``pod``, ``container`` for a Kubernetes pod's container named by
    its runtime; ``container_name`` for a podman/Docker container named by its runtime."""
    if not label or _COMMAND.search(label):
        # no unit (a process of the host, named after its top process: "sh (pid 4242)"); as a
        # label it would make a series per process
        return {"unit": ""}
    out = {"unit": label}
    if label.startswith("pod ") and " container " in label:
        pod, container = label[4:].split(" container ", 1)
        if "/" in pod:
            out["namespace"], out["pod"] = pod.split("/", 1)
            out["container"] = container
    else:
        kind, _, name = label.partition(" ")
        if kind in CONTAINER_KINDS and name:
            out["container_name"] = name
    return out
