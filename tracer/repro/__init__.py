"""``whyrestart repro``: the one-change-per-run method as a command.

Run the workload again and again, each time in a fresh child memory cgroup, changing exactly
one setting per run (``--memory-max``, ``--memory-high`` or ``--probe-timeout``), with no
restart policy, each run recorded to its own trace; then compare the runs and name the smallest
setting that survived, with its headroom.

One module per thing this package owns: ``plan`` the experiment plan (`Plan`, built from the
command line's `Options` by `make_plan`), ``run`` running it (`Experiment`: the run cgroups, the
recordings, the stop signals), ``liveness`` the prober beside a run, ``judge`` judging each run
(`RunResult`, `judge`), and ``compare`` the comparison (`Comparison`: the table and the
``--json`` shape documented in `tracer.outputs`). The names below are the package's interface.

How a run is isolated: the command is wrapped in ``sh -c 'echo $$ > <cgroup>/cgroup.procs &&
exec "$@"'``, so it is inside the run's cgroup before it executes a single instruction of the
workload, and the recorder watches it from its first exec (the idiom of the root tests). The
cgroup always has a memory limit: the varied one, or ``--memory-max``, or a safety cap of 80% of
the host's available memory, so a run can never push the host into a global OOM. When the run
ends (the command exited, ``--duration`` passed, or a liveness kill), whatever is left in the
cgroup is killed, the page cache it holds is reclaimed (a page stays charged to the cgroup that
read it: the next run would find the files cached and be charged nothing for them) and the
cgroup removed.

Probes: with ``--probe`` a probe runs beside each run (``tracer.sources.probes.Prober``). Like a
kubelet liveness probe, ``--probe-failures`` consecutive failures (default 3; 0 turns it off)
make repro kill the workload, so varying ``--probe-timeout`` shows which timeout the workload
survives. ``--probe-data`` makes an HTTP probe a POST of real work (a one-token completion):
under a memory setting, a run whose probes fail without a kill, or whose page cache thrashes
(a model's mapped weights re-read on every request), is ``degraded``, not survived
(``judge``), and the smallest setting that survived skips it. Every probe result is a
source of the run's recording (``ProbeSample`` events), so a run's trace holds the probes that
judged it and replays to the verdicts repro printed; the run's probe counts are read back from
its trace. The end of ``--duration`` (repro's own SIGTERM) is the end of a run, not a kill.
"""

from tracer.repro.compare import (
    ALL_SURVIVED,
    INTERRUPTED,
    MEMORY_CAUSES,
    NONE_SURVIVED,
    OTHER_REASONS,
    SCHEMA,
    SMALLEST_SURVIVED,
    Comparison,
)
from tracer.repro.judge import (
    DEGRADED,
    ERROR,
    FAILED,
    KILLED,
    SURVIVED,
    Degraded,
    RunResult,
    counted_probes,
    deciding_verdict,
    degradation,
    judge,
)
from tracer.repro.plan import (
    DEFAULT_PROBE_FAILURES,
    DEFAULT_PROBE_INTERVAL_S,
    DEFAULT_PROBE_TIMEOUT_S,
    MEMORY_HIGH,
    MEMORY_MAX,
    OPTION,
    PROBE_TIMEOUT,
    Options,
    Plan,
    Setting,
    make_plan,
    parse_settings,
)
from tracer.repro.run import SAFETY_CAP_FRACTION, Experiment, default_parent, in_cgroup, safety_cap

__all__ = [
    "ALL_SURVIVED",
    "DEFAULT_PROBE_FAILURES",
    "DEFAULT_PROBE_INTERVAL_S",
    "DEFAULT_PROBE_TIMEOUT_S",
    "DEGRADED",
    "ERROR",
    "FAILED",
    "INTERRUPTED",
    "KILLED",
    "MEMORY_CAUSES",
    "MEMORY_HIGH",
    "MEMORY_MAX",
    "NONE_SURVIVED",
    "OPTION",
    "OTHER_REASONS",
    "PROBE_TIMEOUT",
    "SAFETY_CAP_FRACTION",
    "SCHEMA",
    "SMALLEST_SURVIVED",
    "SURVIVED",
    "Comparison",
    "Degraded",
    "Experiment",
    "Options",
    "Plan",
    "RunResult",
    "Setting",
    "counted_probes",
    "deciding_verdict",
    "default_parent",
    "degradation",
    "in_cgroup",
    "judge",
    "make_plan",
    "parse_settings",
    "safety_cap",
]
