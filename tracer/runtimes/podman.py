"""Podman, asked through its CLI: ``podman [global options] inspect --type container X``.

This module owns the podman client: ``PodmanRuntime`` runs the CLI (with a timeout on every
call; global options and extra environment injectable, so tests point it at an isolated store
with ``--root/--runroot/--tmpdir`` and ``CONTAINERS_CONF``) and ``info_from_podman_inspect``
turns one element of the inspect JSON into a ``ContainerInfo`` (pure; tested on real podman
4.3 output in ``tests/data/runtimes``).

Why the CLI and not podman's REST socket: the CLI is always there when podman is (the socket
only runs when a ``podman.socket`` unit or ``podman system service`` is started), it reads the
same database, and one inspect costs ~0.1 s, plenty for lookups and 1 s restart-count polls.
Where podman's socket is running, ``DockerRuntime(socket_path=...)`` can use its
Docker-compatible API as well.

Fields relied on (podman 4.3 key names): ``Id``, ``Name``, ``State.Status``, ``State.Pid``,
``State.OOMKilled``, ``State.CgroupPath`` (present only while running), ``RestartCount``,
``HostConfig.RestartPolicy.{Name,MaximumRetryCount}``, ``Config.Healthcheck.Test``,
``ImageName`` (falls back to ``Image``, the id), ``Pod`` (a pod id, "" outside pods).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from tracer.runtimes.base import (
    ContainerInfo,
    LookupFailed,
    Runtime,
    exit_state,
    first_line,
    get_bool,
    get_dict,
    get_int,
    get_str,
    healthcheck_test,
    inspect_sections,
    restart_policy_text,
    run_command,
)

__all__ = ["PodmanRuntime", "info_from_podman_inspect"]

log = logging.getLogger(__name__)


def info_from_podman_inspect(obj: Mapping[str, Any]) -> ContainerInfo | None:
    """One element of ``podman inspect --type container`` JSON → ``ContainerInfo``.

    None when the element has no ``Id`` (not a container). ``cgroup_path`` is podman's
    ``State.CgroupPath``, which podman only reports while the container runs; the runtime
    prefers the main pid's ``/proc/PID/cgroup`` when it can read it (see ``PodmanRuntime``).
    """
    sections = inspect_sections(obj)
    if sections is None:
        return None
    cid, state, config, host = sections
    pid = get_int(state, "Pid") or 0
    pod = get_str(obj, "Pod") or None
    return ContainerInfo(
        runtime="podman",
        id=cid,
        name=get_str(obj, "Name"),
        cgroup_path=get_str(state, "CgroupPath") or None,
        pid=pid if pid > 0 else 0,
        restart_count=get_int(obj, "RestartCount"),
        restart_policy=restart_policy_text(get_dict(host, "RestartPolicy")),
        healthcheck=healthcheck_test(config),
        image=get_str(obj, "ImageName") or get_str(config, "Image") or get_str(obj, "Image"),
        state=get_str(state, "Status"),
        oom_killed=get_bool(state, "OOMKilled"),
        pod=pod,
        namespace=None,
        **exit_state(obj),
    )


class PodmanRuntime(Runtime):
    """Podman through its CLI.

    ``global_args`` go before the subcommand (``--root``, ``--runroot``, ``--tmpdir``,
    ``--url``...); ``env`` is added to the environment of every call (``CONTAINERS_CONF``).
    """

    name = "podman"

    def __init__(
        self,
        podman: str = "podman",
        *,
        global_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
        proc_root: str = "/proc",
    ) -> None:
        super().__init__()
        self.podman = podman
        self.global_args = tuple(global_args)
        self.env = dict(env) if env else None
        self.timeout_s = timeout_s
        self.proc_root = proc_root

    def available(self) -> bool:
        # Only the binary: asking podman itself (`podman info`) costs ~0.3 s and may create
        # its default store as a side effect. A broken podman shows up as lookup errors.
        return shutil.which(self.podman) is not None

    def find(self, name_or_id: str) -> ContainerInfo | None:
        key = name_or_id.strip()
        if not key:
            self._fail("podman: empty container name")
            return None
        try:
            obj = self._inspect(key)
        except LookupFailed as exc:
            self._fail(f"podman: {exc}")
            return None
        if obj is None:
            self._fail(f"podman: no container {key!r}", quiet=True)
            return None
        info = info_from_podman_inspect(obj)
        if info is None:
            self._fail(f"podman: inspect of {key!r} has no container Id")
            return None
        return self._found(info, self.proc_root)

    def _inspect(self, key: str) -> Mapping[str, Any] | None:
        # "--" so that a name starting with "-" is not taken for an option.
        argv = [self.podman, *self.global_args, "inspect", "--type", "container", "--", key]
        proc = run_command(argv, timeout_s=self.timeout_s, env=self.env)
        if proc.returncode != 0:
            err = first_line(proc.stderr)
            # podman 4.3: exit 125, stdout "[]", "Error: inspecting object: no such container X"
            if "no such container" in err:
                return None
            raise LookupFailed(f"`podman inspect {key}` exited {proc.returncode}: {err}")
        try:
            doc = json.loads(proc.stdout)
        except ValueError as exc:
            raise LookupFailed(f"`podman inspect {key}` printed no JSON: {exc}") from exc
        if not isinstance(doc, list):
            raise LookupFailed(f"`podman inspect {key}` printed {type(doc).__name__}, not a list")
        if not doc:
            return None
        first = doc[0]
        if not isinstance(first, Mapping):
            raise LookupFailed(f"`podman inspect {key}` printed a list of non-objects")
        return first
