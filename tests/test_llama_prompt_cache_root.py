"""Tier 3 (root): llama.cpp's real `llama-server` whose prompt cache outgrows its memory limit
(issue 29). Waves of 4 distinct long prompts at once, a wave every 8 s as clients that come
back send them (llm.server.prompt_waves; sent back to back, a fast host answers a wave in well
under a second and the 1 s sampler sees a ramp, not steps): as each wave arrives, the server
saves the last wave's slots to its prompt cache (`--cache-ram`, 8 GiB by default), so its anon
memory grows a wave at a time and never comes back.

(a) Under llm.server.PROMPT_CACHE_LIMIT (400 MiB) the server, loaded and serving, is OOM-killed
in a later wave: cgroup_oom at that limit, with anon named as what filled it.
(b) The same waves with `--cache-ram 0` leave its anon flat, and it is never OOM-killed.

The oracles are not the tool's: the server's answers to each wave, the kernel log's OOM line
for its pid (dmesg), the cgroup's failcnt and OOM-kill counter, and its anon after each wave,
read by this test from memory.stat."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from llm.server import (
    PROMPT_CACHE_ARGS,
    PROMPT_CACHE_LIMIT,
    BuildFailed,
    Built,
    Wave,
    argv,
    built,
    charged_here,
    free_port,
    prompt_waves,
    wait_healthy,
)
from tests.workloads import in_cgroup
from tracer.analysis.analyzer import Verdict
from tracer.pipeline.follow import ProbeSetup
from tracer.pipeline.record import Recorder, RecordResult, Targets
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup
from tracer.sources.probes import parse_probe

pytestmark = pytest.mark.root

MiB = 1024 * 1024
LIMIT = PROMPT_CACHE_LIMIT
WAVES = 8  # at most, with the cache on: the fourth is the one killed here (+32-65 MiB a wave)
FLAT_WAVES = 4  # with it off: as many as the cache took to fill the limit


@pytest.fixture(scope="module")
def server() -> Built:
    try:
        b = built()
    except BuildFailed as exc:
        pytest.skip(f"llama-server could not be built (scripts/build-llama): {exc}")
    charged_here(b.model)
    return b


@pytest.fixture
def cgroup(parent_cgroup: str, layout: CgroupLayout) -> Iterator[ChildCgroup]:
    with ChildCgroup(parent_cgroup, f"llm-waves-{os.getpid()}", LIMIT, layout=layout) as cg:
        yield cg


def cg_file(cg: ChildCgroup, name: str) -> dict[str, int]:
    """A cgroup file of "key value" lines (memory.stat, memory.oom_control), or of one number
    (under the key "")."""
    text = Path(cg.abs_path, name).read_text()
    if len(text.split()) == 1:
        return {"": int(text)}
    return {k: int(v) for k, v in (line.split() for line in text.splitlines())}


def anon_of(cg: ChildCgroup) -> int:
    """The cgroup's anon memory, as the kernel counts it: v1's total_rss, v2's anon."""
    stat = cg_file(cg, "memory.stat")
    return stat.get("total_rss", stat.get("anon", 0))


@dataclass
class Run:
    res: RecordResult
    pid: int  # the llama-server process
    waves: list[Wave]
    anon: list[int]  # the cgroup's anon after each wave the server answered in full
    failcnt: int
    oom_kills: int


