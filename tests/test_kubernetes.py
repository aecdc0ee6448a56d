"""Tier 1: a pod's cgroup from NAMESPACE/NAME, on fixture trees shaped like kubelet nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracer.errors import UsageError
from tracer.runtimes.kubernetes import resolve_pod
from tracer.sources.cgroupfs import CgroupLayout, CgroupResolver

UID = "0d6c5b1e-3f2a-4c1b-9a7e-5b2c8d9e1f00"


def node(tmp_path: Path, systemd: bool) -> tuple[str, CgroupResolver]:
    logs = tmp_path / "var-log-pods"
    (logs / f"inference_llm-0_{UID}").mkdir(parents=True)
    (logs / f"inference_other_{UID[:-1]}1").mkdir()
    mem = tmp_path / "memory"
    if systemd:
        pod = (
            mem
            / "kubepods.slice"
            / "kubepods-burstable.slice"
            / f"kubepods-burstable-pod{UID.replace('-', '_')}.slice"
        )
        (pod / ("cri-containerd-" + "ab" * 32 + ".scope")).mkdir(parents=True)
    else:
        pod = mem / "kubepods" / "burstable" / f"pod{UID}"
        (pod / ("ab" * 32)).mkdir(parents=True)
    return str(logs), CgroupResolver(CgroupLayout("v1", str(mem), 1, None))


@pytest.mark.parametrize("systemd", [True, False])
def test_pod_cgroup_for_both_drivers(tmp_path: Path, systemd: bool) -> None:
    logs, mem = node(tmp_path, systemd)
    path = resolve_pod("inference/llm-0", mem, logs)
    if systemd:
        assert path == (
            "/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{UID.replace('-', '_')}.slice"
        )
    else:
        assert path == f"/kubepods/burstable/pod{UID}"


def test_unknown_pod_and_bad_spec(tmp_path: Path) -> None:
    logs, mem = node(tmp_path, True)
    with pytest.raises(UsageError, match="no such pod on this node"):
        resolve_pod("inference/nope", mem, logs)
    with pytest.raises(UsageError, match="NAMESPACE/NAME"):
        resolve_pod("llm-0", mem, logs)
