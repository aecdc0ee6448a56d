"""The verdict rules: pure functions of (exit, evidence view) -> ``Finding``. No process table,
no retention, no English (tracer/analysis/wording.py has the words).

One module per rule family; ``decide`` (decide.py) applies them in order: the kernel's OOM kill
(oom.py, with what filled the cgroup: composition.py), then the GPU (gpu.py), then signals
(signals.py; a health-probe kill and a user-space OOM killer: supervisors.py), then the
process's own exit (exits.py). A rule sees one exit through an ``ExitView`` (view.py) and
returns a new ``Finding``; a new rule is written in its family's module and called from
``decide``, nowhere else.

Rules (ARCHITECTURE.md, "Verdicts need agreement"): exit status 137 alone is never a memory
verdict. An OOM verdict needs an OOM kill of this very process incarnation (from BPF or the
kernel log, stamped after it started) *and* a SIGKILL exit that no process sent; the OOM
killer's own SIGKILL (si_code SI_KERNEL) is part of that OOM, not a second "signal kill".
Evidence belongs to an incarnation (pid + start time), never to a bare pid: a report stamped
before the process started is about an earlier process with the pid, and one an earlier exit's
verdict used is gone with it.

How sure (README, "How sure a verdict is"): a cause the kernel records as an act is seen
directly: the exit code a process returned, the signal hook's record of who sent the signal
that ended it, a fault or abort it raised. One such record, with nothing against it, is high.
A cause that is inferred (a memory limit, the GPU, a health probe, a device failure) is high
only when two independent sources agree (BPF, the kernel log, the cgroup's counters, NVML,
the uprobes, the prober, the signal hook); the GPU OOM rule counts the uprobe's "out of
memory" returned to the process within seconds of its own exit as the two (the failure and
the ending are each recorded as they happen). One source is medium; none is low. Any
disagreement caps a verdict at medium, whichever rule made it (``decide`` enforces it).
"""

from tracer.analysis.rules.decide import decide
from tracer.analysis.rules.exits import related_exit
from tracer.analysis.rules.oom import oom_evidence_complete
from tracer.analysis.rules.view import PROBE_FAILURES, SETTLE_NS, ExitView, view_of

__all__ = [
    "PROBE_FAILURES",
    "SETTLE_NS",
    "ExitView",
    "decide",
    "oom_evidence_complete",
    "related_exit",
    "view_of",
]
