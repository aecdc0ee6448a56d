"""``whyrestart doctor``: can this machine record, and with which rung of each hook?

Every check is run (not just up to the first failure) and reported with its fix. The hook rungs
come from a real load and attach of the BPF object with nothing watched, so they are what
``record`` will get, not a guess.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from tracer.bpf import hooks, layout, libbpf
from tracer.errors import WhyrestartError
from tracer.sources import system
from tracer.sources.cgroupfs import CgroupLayout

HOOK_FIXES = {
    "oom_context": "optional: OOM kills are still seen by mark_victim, and the limiting cgroup "
    "is found by walking the victim's cgroups; a kernel with kprobes or BPF trampolines names "
    "it directly",
    "memory_high": "optional: on cgroup v2, memory.high throttling is then read from "
    "memory.events and memory.pressure; cgroup v1 has no memory.high",
}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def run_checks() -> tuple[list[Check], dict[str, Any]]:
    """The checks in the order doctor prints them; the hooks are only tried when what they
    need passed (on a kernel too old the load fails with a libbpf error that names neither the
    kernel nor the fix: the kernel line already says both)."""
    release = system.kernel_release()
    facts: dict[str, Any] = {"kernel": release}
    root = os.geteuid() == 0
    checks = _host_checks(release, root)
    cg = CgroupLayout.from_system()
    facts["cgroup"] = dataclasses.asdict(cg)
    checks.append(_memory_cgroup_check(cg))
    ready = {c.name: c.ok for c in checks}
    if root and all(ready[n] for n in ("kernel", "btf", "libbpf", "bpf_object")):
        checks.extend(_hook_checks(cg, facts))
        checks.extend(_gpu_checks(cg.memory_version == 1, facts))
    else:
        checks.append(
            Check(
                "hooks",
                False,
                "not probed (needs root, a new enough kernel, BTF, libbpf and the built object)",
                "fix the checks above",
                required=True,
            )
        )
    return checks, facts


def _host_checks(release: str, root: bool) -> list[Check]:
    """What recording needs of the host before any BPF: root, the kernel, the pid namespace,
    BTF, libbpf, the built object, tracefs, the kernel log."""
    checks: list[Check] = []
    checks.append(
        Check(
            "root",
            root,
            "running as root" if root else "not root",
            "run with sudo" if not root else "",
        )
    )
    too_old = system.kernel_too_old(release)
    checks.append(
        Check(
            "kernel",
            too_old is None,
            too_old or f"kernel {release}",
            system.KERNEL_FIX if too_old else "",
        )
    )
    pid_ns = system.pid_namespace_problem()
    checks.append(
        Check(
            "pid_namespace",
            pid_ns is None,
            "the host's pid namespace" if pid_ns is None else pid_ns,
            "" if pid_ns is None else system.PID_NS_FIX,
        )
    )
    btf = os.path.exists(system.BTF_PATH)
    checks.append(
        Check(
            "btf",
            btf,
            system.BTF_PATH + (" present" if btf else " missing"),
            "" if btf else "use a kernel with CONFIG_DEBUG_INFO_BTF=y",
        )
    )
    loaded, what = libbpf.status()
    checks.append(
        Check(
            "libbpf",
            loaded,
            f"libbpf {what}" if loaded else what,
            ""
            if loaded
            else "apt-get install libbpf1 (>= 1.0), or install the whyrestart wheel "
            "(it bundles libbpf)",
        )
    )
    obj = hooks.object_path()
    built = os.path.exists(obj)
    checks.append(
        Check(
            "bpf_object",
            built,
            obj + (" built" if built else " missing"),
            "" if built else "run scripts/setup (or make -C bpf)",
        )
    )
    tracefs = system.ensure_tracefs() if root else system.tracefs_events_dir()
    mounted = system.tracefs_mounts()
    if tracefs:
        detail, fix = f"tracepoints under {tracefs}", ""
    elif mounted:  # e.g. mode 0700 and not root: it is there, this user cannot read it
        detail = f"tracefs is mounted at {mounted[0]} but this user cannot read it"
        fix = "run as root"
    else:
        detail, fix = "tracefs not mounted", "mount -t tracefs tracefs /sys/kernel/tracing"
    checks.append(Check("tracefs", tracefs is not None, detail, fix, required=False))
    kmsg_ok, why = system.kmsg_readable()
    checks.append(
        Check(
            "kmsg",
            kmsg_ok,
            "/dev/kmsg readable" if kmsg_ok else f"/dev/kmsg not readable ({why})",
            "" if kmsg_ok else "run as root (reading the kernel log needs CAP_SYSLOG)",
            required=False,
        )
    )
    return checks


def _memory_cgroup_check(cg: CgroupLayout) -> Check:
    return Check(
        "memory_cgroup",
        cg.memory_root is not None,
        f"cgroup {cg.mode}; memory controller on v{cg.memory_version} at {cg.memory_root}"
        if cg.memory_root
        else f"cgroup {cg.mode}; no memory controller mounted",
        ""
        if cg.memory_root
        else "mount the memory controller (cgroup v2: "
        "echo +memory > /sys/fs/cgroup/cgroup.subtree_control)",
        required=False,
    )


def _hook_checks(cg: CgroupLayout, facts: dict[str, Any]) -> list[Check]:
    """Load the object and attach every hook: the rung each one got, or why none did."""
    checks: list[Check] = []
    try:
        cfg = layout.WrConfig(
            filter_all=0,
            memcg_v1=int(cg.memory_version == 1),
            self_tgid=os.getpid(),
            watch_cgroups=0,
        )
        kernel = hooks.KernelHooks(cfg)
        try:
            attached = kernel.attach()
        finally:
            kernel.close()
        facts["hooks"] = attached.rungs
        facts["hook_failures"] = attached.failures
        for hook, rung in attached.rungs.items():
            fails = "; ".join(attached.failures.get(hook, []))
            optional = hook not in hooks.REQUIRED
            checks.append(
                Check(
                    f"hook:{hook}",
                    rung is not None,
                    (f"{rung}" + (f" (better rungs failed: {fails})" if fails else ""))
                    if rung
                    else f"no rung attached: {fails}",
                    "" if rung else HOOK_FIXES.get(hook, "see the reasons above"),
                    required=not optional,
                )
            )
    except WhyrestartError as exc:
        checks.append(Check("hooks", False, str(exc), exc.fix or ""))
    return checks


def can_record(checks: list[Check]) -> bool:
    return all(c.ok for c in checks if c.required)


def _hold_cost(host_libcuda: object) -> str:
    """What the first-call hold costs here: said, because it stops other processes."""
    cost = (
        "it stops a process that maps an unprobed libcuda.so* to run it (a loader), once per "
        "file, for about 30 ms (writers, copiers, ldconfig and O_PATH openers never)"
    )
    if not isinstance(host_libcuda, dict) or not host_libcuda:
        return f"no libcuda on this host: {cost}, and only if one appears"
    return f"the host's libcuda is probed at start, so its loaders are not held; {cost}"


def _gpu_checks(memcg_v1: bool, facts: dict[str, Any]) -> list[Check]:
    """The GPU side: uprobes on libcuda (gpu.bpf.o) and NVML. Both optional."""
    from tracer.gpu.side import GpuSide

    try:
        side = GpuSide(filter_all=False, memcg_v1=memcg_v1, attach_host=True)
    except Exception as exc:  # optional evidence: report it, never fail doctor
        return [Check("gpu", False, f"GPU side failed to start: {exc}", required=False)]
    try:
        info = side.describe()
    finally:
        side.close()
    facts["gpu"] = info
    uprobes = info.get("uprobes")
    nvml = str(info.get("nvml", "absent"))
    return [
        Check(
            "hook:gpu_alloc",
            uprobes == "ready",
            f"libcuda uprobes {uprobes}; host libcuda.so.1: {info.get('host_libcuda')}",
            "" if uprobes == "ready" else "optional: needs uprobes and gpu.bpf.o",
            required=False,
        ),
        Check(
            "gpu:hold",
            info.get("hold") == "ready",
            f"first-call hold of processes loading an unprobed libcuda: {info.get('hold')}; "
            f"holds shared with other recorders: {info.get('hold_peers')}; "
            f"its guard: {info.get('hold_guard')}; "
            f"{_hold_cost(info.get('host_libcuda'))}",
            ""
            if info.get("hold") == "ready"
            else "optional: without it a program that loads "
            "libcuda from elsewhere and fails at once can be missed",
            required=False,
        ),
        Check(
            "nvml",
            "absent" not in nvml,
            f"NVML: {nvml}",
            "optional: the NVIDIA driver's libnvidia-ml.so.1 gives GPU memory samples",
            required=False,
        ),
    ]
