"""The experiment's plan: which one setting varies, its values, and what is held fixed.

`Options` is the ``whyrestart repro`` command line as given; `make_plan` checks it and builds
the `Plan` the runner (`tracer.repro.run`) follows. Values are parsed by `tracer.parse.values`,
the one parser of sizes and durations.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tracer.errors import UsageError
from tracer.parse import values

if TYPE_CHECKING:
    from tracer.sources.probes import ProbeSpec

MEMORY_MAX, MEMORY_HIGH, PROBE_TIMEOUT = "memory_max", "memory_high", "probe_timeout"
OPTION = {
    MEMORY_MAX: "--memory-max",
    MEMORY_HIGH: "--memory-high",
    PROBE_TIMEOUT: "--probe-timeout",
}
DEFAULT_PROBE_FAILURES = 3  # the kubelet's default failureThreshold
DEFAULT_PROBE_INTERVAL_S = 1.0
DEFAULT_PROBE_TIMEOUT_S = 1.0  # the kubelet's default timeoutSeconds


@dataclass(frozen=True, slots=True)
class Setting:
    """One value of the varied setting: as written, and as a number (bytes or seconds)."""

    text: str
    value: int | float


def parse_settings(kind: str, text: str) -> list[Setting]:
    """``"32M,256M"`` → settings; a probe timeout takes ``0.5``, ``500ms``, ``2s``."""
    parse_one: Callable[[str], int | float] = (
        values.parse_duration if kind == PROBE_TIMEOUT else values.parse_size
    )
    return [Setting(t, v) for t, v in values.parse_list(OPTION[kind], text, parse_one)]


@dataclass
class Plan:
    kind: str  # the varied setting: MEMORY_MAX, MEMORY_HIGH or PROBE_TIMEOUT
    settings: list[Setting]
    command: list[str]
    out_dir: str
    repeats: int = 1
    memory_max: int | None = None  # the fixed limit when another setting varies
    probe: ProbeSpec | None = None
    probe_timeout_s: float | None = None  # fixed, when the probe timeout does not vary
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S
    probe_failures: int = DEFAULT_PROBE_FAILURES
    probe_delay_s: float = 0.0
    duration_s: float | None = None
    parent_cgroup: str | None = None  # None: chosen from this process's own cgroup

    def runs(self) -> list[tuple[Setting, int]]:
        return [(s, r) for s in self.settings for r in range(1, self.repeats + 1)]

    def fixed(self) -> dict[str, Any]:
        return {
            "memory_max_bytes": self.memory_max,
            "probe": str(self.probe) if self.probe else None,
            "probe_data": self.probe.body.decode(errors="replace")
            if self.probe is not None and self.probe.body is not None
            else None,
            "probe_timeout_s": self.probe_timeout_s,
            "probe_interval_s": self.probe_interval_s if self.probe else None,
            "probe_failures": self.probe_failures if self.probe else None,
            "duration_s": self.duration_s,
        }


@dataclass(frozen=True)
class Options:
    """The ``whyrestart repro`` command line as given (values still text); `make_plan` checks
    it. The defaults are the command line's."""

    command: Sequence[str]
    memory_max: str | None = None
    memory_high: str | None = None
    probe_timeout: str | None = None
    repeats: int = 1
    probe: str | None = None
    probe_data: str | None = None
    probe_interval: str | None = None
    probe_failures: int = 3
    probe_delay: str | None = None
    duration: float | None = None
    out_dir: str | None = None
    parent_cgroup: str | None = None


def make_plan(o: Options, *, memory_version: int | None) -> Plan:
    """Check the options and decide which one setting varies (long: one short check per
    option, in the order a user should meet the errors).

    Exactly one of the three may list several values; the one with several values (or the only
    one given) varies, the others are held fixed. ``--memory-high`` needs cgroup v2;
    ``--probe-timeout`` needs ``--probe``.
    """
    given = {
        k: v
        for k, v in (
            (MEMORY_MAX, o.memory_max),
            (MEMORY_HIGH, o.memory_high),
            (PROBE_TIMEOUT, o.probe_timeout),
        )
        if v is not None
    }
    if not given:
        raise UsageError(
            "nothing to vary",
            fix="give --memory-max A,B,... (or --memory-high A,B, or --probe-timeout A,B "
            "with --probe)",
        )
    if not o.command:
        raise UsageError(
            "no command to run", fix="put the workload after --, e.g. -- python serve.py"
        )
    if o.repeats < 1:
        raise UsageError("--runs must be at least 1")
    if o.duration is not None and o.duration <= 0:
        raise UsageError("--duration must be positive")
    if o.probe_failures < 0:
        raise UsageError("--probe-failures must be 0 (never kill) or more")
    if o.memory_high is not None and memory_version == 1:
        raise UsageError(
            "--memory-high needs cgroup v2: this host's memory controller is on cgroup v1, "
            "which has no memory.high",
            fix="vary --memory-max instead, or run on a cgroup v2 host",
        )
    if memory_version is None:
        raise UsageError(
            "no cgroup hierarchy with the memory controller is mounted",
            fix="repro needs the memory controller (cgroup v1 memory or cgroup v2)",
        )
    multi = [k for k, v in given.items() if "," in v]
    if len(multi) > 1:
        raise UsageError(
            f"{' and '.join(OPTION[k] for k in multi)} both list several values",
            fix="change exactly one setting per experiment: give the others one value",
        )
    if multi:
        kind = multi[0]
    elif len(given) == 1:
        kind = next(iter(given))
    else:
        raise UsageError(
            f"{' and '.join(OPTION[k] for k in given)} are all single values: which one varies?",
            fix="list two or more values (A,B) for the one setting to vary",
        )
    spec = None
    if o.probe is not None:
        from tracer.sources.probes import parse_probe

        spec = parse_probe(o.probe)
    if o.probe_data is not None:
        if spec is None or spec.kind != "http":
            raise UsageError(
                "--probe-data needs an http:// --probe",
                fix="e.g. --probe http://127.0.0.1:8080/completion "
                '--probe-data \'{"prompt": "Hi", "n_predict": 1}\'',
            )
        # (argv's bytes as given: click hands undecodable ones on as surrogate escapes)
        spec = dataclasses.replace(spec, body=o.probe_data.encode("utf-8", "surrogateescape"))
    if PROBE_TIMEOUT in given and spec is None:
        raise UsageError(
            "--probe-timeout needs --probe", fix="say what to probe: --probe http://HOST:PORT/PATH"
        )
    settings = parse_settings(kind, given[kind])
    plan = Plan(
        kind=kind,
        settings=settings,
        command=list(o.command),
        out_dir=o.out_dir or time.strftime("repro-%Y%m%d-%H%M%S"),
        repeats=o.repeats,
        probe=spec,
        probe_failures=o.probe_failures,
        duration_s=o.duration,
        parent_cgroup=o.parent_cgroup,
    )
    if kind != MEMORY_MAX and o.memory_max is not None:
        plan.memory_max = values.parse_size(o.memory_max)
    if spec is not None:
        if kind != PROBE_TIMEOUT:
            plan.probe_timeout_s = (
                values.parse_duration(o.probe_timeout)
                if o.probe_timeout
                else DEFAULT_PROBE_TIMEOUT_S
            )
        if o.probe_interval is not None:
            plan.probe_interval_s = values.parse_duration(o.probe_interval)
        if o.probe_delay is not None:
            plan.probe_delay_s = values.parse_duration(o.probe_delay)
    elif o.probe_interval is not None or o.probe_delay is not None:
        raise UsageError("--probe-interval and --probe-delay need --probe")
    return plan
