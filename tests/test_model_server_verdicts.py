"""Tier 1: a model server killed by its supervisor after health probes that never passed was
still starting (loading its model: a start-up longer than the probe's failure budget), not hung
(issue 29); and "never passed" needs probes from its start, not from a late attach."""

from __future__ import annotations

import signal

import msgspec

from tests.streams import (
    MiB,
    cgroup,
    execd,
    killed,
    kmsg,
    one,
    oom,
    probe,
    sent,
    unit_info,
)
from tracer.analysis.analyzer import Verdict
from tracer.events import Event, ProbeSample


def loading(at: float) -> ProbeSample:
    """llama-server's /health while it loads the model: 503."""
    return msgspec.structs.replace(probe(at, False), status=503, error="HTTP 503")


def server(start: float, *events: Event) -> list[Event]:
    """llama-server (pid 100) started at ``start`` in a podman container."""
    return [
        cgroup(20, "/libpod_parent/libpod-" + "a" * 64, 512 * MiB),
        unit_info(20, "podman", "llm"),
        execd(start, 100, 20, "llama-server"),
        *events,
    ]


def conmon_kill(at: float, start: float, *probes: Event) -> Verdict:
    return one(
        *server(start, *probes),
        sent(at, 400, 100, signal.SIGKILL, comm="conmon"),
        killed(at, 100, signal.SIGKILL, cg=20, start=start),
    )


def test_a_probe_kill_before_the_probe_ever_passed_was_still_starting() -> None:
    v = conmon_kill(1.7, 0.5, loading(0.7), loading(1.0), loading(1.3), loading(1.6))
    assert (v.cause, v.confidence, v.sender_role) == ("probe_kill", "high", "supervisor")
    assert "; it was still starting: it had never answered its probe healthy in the 1.2 s" in (
        v.summary
    )
    assert "startup probe" in v.advice and "not more memory" in v.advice


def test_a_probe_kill_after_the_server_had_been_healthy_is_not_a_slow_start() -> None:
    v = conmon_kill(1.7, 0.5, probe(0.7, True), loading(1.0), loading(1.3), loading(1.6))
    assert v.cause == "probe_kill"
    assert "still starting" not in v.summary and "startup probe" not in v.advice


def test_probes_that_began_long_after_the_start_say_nothing_of_the_start() -> None:
    """A recording that attached to a server running for minutes: its probes failing since
    then do not make it a server that never became healthy."""
    v = conmon_kill(301.7, 0.5, loading(300.7), loading(301.0), loading(301.3))
    assert v.cause == "probe_kill" and "still starting" not in v.summary
    late_oom = one(
        *server(0.5, loading(300.7), loading(301.0)),
        oom(302.0, 100, limit_cgroup=20, limit=512 * MiB, usage=512 * MiB, victim_cg=20),
        kmsg(302.0, 100, oom_memcg="/libpod_parent/libpod-" + "a" * 64),
        killed(302.0, 100, signal.SIGKILL, cg=20, start=0.5),
    )
    assert late_oom.cause == "cgroup_oom" and "still starting" not in late_oom.summary


def test_a_recorded_wrapper_that_execs_the_server_is_still_the_one_unit_its_probes_check() -> None:
    """`record --probe URL -- sh -c '... exec llama-server ...'`: the command's unit is named
    by its comm, which the exec changes; its unlabelled probes still check it."""
    v = one(
        cgroup(20, "/llm", 136 * MiB),
        execd(0.5, 100, 20, "sh"),
        execd(0.52, 100, 20, "llama-server"),
        loading(0.6),
        oom(0.7, 100, limit_cgroup=20, limit=136 * MiB, usage=136 * MiB, victim_cg=20),
        kmsg(0.7, 100, oom_memcg="/llm"),
        killed(0.7, 100, signal.SIGKILL, cg=20, start=0.5, comm="llama-server"),
    )
    assert (v.cause, v.unit) == ("cgroup_oom", "llama-server (pid 100)")
    assert "it was still starting (none of its 1 health probe had passed)" in v.summary
