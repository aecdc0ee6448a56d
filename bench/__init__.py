"""scripts/bench: what whyrestart costs, how fast it reads, and whether it loses anything.

Usage (as root; run scripts/setup first):
    scripts/bench [SECTION ...] [--rounds N] [--seconds S] [--only TOOL,...] [--json PATH]
                  [--quick] [section options, see --help]

Sections (all of them, in this order, when none is named):

  storm     fork/exit storm (build/bench/wr-storm) bare, under `whyrestart record --all`, under a
            bpftrace one-liner printing every exit and under libbpf-tools' exitsnoop: slowdown,
            events lost, tracer CPU and RSS, start-to-first-event.
  signals   signal storm (wr-sigstorm: SIGUSR1 ping-pong with a child that handles it) bare,
            under whyrestart, a bpftrace one-liner on signal:signal_generate and libbpf-tools'
            sigsnoop; then the same at a paced --sig-rate (default 50,000/s) for loss.
  reclaim   memcg reclaim storm (wr-reclaim: re-reading a file on disk bigger than the memory
            limit of a child memory cgroup made for the run) bare, under whyrestart and under
            a bpftrace one-liner on vmscan:mm_vmscan_memcg_reclaim_begin/end.
  overflow  ring-buffer overflow on purpose: the recorder is SIGSTOPped during a storm, and
            every event it could not take must be counted in the trace (footer `lost`).
  decode    batched decode throughput of synthetic ring-buffer exit records (Python).
  replay    a synthetic 1,000,000-event trace: TraceReader alone, `whyrestart replay
            --verdicts-only`, and `jq -c .` on the same file.
  soak      `whyrestart record --all` for --soak-seconds (10 minutes) at --soak-rate exits/s:
            RSS every second (flat?), loss, CPU. CI runs a shortened soak
            (tests/test_soak_root.py).
  gpuhold   a program that loads libcuda from an unprobed path (LD_LIBRARY_PATH) and fails its
            first allocation at once, recorded --gpuhold-runs times (a fresh stand-in library
            each), and a fork storm of --gpuhold-storm of them: failures caught, holds taken and
            not taken, how long a held program waited.
  agent     `whyrestart agent` side by side with exitsnoop: CPU at idle and at a paced
            --agent-rate (1,000) clean exits/s in a child cgroup (against exitsnoop and bare), a
            storm mixed with non-zero exits, fatal signals and cgroup OOM kills counted back from
            the agent's segments, OOM kill -> /metrics and -> history latency (--agent-kills),
            RSS over --agent-soak and the state dir's growth at idle.
  eta       the time-to-limit warnings replayed from the recorded traces tests/data/eta_*.trace.zst
            (bench/eta_traces.py records them): lead time of the first warning before each OOM
            kill and its error; false warnings on the traces without an OOM kill.
  llm       llama.cpp's real llama-server (scripts/build-llama, the generated model of llm/)
            serving a fixed prompt set (fixed seed, --llm-threads pinned to --storm-cpu) bare,
            under `whyrestart record` and beside `whyrestart agent`, round-robin over --rounds:
            tokens/s and request latency p50/p99 as ratios to bare; the tools' CPU and RSS
            while the server runs.

Sections with tools (storm, signals, reclaim) run their variants round-robin for --rounds rounds
(the order rotates every round), each run being:

  1. start the tool pinned to --tool-cpu (taskset), and at once a marker loop pinned to
     --storm-cpu that forks a child named "wrmkNNNNN" every 10 ms (for signal tools the child
     also sends itself an ignored SIGUSR1); wait until a marker shows up in the tool's output
     file (that also proves the tool is attached), then stop the markers;
  2. settle, read the tool's CPU time, run the workload (pinned to --storm-cpu) for --seconds,
     settle again so the tool can drain, read its CPU time and peak RSS;
  3. stop the tool with SIGINT and wait for it to finish (whyrestart writes its footer);
  4. count in the tool's output the workload's events, and what it says it lost.

The report (markdown on stdout, one table per section, each followed by how its numbers were
measured) goes to stdout, progress to stderr; --json keeps every run's raw numbers.

The code: `scripts/bench` only starts this package with the virtualenv's python (as
``python -m bench`` does). Modules: `options` (the command line), `records` (the raw numbers
of a run, typed), `procs` (starting, pinning and reaping
processes), `helpers` (the C workloads in bench/c/, compiled with gcc into build/bench/ each
run), `tools` (the tracers measured and how each one's output is counted; whyrestart's trace is
read with `tracer.trace.reader.TraceReader`), `workloads` (the storms; memory cgroups through
`tracer.sources.cgroupfs.ChildCgroup`), `runner` (one run and the round-robin), `report` (the
medians and table cells), one module per section under `sections/`, `machine` (what else ran),
`cli` (main). What measures whyrestart's own Python on one core (decode, writing and reading a
trace) runs in a process of its own: `bench.pyside`.
"""
