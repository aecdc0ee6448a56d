"""The order of the rule families: the one entry point that judges an exit."""

from __future__ import annotations

import signal as _signal

from tracer.analysis.findings import HIGH, MEDIUM, Finding
from tracer.analysis.rules.exits import app_exit, handled_stop, init_exit, related_exit
from tracer.analysis.rules.gpu import gpu_exit
from tracer.analysis.rules.oom import best_oom, oom_kill
from tracer.analysis.rules.probes import with_probe_failures
from tracer.analysis.rules.signals import signal_exit
from tracer.analysis.rules.view import ExitView, amend, fatal_signal, is_kernel_kill


def decide(v: ExitView) -> Finding:
    """The finding on one exit: the first rule family that applies. Whatever the rule, a
    finding that lists a disagreement is at most medium, and one whose unit's health probes
    were failing up to the exit lists them, cause or not."""
    f = _decide(v)
    if f.disagreements and f.confidence == HIGH:
        f = amend(f, confidence=MEDIUM)
    if v.ev.probes:
        f = with_probe_failures(v, f)
    return f


def _decide(v: ExitView) -> Finding:
    ws = v.ex.wait
    had_oom = best_oom(v.ooms) is not None or bool(v.kmsg)
    if had_oom and ws.signal == _signal.SIGKILL:
        killer = fatal_signal(v.signals, _signal.SIGKILL)
        if killer is None or is_kernel_kill(killer) or any(is_kernel_kill(s) for s in v.signals):
            return oom_kill(v)
        # the SIGKILL that ended it was sent by a process, and the kernel sent none: the OOM
        # report is not about this kill (an earlier process with the pid, a late report)
        return signal_exit(v, had_oom)
    gpu = gpu_exit(v)
    if gpu is not None:
        return gpu
    if ws.signal is not None:
        return signal_exit(v, had_oom)
    return init_exit(v) or handled_stop(v) or related_exit(v, had_oom) or app_exit(v, had_oom)
