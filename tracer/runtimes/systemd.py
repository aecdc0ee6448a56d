"""systemd services: restart count, main pid and cgroup of a unit from ``systemctl show``.

This module owns the systemd client: ``SystemdRuntime`` runs
``systemctl show -p Id,LoadState,ActiveState,SubState,MainPID,ControlGroup,NRestarts,Restart,Result
-- UNIT`` with a timeout, ``tracer.parse.systemd`` reads its ``Key=value`` lines and
``info_from_systemctl_show`` (pure) maps them onto ``ContainerInfo`` (id and name: the unit).

systemd counts restarts in ``NRestarts`` (since v235; it counts automatic restarts by
``Restart=``, not manual ``systemctl restart``) and says why a unit's main process last failed
in ``Result`` ("oom-kill" when the kernel OOM killer hit a process of the unit, v243+): that is
the supervisor's claim recorded beside our own verdict, like podman's ``OOMKilled``.

``ControlGroup`` is a path in systemd's own hierarchy (the unified one on v2 hosts, the
``name=systemd`` one on v1/hybrid); systemd mirrors its unit paths into the v1 memory hierarchy
when it manages memory there, so on both it is the memory-cgroup path too. It is empty while a
unit does not run (stopped, failed, or waiting to be restarted); where the unit's cgroup will be
is known from its ``Slice`` all the same (``unit_cgroup_path``): ``--unit`` follows a unit
from there across its restarts.

"Available" means systemd is PID 1: the check ``sd_booted(3)`` does (``/run/systemd/system``
exists). In containers and VMs without systemd, ``systemctl`` is installed but cannot talk to
a manager, and every call would fail after its timeout.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from tracer.parse.systemd import parse_systemctl_show
from tracer.runtimes.base import ContainerInfo, LookupFailed, Runtime, first_line, run_command

__all__ = ["SHOW_PROPERTIES", "SystemdRuntime", "info_from_systemctl_show", "unit_cgroup_path"]

SHOW_PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "MainPID",
    "ControlGroup",
    "NRestarts",
    "Restart",
    "Result",
    "Slice",
    # how the main process last ended (post-mortem): CLD_* code, status, pid, times
    "ExecMainCode",
    "ExecMainStatus",
    "ExecMainPID",
    "ExecMainStartTimestampMonotonic",
    "ExecMainExitTimestampMonotonic",
)

# siginfo si_code values systemd reports in ExecMainCode
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3

# Unit types that can have a main process and a restart count. A bare name means a service,
# as it does for systemctl itself.
_UNIT_SUFFIXES = (".service", ".scope", ".socket", ".mount", ".swap", ".timer", ".path", ".slice")


def unit_cgroup_path(unit: str, slice_name: str) -> str | None:
    """The cgroup systemd gives ``unit`` in ``slice_name``: every dash-separated prefix of a
    slice is its parent slice (``a-b.slice`` is ``/a.slice/a-b.slice``; ``-.slice`` is the
    root). None without a slice (a unit that has no cgroup, or systemd before v229)."""
    if not slice_name.endswith(".slice") or "/" in slice_name or "/" in unit:
        return None
    stem = slice_name[: -len(".slice")]
    parts = [] if stem == "-" else stem.split("-")
    if not all(parts):
        return None  # "a--b.slice", "-a.slice": systemd refuses these names
    path = "".join("/" + "-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))
    return f"{path}/{unit}"


def info_from_systemctl_show(unit: str, props: dict[str, str]) -> ContainerInfo | None:
    """Properties of one unit → ``ContainerInfo``; None for a unit systemd does not know.

    ``systemctl show`` succeeds for any name (``LoadState=not-found``, zeros everywhere), so the
    load state, not the exit status, says whether the unit exists.
    """
    load = props.get("LoadState", "")
    if load in ("not-found", "") and not props.get("ControlGroup"):
        return None
    unit_id = props.get("Id") or unit
    result = props.get("Result", "")
    return ContainerInfo(
        runtime="systemd",
        id=unit_id,
        name=unit_id,
        cgroup_path=props.get("ControlGroup") or None,
        pid=_int(props.get("MainPID")) or 0,
        # NRestarts is absent before systemd v235: then there is no count, not zero.
        restart_count=_int(props.get("NRestarts")),
        restart_policy=props.get("Restart") or "no",
        healthcheck=None,
        image="",
        state=props.get("ActiveState", ""),
        oom_killed=(result == "oom-kill") if result else None,
        pod=None,
        namespace=None,
        cgroup_when_started=props.get("ControlGroup")
        or unit_cgroup_path(unit_id, props.get("Slice", "")),
        **_exit_state(props),
    )


def _exit_state(props: dict[str, str]) -> dict[str, Any]:
    """ExecMain* → the exit code as runtimes say it (128 + n for signal n), the pid systemd
    kept, and the start/exit times (CLOCK_MONOTONIC ns; 0 means "never")."""
    code, status = _int(props.get("ExecMainCode")), _int(props.get("ExecMainStatus"))
    exited = _int(props.get("ExecMainExitTimestampMonotonic")) or 0
    started = _int(props.get("ExecMainStartTimestampMonotonic")) or 0
    exit_code = None
    if exited and status is not None:
        if code == _CLD_EXITED:
            exit_code = status
        elif code in (_CLD_KILLED, _CLD_DUMPED):
            exit_code = 128 + status
    return {
        "exit_code": exit_code,
        "exit_pid": (_int(props.get("ExecMainPID")) or 0) if exited else 0,
        "started_ns": started * 1000 if started else None,
        "finished_ns": exited * 1000 if exited and exit_code is not None else None,
        "times_clock": "monotonic",
    }


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


class SystemdRuntime(Runtime):
    """systemd units through ``systemctl show``. ``run_dir`` is injectable for tests."""

    name = "systemd"

    def __init__(
        self,
        systemctl: str = "systemctl",
        *,
        timeout_s: float = 3.0,
        run_dir: str = "/run/systemd/system",
    ) -> None:
        super().__init__()
        self.systemctl = systemctl
        self.timeout_s = timeout_s
        self.run_dir = run_dir

    def available(self) -> bool:
        return os.path.isdir(self.run_dir) and shutil.which(self.systemctl) is not None

    def find(self, name_or_id: str) -> ContainerInfo | None:
        unit = name_or_id.strip()
        if not unit:
            self._fail("systemd: empty unit name")
            return None
        if not unit.endswith(_UNIT_SUFFIXES):
            unit += ".service"
        argv = [self.systemctl, "show", "-p", ",".join(SHOW_PROPERTIES), "--", unit]
        try:
            proc = run_command(argv, timeout_s=self.timeout_s)
        except LookupFailed as exc:
            self._fail(f"systemd: {exc}")
            return None
        if proc.returncode != 0:
            # e.g. "System has not been booted with systemd as init system (PID 1)."
            self._fail(
                f"systemd: `systemctl show {unit}` exited {proc.returncode}: "
                f"{first_line(proc.stderr)}"
            )
            return None
        info = info_from_systemctl_show(unit, parse_systemctl_show(proc.stdout))
        if info is None:
            self._fail(f"systemd: no unit {unit!r}", quiet=True)
            return None
        self._ok()
        return info
