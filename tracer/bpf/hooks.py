"""Which program runs each hook: the fallback ladders, loading, and attaching best-first.

Every rung of a ladder is a twin program in bpf/whyrestart.bpf.c sharing one inline handler.
All twins that the kernel accepts are loaded; then, per hook, the rungs are attached best-first
and the first one that attaches wins. A program the kernel refuses at load time (fentry gets
EPERM on some kernels; tp_btf needs the kernel's tracepoint prototype to match) is switched off
with ``bpf_program__set_autoload`` and the object is loaded again without it. The chosen rung of
every hook is reported, written into the trace header, and shown by ``whyrestart doctor``.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass, field

from tracer.bpf import layout
from tracer.bpf.libbpf import BpfObject, Link, Map, lib
from tracer.errors import BpfError, KernelUnsupported

# hook -> [(rung, program)], best first. "oom_context" does not emit: it lets mark_victim read
# oom_control (the exact memcg) instead of walking ancestors; see the OOM block in the C file.
LADDERS: dict[str, list[tuple[str, str]]] = {
    "exit": [("tp_btf", "exit_btf"), ("tracepoint", "exit_tp")],
    "signal": [("tp_btf", "signal_btf"), ("tracepoint", "signal_tp")],
    "oom": [("tp_btf", "oom_btf"), ("tracepoint", "oom_tp")],
    "oom_context": [("fentry", "oom_fentry"), ("kprobe", "oom_kprobe")],
    "fork": [("tp_btf", "fork_btf"), ("raw_tp", "fork_raw")],
    "exec": [("tp_btf", "exec_btf"), ("raw_tp", "exec_raw")],
}
# Without these, there is nothing to attribute an exit to.
REQUIRED = ("exit",)

_FAILED_PROG = re.compile(r"prog '(\w+)': (?:.*fail|.*error|.*invalid|.*not)", re.IGNORECASE)

DEFAULT_OBJECT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "bpf",
    "whyrestart.bpf.o",
)


def object_path() -> str:
    return os.environ.get("WHYRESTART_BPF_OBJECT", DEFAULT_OBJECT)


@dataclass
class Attached:
    """What ended up running: the rung per hook (None: nothing attached) and why rungs failed."""

    rungs: dict[str, str | None] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)
    refused_at_load: dict[str, str] = field(default_factory=dict)


class Probe:
    """The loaded object with its hooks attached; the only owner of links and maps."""

    def __init__(
        self, config: layout.WrConfig, path: str | None = None, disabled: tuple[str, ...] = ()
    ) -> None:
        self.path = path or object_path()
        self.config = config
        self.attached = Attached()
        self._links: list[Link] = []
        self.obj = self._load(set(disabled))
        self.events: Map = self.obj.map("events")
        self.watched_pids: Map = self.obj.map("watched_pids")
        self.watched_cgroups: Map = self.obj.map("watched_cgroups")
        self.lost: Map = self.obj.map("lost")

    # -- loading ----------------------------------------------------------------------------

    def _open(self, disabled: set[str]) -> BpfObject:
        obj = BpfObject(self.path)
        rodata = obj.map(".rodata").initial_value()
        want = ctypes.sizeof(self.config)
        if len(rodata) < want:
            obj.close()
            raise BpfError(f"configuring {self.path}: .rodata is {len(rodata)} bytes", 22)
        ctypes.memmove(rodata, ctypes.byref(self.config), want)
        for prog in obj.programs():
            if prog.name in disabled:
                prog.set_autoload(False)
        return obj

    def _load(self, disabled: set[str]) -> BpfObject:
        every = {p for ladder in LADDERS.values() for _, p in ladder}
        while True:
            obj = self._open(disabled)
            try:
                obj.load()
                return obj
            except BpfError as exc:
                log = lib().take_log()
                obj.close()
                culprit = next(
                    (
                        m.group(1)
                        for line in log
                        if (m := _FAILED_PROG.search(line))
                        and m.group(1) in every
                        and m.group(1) not in disabled
                    ),
                    None,
                )
                if culprit is None:
                    tail = "\n    ".join(log[-12:])
                    raise BpfError(
                        exc.step, exc.errno, (exc.fix or "") + ("\n  libbpf said:\n    " + tail)
                    ) from exc
                reason = next((ln for ln in log if f"'{culprit}'" in ln), str(exc))
                self.attached.refused_at_load[culprit] = reason.removeprefix("libbpf: ")
                disabled.add(culprit)

    # -- attaching --------------------------------------------------------------------------

    def attach(self) -> Attached:
        for hook, ladder in LADDERS.items():
            self.attached.rungs[hook] = None
            for rung, name in ladder:
                if name in self.attached.refused_at_load:
                    self.attached.failures.setdefault(hook, []).append(
                        f"{rung}: refused at load ({self.attached.refused_at_load[name]})"
                    )
                    continue
                try:
                    self._links.append(self.obj.program(name).attach())
                except BpfError as exc:
                    self.attached.failures.setdefault(hook, []).append(f"{rung}: {exc.message}")
                    continue
                self.attached.rungs[hook] = rung
                break
        for hook in REQUIRED:
            if self.attached.rungs[hook] is None:
                self.close()
                raise KernelUnsupported(
                    f"no rung of the {hook} hook attached: "
                    + "; ".join(self.attached.failures.get(hook, [])),
                    "check `whyrestart doctor`: the kernel needs BTF and tracepoints",
                )
        return self.attached

    # -- maps -------------------------------------------------------------------------------

    def watch_pid(self, pid: int) -> None:
        self.watched_pids.update(ctypes.c_uint32(pid), ctypes.c_uint8(1))

    def watch_cgroup(self, cgroup_id: int) -> None:
        self.watched_cgroups.update(ctypes.c_uint64(cgroup_id), ctypes.c_uint8(1))

    def lost_count(self) -> int:
        return self.lost.percpu_sum_u64(0)

    def close(self) -> None:
        for link in self._links:
            link.destroy()
        self._links.clear()
        self.obj.close()
