"""Tier 1: a restart that begins with memory already charged says so (issue 30 §1): files in a
memory-backed filesystem (tmpfs, /dev/shm) and page cache outlive the process that made them,
so the next run starts with them counted against the limit that killed the last one."""

from __future__ import annotations

from tests.streams import MiB, cgroup, execd, exit_code, sample, unit_info
from tracer.analysis.analyzer import Analyzer, Restart
from tracer.events import Event

CG, PATH = 20, "/machine.slice/libpod-" + "a" * 64 + ".scope"


def restarts(*between: Event) -> list[Restart]:
    """A container's main process exits 1 at 1.0 s and the next run starts at 2.0 s, with
    ``between`` in the stream (samples of the container's cgroup)."""
    a = Analyzer()
    a.feed_all(
        sorted(
            [
                cgroup(CG, PATH, 256 * MiB),
                unit_info(CG, "podman", "llm"),
                execd(0.1, 100, CG, "server"),
                exit_code(1.0, 100, 1, comm="server", start=0.1, cg=CG),
                *between,
                execd(2.0, 101, CG, "server"),
            ],
            key=lambda e: e.ts,
        )
    )
    return a.restarts


def test_tmpfs_left_by_the_last_run_is_named_at_the_restart() -> None:
    stat = {"shmem": 120 * MiB, "file": 124 * MiB, "anon": 0}
    [r] = restarts(sample(1.5, CG, PATH, usage=125 * MiB, stat=stat))
    assert r.carried_bytes == 125 * MiB
    assert r.carried == (
        f"the new run started with 125.0 MiB already charged to {PATH} (120.0 MiB tmpfs/shared "
        "memory, 4.0 MiB page cache): files in a memory-backed filesystem outlive the process "
        "and count against the limit of the next run"
    )
    assert r.to_json()["carried_bytes"] == 125 * MiB


def test_page_cache_alone_is_named_as_the_previous_runs() -> None:
    [r] = restarts(sample(1.5, CG, PATH, usage=300 * MiB, stat={"shmem": 0, "file": 290 * MiB}))
    assert "290.0 MiB page cache): left by the previous run" in r.carried


def test_nothing_is_said_without_a_sample_between_the_runs_or_below_16_mib() -> None:
    # a sample after the new start would count the new run's own memory
    [r] = restarts(sample(2.5, CG, PATH, usage=125 * MiB, stat={"shmem": 120 * MiB}))
    assert (r.carried_bytes, r.carried) == (None, "")
    assert "carried" not in r.to_json()
    [r] = restarts(sample(1.5, CG, PATH, usage=8 * MiB, stat={"shmem": 8 * MiB}))
    assert r.carried_bytes is None
