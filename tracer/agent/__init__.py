"""The always-on agent: the recorder's pipeline with no targets (every container and unit), and
sinks that keep what a post-mortem needs within a disk budget.

  state.py      the state directory: its lock, its layout, the disk budget and eviction
  segments.py   rotating trace segments (the last N minutes at full resolution)
  incidents.py  the evidence window around each notable verdict, kept as a replayable trace
  journal.py    every verdict and restart, one JSON line each, kept across agent restarts
  metrics.py    Prometheus counters through prometheus_client, series of vanished units expired
  otel.py       a verdict as one JSON log line with OpenTelemetry attribute names (pure)
  run.py        assembles the above around `tracer.pipeline.record.Recorder`
"""
