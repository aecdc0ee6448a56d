"""One module per section of the report; each has ``run(opts, tmp, ctx) -> Section``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.options import Options
from bench.records import Section
from bench.runner import Context
from bench.sections import (
    agent,
    decode,
    eta,
    gpuhold,
    llm,
    overflow,
    reclaim,
    replay,
    signals,
    soak,
    storm,
)

SectionRun = Callable[[Options, Path, Context], Section]

RUNS: dict[str, SectionRun] = {
    "storm": storm.run,
    "signals": signals.run,
    "reclaim": reclaim.run,
    "overflow": overflow.run,
    "decode": decode.run,
    "replay": replay.run,
    "soak": soak.run,
    "gpuhold": gpuhold.run,
    "agent": agent.run,
    "eta": eta.run,
    "llm": llm.run,
}
