"""``ContainerInfo`` values for tests, as supervisors describe what they run, so that each test
states only what differs from the usual case."""

from __future__ import annotations

import dataclasses
from typing import Any

from tracer.runtimes.base import ContainerInfo


def podman_container(cid: str, name: str, **changes: Any) -> ContainerInfo:
    """A podman container that exited after restarting twice under ``--restart on-failure:2``
    (no cgroup: podman 4.3 drops it once the container stopped; OOMKilled false, as podman 4.3
    says even after a real OOM kill)."""
    usual = ContainerInfo(
        runtime="podman",
        id=cid,
        name=name,
        cgroup_path=None,
        pid=0,
        restart_count=2,
        restart_policy="on-failure:2",
        healthcheck=None,
        image="",
        state="exited",
        oom_killed=False,
    )
    return dataclasses.replace(usual, **changes)


def systemd_unit(name: str, **changes: Any) -> ContainerInfo:
    """A systemd service under ``Restart=on-failure`` whose main process ended and that is
    starting again (activating, no main pid), as ``systemctl show`` describes it: monotonic
    times, no OOM claim unless its Result says so."""
    usual = ContainerInfo(
        runtime="systemd",
        id=name,
        name=name,
        cgroup_path=f"/system.slice/{name}",
        pid=0,
        restart_count=0,
        restart_policy="on-failure",
        healthcheck=None,
        image="",
        state="activating",
        oom_killed=None,
        times_clock="monotonic",
    )
    return dataclasses.replace(usual, **changes)
