"""Tier 1 (needs gcc): the NVML sampler against a stand-in libnvidia-ml.so.1 (tests/gpu/
fake_nvml.c) loaded by the real nvidia-ml-py through LD_LIBRARY_PATH.

pynvml dlopens "libnvidia-ml.so.1" once per process and keeps it, and the dynamic loader reads
LD_LIBRARY_PATH only at start-up, so every case runs in a fresh Python process and prints the
events it got as trace records (JSON lines) for the test to check.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu import build
from tracer.events import GpuLost, GpuProcessSample, GpuSample, GpuXid, from_record

pytestmark = pytest.mark.skipif(build.gcc() is None, reason="no C compiler (gcc) to build NVML")

GiB = 1 << 30
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("nvml")
    build.nvml(d)
    return d


def run(script: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """Run ``script`` (with ``nvml`` = tracer.gpu.nvml and ``out(events)`` in scope) in a
    fresh interpreter; the records it printed."""
    prelude = (
        "import json, os, sys, time\n"
        "from tracer.gpu import nvml\n"
        "def out(evs):\n"
        "    for e in evs: print(json.dumps(e.to_record()))\n"
        "def note(**kw): print(json.dumps({'t': 'note', **kw}))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", prelude + script],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def events(records: list[dict[str, Any]]) -> list[Any]:
    return [from_record(r) for r in records if r["t"] != "note"]


def notes(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["t"] == "note"]


def test_memory_processes_one_xid_then_gpu_lost(libdir: Path, tmp_path: Path) -> None:
    trigger, ack = tmp_path / "trigger", tmp_path / "ack"
    recs = run(
        f"""
