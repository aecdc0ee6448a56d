"""The liveness prober beside a run: ``--probe`` checked every ``--probe-interval`` and, like a
kubelet liveness probe, ``--probe-failures`` consecutive failures kill the workload. Every
result is also a source of the run's recording (``ProbeSample`` events)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracer.sources.cgroupfs import ChildCgroup
    from tracer.sources.probes import ProbeResult, ProbeSpec


@dataclass
class Liveness:
    """Runs the probe beside a run and, like a kubelet liveness probe, kills the workload after
    ``failures`` consecutive failures (never when ``failures`` is 0). It is a source of the
    run's recording: it starts when the recording does (``delay_s`` counts from then) and its
    results go into the run's trace."""

    spec: ProbeSpec
    interval_s: float
    timeout_s: float
    failures: int
    delay_s: float
    cgroup: ChildCgroup
    results: list[ProbeResult] = field(default_factory=list)
    killed_at_ns: int | None = None

    def __post_init__(self) -> None:
        from tracer.pipeline.sources import ProbeResultsSource

        # the recording's view of the results: each goes into the run's trace
        self.source = ProbeResultsSource(self.spec.text, on_start=self.start, on_stop=self.stop)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="repro-liveness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.timeout_s + 10)

    def _run(self) -> None:
        from tracer.sources.probes import Prober

        if self._stop.wait(self.delay_s):
            return
        consecutive = 0
        with Prober(self.spec, self.interval_s, self.timeout_s) as prober:
            while not self._stop.wait(0.05):
                for r in prober.poll():
                    self._take(r)
                    consecutive = 0 if r.ok else consecutive + 1
                    if self.failures and consecutive >= self.failures and self.killed_at_ns is None:
                        self._kill()
            for r in prober.poll():
                self._take(r)

    def _take(self, r: ProbeResult) -> None:
        self.results.append(r)
        self.source.put(r)

    def _kill(self) -> None:
        self.killed_at_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        for pid in self.cgroup.procs():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
