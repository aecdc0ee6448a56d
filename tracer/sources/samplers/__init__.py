"""Memory samplers: cgroup memory files, host meminfo and PSI, per-process RSS, on a schedule.

This package owns the periodic reads behind ``CgroupSample``, ``EffectiveLimit``,
``HostSample``, ``ProcessSample`` and ``SampleError`` events. The text is parsed by
``tracer.parse.memory`` (pure); here is only the I/O and the bookkeeping:

* ``CgroupSampler(layout, path)`` (``cgroup``): one memory cgroup's files (v1 or v2);
* ``HostSampler(proc_root)`` (``host``): ``/proc/meminfo`` and ``/proc/pressure/memory``;
* ``ProcessSampler(pid, proc_root)`` (``process``): ``/proc/PID/status``
  (RssAnon/RssFile/RssShmem/VmSwap);
* ``SamplerSet`` (``schedule``): the watched cgroups (each with its ancestors up to the root),
  the host and the watched processes, each on its interval; ``due(now_ns)`` returns what is
  due;
* ``files``: the kept-open files they all read, and the problems already said (``ProblemLog``).

Clock: nothing here reads the event clock. The caller passes ``now_ns`` (CLOCK_BOOTTIME,
``time.clock_gettime_ns(time.CLOCK_BOOTTIME)``, the clock the BPF side stamps with) and every
event of one call carries it. (``time.perf_counter_ns`` is read only for ``SamplerSet.stats``.)

Cost: files are opened once and re-read with ``os.pread(fd, 65536, 0)``; cgroupfs (kernfs) and
procfs files are seq_files, which restart from offset 0 on every pread. On the development VMs
(one pinned vCPU, noisy) a kept-open re-read took ~0.6 µs for memory.usage_in_bytes and ~4 µs
for memory.stat, against ~3-5 µs and ~7-9 µs with os.open+read+close (~7-13 µs with Python's
``open().read()``). Whole samples, parsing included: a v1 cgroup with memory.stat 40-70 µs
(the memory.stat lookup ~18-24 µs of it), the host 23-45 µs, a process 14-28 µs.

A cgroup's files are opened relative to a descriptor of its directory (``openat``): once a
cgroup is removed, reads of its open files fail with ENODEV and lookups in its directory fail
with ENOENT, even when a new cgroup of the same name (a restarted container) appears, so a
sampler never silently switches to a namesake.

Failures are events, never exceptions (except ``UsageError`` for a path that does not name a
cgroup when it is watched): each problem becomes one ``SampleError`` per (source, target,
message). A removed cgroup or an exited process gives one error and its sampler stops
(``SamplerSet`` drops it). A file this kernel lacks gives one error naming the kernel version
that added it, and its field stays None:

* ``memory.peak``: Linux 5.19 (v2);
* ``memory.pressure`` and ``/proc/pressure/memory`` (PSI): Linux 4.20, and only with
  CONFIG_PSI=y and not booted with ``psi=0``;
* ``memory.events``' ``oom_group_kill`` key: Linux 5.17 (an absent key, not reported);
* v1 ``memory.oom_control``'s ``oom_kill`` line: Linux 4.13 (an absent key, not reported).

On the v2 root cgroup the kernel has no memory.current/max/high/peak/events (and the first PSI
kernels had no memory.pressure there either): missing files there are expected and not
reported.

Hybrid hosts (memory controller on v1, a unified v2 hierarchy mounted beside it, like the
development VMs): PSI is accounted in the v2 hierarchy whatever controllers it has, so a v1
cgroup's memory pressure is read from ``<unified_root><same path>/memory.pressure`` when that
directory exists (systemd mirrors its unit paths in every hierarchy). Where it does not (other
managers), the PSI fields are None without an error: nothing failed.
"""

from tracer.sources.samplers.cgroup import NEAR_LIMIT_PERCENT, CgroupSampler
from tracer.sources.samplers.files import ProblemLog, SourceStats
from tracer.sources.samplers.host import HostSampler
from tracer.sources.samplers.process import ProcessSampler
from tracer.sources.samplers.schedule import (
    DEFAULT_FAST_INTERVAL_NS,
    DEFAULT_INTERVAL_NS,
    MAX_CGROUPS,
    SamplerSet,
)

__all__ = [
    "DEFAULT_FAST_INTERVAL_NS",
    "DEFAULT_INTERVAL_NS",
    "MAX_CGROUPS",
    "NEAR_LIMIT_PERCENT",
    "CgroupSampler",
    "HostSampler",
    "ProblemLog",
    "ProcessSampler",
    "SamplerSet",
    "SourceStats",
]
