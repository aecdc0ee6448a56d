"""The host's memory: ``/proc/meminfo`` and ``/proc/pressure/memory`` (PSI) → ``HostSample``
events: `HostSampler`."""

from __future__ import annotations

import errno
import os

from tracer.events import Event, HostSample
from tracer.parse.memory import Pressure, parse_meminfo, parse_pressure
from tracer.sources.samplers.files import PSI_MISSING, KeptFile, ProblemLog, strerror

_MEMINFO_KEYS = ("MemTotal", "MemFree", "MemAvailable", "Cached", "SwapFree")


class HostSampler:
    """``/proc/meminfo`` and ``/proc/pressure/memory`` → ``HostSample`` (``sample(now_ns)``).

    Without PSI the psi fields are None and one ``SampleError`` (source "psi") says why. An
    unreadable meminfo gives one ``SampleError`` (source "host") and no sample that time.
    """

    def __init__(self, proc_root: str = "/proc", *, problems: ProblemLog | None = None) -> None:
        self.proc_root = proc_root
        self.problems = problems if problems is not None else ProblemLog()
        self.meminfo_path = os.path.join(proc_root, "meminfo")
        self.pressure_path = os.path.join(proc_root, "pressure", "memory")
        self._meminfo = KeptFile(self.meminfo_path)
        self._pressure = KeptFile(self.pressure_path)

    def close(self) -> None:
        self._meminfo.close()
        self._pressure.close()

    def _report(self, out: list[Event], ts: int, source: str, target: str, msg: str) -> None:
        err = self.problems.once(ts, source, target, msg)
        if err is not None:
            out.append(err)

    def _read_pressure(self, out: list[Event], ts: int) -> Pressure | None:
        f = self._pressure
        if f.absent:
            return None
        try:
            text = f.read()
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) or exc.errno == errno.EOPNOTSUPP:
                f.absent = True
                self._report(out, ts, "psi", self.pressure_path, f"missing: {PSI_MISSING}")
            else:
                self._report(out, ts, "psi", self.pressure_path, strerror(exc))
            return None
        pressure = parse_pressure(text)
        if pressure is None:
            self._report(out, ts, "psi", self.pressure_path, f"unexpected content {text[:40]!r}")
        return pressure

    def sample(self, now_ns: int) -> list[Event]:
        """``[SampleError..., HostSample]`` stamped ``now_ns``."""
        out: list[Event] = []
        try:
            info = parse_meminfo(self._meminfo.read(), _MEMINFO_KEYS)
        except OSError as exc:
            self._report(out, now_ns, "host", self.meminfo_path, f"cannot read: {strerror(exc)}")
            return out
        pressure = self._read_pressure(out, now_ns)
        total, free = info.get("MemTotal"), info.get("MemFree")
        if total is None or free is None:
            self._report(out, now_ns, "host", self.meminfo_path, "no MemTotal or MemFree line")
            return out
        out.append(
            HostSample(
                ts=now_ns,
                mem_total=total,
                mem_available=info.get("MemAvailable"),  # Linux 3.14+
                mem_free=free,
                cached=info.get("Cached"),
                swap_free=info.get("SwapFree"),
                psi_some_avg10=pressure.some_avg10 if pressure else None,
                psi_full_avg10=pressure.full_avg10 if pressure else None,
                psi_some_total_us=pressure.some_total_us if pressure else None,
                psi_full_total_us=pressure.full_total_us if pressure else None,
            )
        )
        return out