s = nvml.open_nvml()
note(describe=s.describe())
s.set_pids(frozenset({{4242}}))
out(s.sample())
out(s.wait_events(20))  # nothing yet: the trigger file is missing
open({str(trigger)!r}, "w").close()
out(s.wait_events(5000))
note(acked=os.path.exists({str(ack)!r}))
out(s.sample())
out(s.sample())  # lost once is said once
s.close()
""",
        {
            "LD_LIBRARY_PATH": str(libdir),
            "FAKE_NVML_PROCS": "4242:1073741824,777:2147483648",
            "FAKE_NVML_GRAPHICS_PROCS": "4242:5000",
            "FAKE_NVML_XID": "79",
            "FAKE_NVML_TRIGGER": str(trigger),
            "FAKE_NVML_ACK": str(ack),
            "FAKE_NVML_LOST_AFTER_XID": "1",
        },
    )
    [describe, acked] = notes(recs)
    assert describe["describe"] == {
        "nvml": "present",
        "devices": [{"index": 0, "uuid": "GPU-fake-0000", "name": "Fake GPU 0"}],
        "interval_ms": 1000,
        "xid_events": "nvml",
    }
    assert acked == {"t": "note", "acked": True}
    evs = events(recs)
    assert [type(e) for e in evs] == [
        GpuSample,
        GpuProcessSample,
        GpuProcessSample,
        GpuXid,
        GpuLost,
    ]
    sample, compute, graphics, xid, lost = evs
    assert (sample.total_bytes, sample.used_bytes, sample.reserved_bytes, sample.free_bytes) == (
        80 * GiB,
        60 * GiB,
        512 << 20,
        80 * GiB - 60 * GiB - (512 << 20),
    )
    # only the watched pid, from both process lists (pid 777 is someone else's)
    assert (compute.pid, compute.used_bytes, compute.kind) == (4242, GiB, "compute")
    assert (graphics.pid, graphics.used_bytes, graphics.kind) == (4242, 5000, "graphics")
    assert (xid.xid, xid.device, xid.device_index, xid.source, xid.pid) == (
        79,
        "GPU-fake-0000",
        0,
        "nvml",
        None,
    )
    assert (lost.reason, lost.device_index, lost.source) == ("gpu_is_lost", 0, "nvml")
    assert sample.ts <= compute.ts <= xid.ts <= lost.ts


def test_every_process_and_many_of_them(libdir: Path) -> None:
    # 40 processes: more than pynvml's first guess would hold without the size protocol
    procs = ",".join(f"{1000 + i}:{(i + 1) << 20}" for i in range(40))
    recs = run(
        "s = nvml.open_nvml()\ns.set_pids(None)\nout(s.sample())\ns.set_pids(frozenset())\n"
        "out(s.sample())\ns.close()\n",
        {"LD_LIBRARY_PATH": str(libdir), "FAKE_NVML_PROCS": procs},
    )
    evs = events(recs)
    first = evs[:41]
    assert isinstance(first[0], GpuSample)
    assert [(p.pid, p.used_bytes) for p in first[1:]] == [
        (1000 + i, (i + 1) << 20) for i in range(40)
    ]
    # an empty watched set: the device only
    assert [type(e) for e in evs[41:]] == [GpuSample]


def test_an_old_driver_without_memory_info_v2(libdir: Path) -> None:
    recs = run(
        "s = nvml.open_nvml()\nout(s.sample())\nout(s.sample())\ns.close()\n",
        {"LD_LIBRARY_PATH": str(libdir), "FAKE_NVML_NO_V2": "1"},
    )
    samples = events(recs)
    assert len(samples) == 2
    assert all(isinstance(s, GpuSample) and s.reserved_bytes is None for s in samples)
    assert samples[0].used_bytes == 60 * GiB


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"FAKE_NVML_INIT_RESULT": "9"}, "the NVIDIA kernel driver is not loaded"),
        ({"FAKE_NVML_DEVICES": "0"}, "no GPU: NVML sees 0 devices"),
    ],
)
def test_absent_is_said_not_raised(libdir: Path, env: dict[str, str], reason: str) -> None:
    recs = run(
        "s = nvml.open_nvml()\nnote(describe=s.describe(), available=s.available)\n"
        "s.start()\nout(s.drain())\ns.close()\n",
        {"LD_LIBRARY_PATH": str(libdir), **env},
    )
    assert notes(recs) == [
        {"t": "note", "describe": {"nvml": "absent", "reason": reason}, "available": False}
    ]
    assert events(recs) == []


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has a real NVML"
)
def test_no_library_at_all(tmp_path: Path) -> None:
    recs = run("note(describe=nvml.open_nvml().describe())\n", {"LD_LIBRARY_PATH": str(tmp_path)})
    assert notes(recs)[0]["describe"] == {
        "nvml": "absent",
        "reason": "libnvidia-ml.so.1 not found: no NVIDIA driver installed",
    }


def test_library_path_seam_without_ld_library_path(libdir: Path) -> None:
    lib = str(libdir / "libnvidia-ml.so.1")
    recs = run(
        f"s = nvml.open_nvml(library={lib!r})\nout(s.sample())\ns.close()\n",
        {"LD_LIBRARY_PATH": ""},
    )
    [sample] = events(recs)
    assert isinstance(sample, GpuSample) and sample.uuid == "GPU-fake-0000"


def test_background_thread_samples_and_catches_the_xid(libdir: Path) -> None:
    # the Xid is due at once (no trigger file); the loop ends as soon as both kinds arrived
    recs = run(
        """
s = nvml.open_nvml(interval_s=0.05)
s.start()
got = []
for _ in range(1000):
    got += s.drain()
    kinds = {e.KIND for e in got}
    if {"gpu_sample", "gpu_xid"} <= kinds:
        break
    time.sleep(0.01)
s.close()
out(got)
""",
        {"LD_LIBRARY_PATH": str(libdir), "FAKE_NVML_XID": "43"},
    )
    evs = events(recs)
    assert [e.xid for e in evs if isinstance(e, GpuXid)] == [43]
    assert any(isinstance(e, GpuSample) for e in evs)


def test_a_sampler_thread_that_dies_says_so(libdir: Path) -> None:
    recs = run(
        """
s = nvml.open_nvml(interval_s=0.05)
def broken():
    raise ZeroDivisionError("boom")
s.sample = broken
s.start()
got = []
for _ in range(1000):
    got += s.drain()
    if got:
        break
    time.sleep(0.01)
s.close()
out(got)
""",
        {"LD_LIBRARY_PATH": str(libdir)},
    )
    [err] = events(recs)
    assert (err.source, err.target) == ("nvml", "sampler")
    assert err.message == "stopped: ZeroDivisionError('boom')"
