"""sources -> enrichment -> time order -> sinks: the flow every live command shares.

`core` holds the contracts and the `Pipeline` that runs them; `sources`, `enrich` and `sinks`
hold the recorder's parts. ``tracer.pipeline.record`` assembles them for ``record``, ``tail`` and
``repro``.
"""
