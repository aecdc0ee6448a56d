"""tracer/runtimes/cri.py's wire decoding against messages encoded by protoc's own code for the
vendored CRI api.proto (tests/cri): what containerd would send, field for field."""

from __future__ import annotations

import json

import pytest

from tests.cri import pb
from tracer.runtimes.cri import (
    CONTAINER_NAME,
    POD_NAME,
    POD_NAMESPACE,
    RESTART_COUNT,
    cri_endpoints,
    decode,
    encode_bool,
    encode_string,
    info_from_status,
    list_ids,
)

CID = "ab" * 32


def status(**changes: object) -> bytes:
    st = pb.ContainerStatus(
        id=CID,
        metadata=pb.ContainerMetadata(name="hog", attempt=2),
        state=pb.CONTAINER_EXITED,
        started_at=1_700_000_000_000_000_000,
        finished_at=1_700_000_001_000_000_000,
        exit_code=137,
        image=pb.ImageSpec(image="docker.io/library/busybox:1"),
        reason="OOMKilled",
        labels={POD_NAME: "llm-0", POD_NAMESPACE: "serving", CONTAINER_NAME: "hog"},
        annotations={RESTART_COUNT: "2"},
    )
    for k, v in changes.items():
        setattr(st, k, v)
    return bytes(pb.ContainerStatusResponse(status=st).SerializeToString())


def test_an_oom_killed_container_of_a_pod_reads_as_containerd_says_it() -> None:
    info = info_from_status(status(), "containerd")
    assert (info.id, info.name, info.pod, info.namespace) == (CID, "hog", "llm-0", "serving")
    assert (info.state, info.exit_code, info.oom_killed, info.restart_count) == (
        "exited",
        137,
        True,
        2,
    )
    assert (info.started_ns, info.finished_ns) == (
        1_700_000_000_000_000_000,
        1_700_000_001_000_000_000,
    )
    assert info.image == "docker.io/library/busybox:1"
    assert (info.pid, info.cgroup_path) == (0, None)


def test_a_graceful_exit_is_no_oom_claim_and_a_negative_code_survives() -> None:
    info = info_from_status(status(reason="Completed", exit_code=-1), "containerd")
    assert (info.oom_killed, info.exit_code) == (False, -1)


def test_a_running_container_gives_its_pid_and_cgroup_from_the_verbose_info() -> None:
    st = pb.ContainerStatus(
        id=CID, metadata=pb.ContainerMetadata(name="web", attempt=0), state=pb.CONTAINER_RUNNING
    )
    doc = {
        "pid": 4242,
        "runtimeSpec": {"linux": {"cgroupsPath": f"/kubepods/burstable/podX/{CID}"}},
    }
    raw = pb.ContainerStatusResponse(status=st, info={"info": json.dumps(doc)})
    info = info_from_status(raw.SerializeToString(), "containerd", proc_root="/nonexistent")
    assert (info.state, info.pid, info.exit_code, info.oom_killed) == ("running", 4242, None, None)
    assert info.cgroup_path == info.cgroup_when_started == f"/kubepods/burstable/podX/{CID}"
    # no restartCount annotation (not set by a kubelet): the attempt is the count
    assert info.restart_count == 0 and info.name == "web" and info.pod is None


def test_list_containers_and_requests_round_trip_through_protoc_code() -> None:
    resp = pb.ListContainersResponse(
        containers=[
            pb.Container(
                id=CID,
                metadata=pb.ContainerMetadata(name="hog", attempt=1),
                created_at=5,
                labels={POD_NAME: "llm-0", POD_NAMESPACE: "serving", CONTAINER_NAME: "hog"},
            )
        ]
    )
    assert list_ids(resp.SerializeToString()) == [(CID, "serving", "llm-0", "hog", 5)]
    req = pb.ContainerStatusRequest()
    req.ParseFromString(encode_string(1, CID) + encode_bool(2, True))
    assert (req.container_id, req.verbose) == (CID, True)


def test_malformed_bytes_are_a_value_error_not_a_crash() -> None:
    with pytest.raises(ValueError):
        decode(b"\x0a\x05ab")  # a 5-byte string with 2 bytes
    with pytest.raises(ValueError):
        decode(b"\x08\xff")  # a varint that never ends


def test_the_endpoint_is_crictls_variable_else_the_sockets_that_exist() -> None:
    assert cri_endpoints({"CONTAINER_RUNTIME_ENDPOINT": "unix:///x/c.sock"}) == ["/x/c.sock"]
    assert cri_endpoints({"CONTAINER_RUNTIME_ENDPOINT": "/x/c.sock"}) == ["/x/c.sock"]
