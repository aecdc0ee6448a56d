"""The NVIDIA driver's kernel-log lines about GPU errors, and what each Xid means. Pure.

The driver (``nvidia.ko``, prefix ``NVRM:``) reports every Xid error in the kernel log, with the
process it blames on drivers from the R470 era on::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00): 31, pid=2279, name=python, Ch 00000008, intr 00000000. MMU Fault...
    NVRM: Xid (PCI:0000:00:1e): 43, pid=3415, Ch 00000010
    NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ...
    NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.            (older drivers)
    NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.

Only records of the kernel facility count: anything written to ``/dev/kmsg`` from user space
carries another facility (the kernel enforces LOG_USER there), so a process cannot forge a
device reset into a verdict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tracer.events import Event, GpuLost, GpuXid
from tracer.parse.kmsg import KmsgRecord

__all__ = [
    "APP_FAULT_XIDS",
    "DEVICE_LOST_XIDS",
    "XID_MEANINGS",
    "XidLine",
    "event_from_kmsg",
    "parse_lost_line",
    "parse_xid_line",
    "xid_meaning",
]

KERNEL_FACILITY = 0

# What an Xid says, from NVIDIA's "Xid Errors" catalogue (the ones seen on compute hosts).
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault (an illegal address in the application)",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing (an application fault)",
    45: "preemptive cleanup after earlier errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    68: "video decoder exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

# Faults of the application's own kernels: never an out-of-memory, whatever else happened.
APP_FAULT_XIDS = frozenset({31, 43})
# The device is gone: every process on it loses its context.
DEVICE_LOST_XIDS = frozenset({79})


def xid_meaning(xid: int) -> str:
    return XID_MEANINGS.get(xid, "see NVIDIA's Xid catalogue")


@dataclass(frozen=True, slots=True)
class XidLine:
    xid: int
    device: str  # PCI bus id as printed, "" if none
    pid: int | None
    proc_name: str
    message: str


# The device in parentheses is "PCI:dddd:bb:dd" on current drivers; tolerate it without "PCI:".
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<dev>[^)]*)\): (?P<xid>\d{1,6})\s*(?:,\s*(?P<rest>.*))?",
    re.ASCII | re.DOTALL,
)
# pid=1234 or pid='<unknown>'; name=<comm> runs to the next ", " (a comm rarely has one).
_PID_RE = re.compile(r"pid=(?P<pid>[^,]*)(?:,\s*|$)", re.ASCII | re.DOTALL)
_NAME_RE = re.compile(r"name=(?P<name>.*?)(?:,\s*|$)", re.ASCII | re.DOTALL)
_LOST_RE = re.compile(
    r"NVRM: GPU (?:at )?(?:PCI:)?(?P<dev>[0-9A-Fa-f:.]+): GPU has fallen off the bus", re.ASCII
)


def parse_xid_line(message: str) -> XidLine | None:
    """The Xid report in one kernel-log message, or None when it is not one."""
    m = _XID_RE.search(message)
    if m is None:
        return None
    rest = (m.group("rest") or "").strip()
    pid: int | None = None
    name = ""
    pm = _PID_RE.match(rest)
    if pm is not None:
        raw = pm.group("pid").strip("'")
        pid = int(raw) if raw.isdigit() and len(raw) <= 10 else None
        rest = rest[pm.end() :]
        nm = _NAME_RE.match(rest)
        if nm is not None:
            name = nm.group("name").strip()
            name = "" if name == "<unknown>" else name
            rest = rest[nm.end() :]
    return XidLine(
        xid=int(m.group("xid")),
        device=m.group("dev").strip(),
        pid=pid,
        proc_name=name,
        message=rest.strip(),
    )


def parse_lost_line(message: str) -> str | None:
    """The PCI bus id of a ``GPU has fallen off the bus`` line, or None."""
    m = _LOST_RE.search(message)
    return m.group("dev") if m is not None else None


def event_from_kmsg(rec: KmsgRecord, ts: int) -> Event | None:
    """A ``GpuXid`` or ``GpuLost`` event for a kernel-log record, stamped ``ts`` (CLOCK_BOOTTIME
    ns, converted by the caller); None for every other record. Cheap on the common path: one
    substring test before any regular expression."""
    if rec.facility != KERNEL_FACILITY or "NVRM:" not in rec.message:
        return None
    xid = parse_xid_line(rec.message)
    if xid is not None:
        return GpuXid(
            ts=ts,
            xid=xid.xid,
            device=xid.device,
            device_index=None,
            pid=xid.pid,
            proc_name=xid.proc_name,
            message=xid.message,
            source="kmsg",
        )
    dev = parse_lost_line(rec.message)
    if dev is not None:
        return GpuLost(ts=ts, device=dev, device_index=None, reason="fallen_off_bus", source="kmsg")
    return None