def serve_waves(tmp_path: Path, cg: ChildCgroup, b: Built, waves: int, *extra: str) -> Run:
    """Record the server (in ``cg``, with a /health probe) while up to ``waves`` waves are sent
    to it, to its end: killed, or stopped (SIGTERM) after the last wave."""
    port = free_port()
    probes = ProbeSetup([parse_probe(f"http://127.0.0.1:{port}/health")], 0.5, 0.5)
    server = argv(b.binary, b.model, port, *PROMPT_CACHE_ARGS, *extra)
    rec = Recorder(
        str(tmp_path / "waves.trace"),
        Targets(command=in_cgroup(cg, *server), probes=probes),
        duration=240,
    )
    out: dict[str, RecordResult] = {}
    t = threading.Thread(target=lambda: out.setdefault("res", rec.run()))
    t.start()
    try:
        wait_healthy(port, 60, alive=t.is_alive)
        [pid] = map(int, Path(cg.abs_path, "cgroup.procs").read_text().split())
        anon: list[int] = []

        def after(w: Wave) -> bool:
            if w.answered == 4:
                anon.append(anon_of(cg))
            return w.failed == 0

        sent = prompt_waves(port, waves, after)
        if not sent[-1].failed:
            os.kill(pid, signal.SIGTERM)
    finally:
        t.join()
    return Run(
        out["res"],
        pid,
        sent,
        anon,
        failcnt=cg_file(cg, "memory.failcnt")[""],
        oom_kills=cg_file(cg, "memory.oom_control")["oom_kill"],
    )


def killed_in_kernel_log(pid: int) -> list[str]:
    """The kernel log's OOM-kill lines for ``pid`` (dmesg, read here: not the tool's reader)."""
    out = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    return re.findall(rf"Memory cgroup out of memory: Killed process {pid} \(llama-server\).*", out)


def server_verdict(run: Run) -> Verdict:
    [v] = [v for v in run.res.verdicts if v.pid == run.pid]
    return v


def test_prompt_cache_waves_grow_anon_until_a_later_wave_is_oom_killed(
    tmp_path: Path, server: Built, cgroup: ChildCgroup
) -> None:
    run = serve_waves(tmp_path, cgroup, server, WAVES)
    # the server's own answers: whole waves answered, then one it died in
    answered = [w.answered for w in run.waves]
    assert len(run.waves) >= 3 and answered[:-1] == [4] * (len(run.waves) - 1), run.waves
    assert run.waves[-1].failed > 0, run.waves
    # memory.stat: anon rose by tens of MiB a wave (a wave's prompts saved as the next one
    # arrives) and never came back
    steps = [b - a for a, b in pairwise(run.anon)]
    # (a prompt is ~350 tokens of 48 KiB: 16 MiB)
    assert len(steps) >= 2 and all(s > 24 * MiB for s in steps), [a // MiB for a in run.anon]
    # the kernel killed it, in this cgroup
    assert len(killed_in_kernel_log(run.pid)) == 1
    assert run.oom_kills == 1 and run.failcnt > 0
    v = server_verdict(run)
    assert (v.cause, v.confidence, v.comm, v.signal) == (
        "cgroup_oom", "high", "llama-server", "SIGKILL"
    )  # fmt: skip
    assert (v.limit_cgroup, v.limit_bytes) == (cgroup.path, LIMIT)
    assert "still starting" not in v.summary
    # what filled it: anon, the prompt cache's copies of the slots
    assert "was anon memory" in v.summary, v.summary
    # and how it filled: a step a wave, never given back
    assert "never came back down" in v.summary, v.summary
    assert "the processes' own allocations filled it" in v.advice, v.advice
    parts = dict(v.breakdown)
    assert parts["anon"] > max(run.anon) and parts["anon"] > 300 * MiB, v.breakdown


def test_without_the_prompt_cache_the_same_waves_stay_flat(
    tmp_path: Path, server: Built, cgroup: ChildCgroup
) -> None:
    run = serve_waves(tmp_path, cgroup, server, FLAT_WAVES, "--cache-ram", "0")
    assert [w.answered for w in run.waves] == [4] * FLAT_WAVES, run.waves
    assert len(run.anon) == FLAT_WAVES
    assert run.anon[-1] - run.anon[0] < 16 * MiB, [a // MiB for a in run.anon]
    assert run.oom_kills == 0 and run.failcnt == 0
    v = server_verdict(run)
    assert v.cause != "cgroup_oom" and v.comm == "llama-server"
