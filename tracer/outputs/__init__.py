"""Outputs people look at: the HTML/PNG timeline report, the Perfetto export, and the
documented JSON shapes of every machine-readable output these modules and ``repro`` write.

Modules:

* ``tracer.outputs.timeline``: one pass over a trace → a `Timeline` (pure data: per-unit
  memory, limits, pressure, GPU and probe series, markers, verdicts). Both renderers read it,
  so the report and the Perfetto export always show the same grouping and the same numbers.
* ``tracer.outputs.report``: the self-contained HTML report (inline SVG charts drawn by
  matplotlib, no scripts, no network) and its PNG twin.
* ``tracer.outputs.charts``: the report's charts, one module per chart's panels (``unit``,
  ``host``) over what they share (``base``).
* ``tracer.outputs.perfetto``: Chrome trace-event JSON for ui.perfetto.dev.
* ``tracer.outputs.schema``: the JSON Schema of verdict objects and ``explain --json``.
* ``tracer.repro`` (beside this package) runs the experiments whose JSON shape is below.

JSON shapes
===========

A verdict object (in ``record``, ``replay``, ``explain`` and ``postmortem --json``) is
``Verdict.to_json()`` plus ``"t"``; its JSON Schema is ``tracer.outputs.schema.VERDICT``
(``EXPLAIN`` for ``explain --json``'s document), checked against real output by the tests.
Causes: ``cgroup_oom``, ``global_oom``, ``gpu_oom``, ``probe_kill``, ``userspace_oom``,
``signal_kill``, ``device_reset``, ``app_exit``, ``unknown``. ``sender_exe`` is the sender's
executable when the recording saw it; ``probe_failures`` counts the unit's health probes that
failed in a row up to the exit, whatever the cause. Strings are exact (a process name may hold
control characters: JSON escapes them, text outputs show them as ``\\xNN``).

Every JSON document whyrestart prints has ``"schema"``: an integer bumped whenever a field
changes meaning or disappears (adding a field does not bump it). Times are seconds as numbers
unless a name ends in ``_ns`` (CLOCK_BOOTTIME nanoseconds); sizes are bytes.

``whyrestart history --json`` (schema 1): the agent's journal entries, oldest first::

    {
      "schema": 1,
      "state_dir": str,
      "entries": [
        {
          "schema": 1,
          "kind": "verdict" | "restart",
          "key": str,                      # boot id / pid / exit ts: unique, never written twice
          "time": str,                     # RFC 3339, the exit (or the new main's start)
          "ts_ns": int, "boot_id": str,
          "unit": str | null, "cause": str,
          # only for a unit a node's CRI runtime named (the log line's names and values):
          "attributes"?: {"k8s.pod.uid"?: str, "k8s.container.restart_count"?: int,
                          "container.id": str, "container.runtime.name": str},
          # kind "verdict":
          "labels": {"unit": str, "namespace"?: str, "pod"?: str, "container"?: str,
                     "container_name"?: str},  # as the metrics label it
          "pid": int, "comm": str, "confidence": str,
          "incident": str | null,          # open it with `whyrestart explain ID`
          "verdict": {...}                 # a verdict object, as above
          # kind "restart":
          "restart": {"ts": int, "unit": str, "old_pid": int, "new_pid": int,
                      "downtime_ns": int, "cause": str,
                      "carried_bytes"?: int, "carried"?: str}  # memory already charged
        }, ...
      ]
    }

``whyrestart repro --json`` (schema 1)::

    {
      "schema": 1,
      "kind": "repro",
      "setting": "memory_max" | "memory_high" | "probe_timeout",  # the one setting varied
      "fixed": {"memory_max_bytes": int | null, "probe": str | null,
                "probe_data": str | null,  # --probe-data: the body the http probe POSTs
                "probe_timeout_s": float | null, "probe_interval_s": float | null,
                "probe_failures": int | null, "duration_s": float | null},
      "command": [str, ...],
      "cgroup_version": 1 | 2,
      "parent_cgroup": str,                # where each run's cgroup was created
      "out_dir": str,                      # the traces
      "interrupted": bool,                 # SIGINT/SIGTERM/SIGHUP ended it early (exit 128+N)
      "runs": [
        {
          "run": int,                      # 1-based, in the order run
          "setting": str,                  # as written on the command line, e.g. "32M"
          "value": int | float,            # bytes (memory_*) or seconds (probe_timeout)
          "repeat": int,                   # 1..--runs
          "trace": str,                    # this run's trace file
          "outcome": "survived" | "degraded" | "killed" | "failed" | "error",
          "survived": bool,                # not killed, not degraded, and exited 0 or still
                                           # running at the end
          "exit_status": int | null,       # as a shell reports it (137 = SIGKILL)
          "cause": str | null,             # the deciding verdict's cause, e.g. "cgroup_oom"
          "verdict": {"pid": int, "comm": str, "cause": str, "confidence": str,
                      "summary": str, "advice": str} | null,
          "peak_bytes": int | null,        # the run cgroup's peak memory usage
          "time_to_kill_s": float | null,  # start of the run → the kill (killed runs only)
          "duration_s": float,             # start of the run → end of recording
          "stall_s": float,                # reclaim + throttling stall time in the run cgroup
          "probes": int,                   # probes run (0 without --probe)
          "probe_failures": int,           # of those, failed or timed out
          "max_probe_latency_s": float | null,
          "liveness_kill": bool,           # repro killed it after --probe-failures failures
          "thrash": {"ts": int, "since": int, "path": str, "refault_bytes_per_s": int,
                     "cache_bytes": int, "mapped_bytes": int, "usage_bytes": int | null,
                     "limit_bytes": int | null} | null,  # the fastest page-cache re-reading
                                           # seen in the run cgroup (tracer/analysis/thrash.py)
          "degraded": {                    # why a "degraded" run was (null otherwise)
            "reasons": [str, ...],         # e.g. "3 of 10 probes failed (3 timed out)", and
                                           # "page cache re-read from disk at 400.0 MiB/s (...)"
            "probes_counted": int,         # from the first probe that succeeded (all when none
                                           # did) to the workload's end
            "probe_failures_counted": int, "probe_timeouts_counted": int,
            "thrash": {...} | null         # as "thrash" above
          } | null,
          "error": str | null              # why the run could not be judged ("error" outcome)
        }, ...
      ],
      "smallest_surviving": {              # null when no setting survived every repeat
        "setting": str, "value": int | float,
        "headroom": int | float,           # value - peak usage (bytes) / - max latency (s)
        "headroom_pct": float              # headroom as a percentage of value
      } | null,
      "conclusion": {                      # what the runs show, from their verdicts
        "kind": "all_survived" | "smallest_survived" | "none_survived" | "other_reasons"
                | "interrupted",           # other_reasons: no run failed for the varied
                                           # setting's reason (memory, or the probe timeout)
        "text": str                        # the last line of the table
      },
      "warnings": [str, ...]               # e.g. a larger value failed where a smaller survived
    }

A run's ``outcome``: ``killed`` (its deciding verdict is not ``app_exit``, or the liveness
check killed it), ``failed`` (it exited non-zero or crashed on its own), ``degraded`` (varying a
memory setting: neither, but probes failed once it had answered one, or its page cache thrashed:
a model's mapped weights re-read on every request), ``survived`` (exit 0, or still running when
``--duration`` ended the run: repro's SIGTERM then is the end, not a kill), ``error``
(interrupted). ``smallest_surviving`` skips degraded settings.

``whyrestart postmortem --json`` (schema 1; ``tracer/postmortem``)::

    {
      "schema": 1,
      "kind": "postmortem",
      "target": {"kind": "container" | "unit" | "pod" | "cgroup" | "pid" | "all",
                 "spec": str,                # as given on the command line
                 "label": str},              # e.g. "podman llm"
      "now_ns": int,                        # CLOCK_BOOTTIME when the facts were read
      "since_ns": int,                      # exits before this were not judged (--since)
      "clock_offset_ns": int,               # CLOCK_REALTIME - CLOCK_BOOTTIME, now
      "kernel_log": {
        "readable": bool,
        "error": str | null,                # why not (e.g. kernel.dmesg_restrict)
        "fix": str | null,                  # what would let it be read
        "records": int,                     # records the ring held
        "first_ns": int | null,             # the oldest one, CLOCK_BOOTTIME
        "first_seq": int | null,            # > 0: older records were overwritten since boot
        "oom_reports": int                  # OOM victims it reports in the target
      },
      "runtime": {                          # null without one (--cgroup, --pid, --all)
        "source": "podman" | "docker" | "systemd", "id": str, "name": str,
        "state": str, "exit_code": int | null,  # the last exit, 128 + n for signal n
        "finished_ns": int | null,          # when it says it happened, CLOCK_BOOTTIME
        "restart_count": int | null, "restart_policy": str,
        "oom_killed": bool | null,          # its own claim (podman 4.3: false for OOM kills)
        "health_checks": int, "health_failed": int  # its health log (the last few checks)
      } | null,
      "kubelet": [                          # --pod: the kubelet's log directories
        {"container": str, "restarts": int,  # N of the newest N.log
         "previous_log": str | null, "previous_ns": int | null,  # last written
         "last_line": str}, ...             # the previous container's last words
      ],
      "cgroups": [                          # the target's cgroups and every ancestor, now
        {"path": str, "exists": bool, "limit_bytes": int | null, "usage_bytes": int | null,
         "peak_bytes": int | null, "failcnt": int | null,
         "events": {str: int},              # oom_kill, oom, under_oom / memory.events
         "psi_some_total_us": int | null,   # memory.pressure totals since it was created
         "psi_full_total_us": int | null}, ...
      ],
      "verdicts": [ ... ],                  # replay --json's verdict objects; "t" is the
                                            # wall-clock time (ISO 8601, UTC), and "pid" is 0
                                            # where no source kept the pid
      "agent_journal": {"path": str,        # when an agent ran here (tracer/agent/journal.py)
                        "entries": [ ... ]} | null,  # its verdict entries about the target
      "unknowns": [str, ...],               # what only a recording could have told
      "record_command": str                 # the command that records the next one
    }

``whyrestart export --format perfetto`` writes the Chrome trace-event format (the JSON object
form: ``{"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}``) that
ui.perfetto.dev and chrome://tracing open. ``metadata`` carries ``{"schema": 1, "tool":
"whyrestart", ...}``. One process track per unit (``pid`` 1 is the host, units follow in
report order, each named by a ``process_name`` metadata event); counters (``ph: "C"``) for
memory usage, limits, the effective limit, anon/file/shmem, PSI, GPU memory and probe latency;
complete slices (``ph: "X"``) for reclaim stalls and reclaim-summary intervals, on threads
named by ``thread_name`` events; instants (``ph: "i"``, scoped ``"p"``, or ``"g"`` for a host
OOM) for OOM kills, signals, exits, restarts and GPU failures. Timestamps are microseconds from
the start of the recording.
"""
