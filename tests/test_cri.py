"""tracer/runtimes/cri.py's wire decoding against messages encoded by protoc's own code for the
vendored CRI api.proto (tests/cri): what containerd would send, field for field."""

from __future__ import annotations

import json

import pytest

from tests.cri import pb
from tracer.agent.journal import restart_entry, verdict_entry
from tracer.agent.otel import log_record
from tracer.analysis.findings import Restart, Verdict
from tracer.analysis.units import label_parts
from tracer.pipeline.follow import Follower, RuntimeIdentity
from tracer.runtimes.base import ContainerInfo, Runtime
from tracer.runtimes.cri import (
    CONTAINER_NAME,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    RESTART_COUNT,
    CriRuntime,
    cri_endpoints,
    decode,
    encode_bool,
    encode_string,
    info_from_status,
    list_ids,
)

CID = "ab" * 32
UID = "6f1c2d3e-0000-4000-8000-0123456789ab"


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
        labels={
            POD_NAME: "llm-0",
            POD_NAMESPACE: "serving",
            POD_UID: UID,
            CONTAINER_NAME: "hog",
        },
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
    assert info.pod_uid == UID
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
    assert info.pod_uid is None  # no pod uid label: none, not ""


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


# -- the CRI identity in the agent's lines: from a unit a CRI runtime named, and only from it -----

IDENTITY_KEYS = ("k8s.pod.uid", "k8s.container.restart_count", "container.id",
                 "container.runtime.name")  # fmt: skip
POD_PATH = f"/kubepods/burstable/pod{UID}/{CID}"


class _Cri(CriRuntime):
    """containerd's answer to ContainerStatus, as protoc's code encodes it; no socket."""

    def __init__(self, *responses: bytes) -> None:
        super().__init__("/nonexistent/containerd.sock", proc_root="/nonexistent")
        self.runtime_name = self.name = "containerd"
        self.responses = {info_from_status(r, "containerd").id: r for r in responses}

    def _call(self, method: str, request: bytes) -> bytes:
        assert method == "ContainerStatus", method
        return self.responses[decode(request)[1][0].decode()]


class _Docker(Runtime):
    """A Docker that knows the same container, pod labels and all (dockershim): not CRI."""

    name = "docker"

    def available(self) -> bool:
        return True

    def find(self, name_or_id: str) -> ContainerInfo | None:
        return ContainerInfo("docker", CID, "hog", None, 0, 2, "no", None, "", "exited", True,
                             pod="llm-0", namespace="serving")  # fmt: skip


def _verdict(unit: str) -> Verdict:
    return Verdict(
        ts=10, pid=7, comm="hog", cause="cgroup_oom", confidence="high", summary="OOM-killed",
        advice="", evidence=(), unit=unit, exit_code=137,
    )  # fmt: skip


def _lines(follower: Follower, label: str) -> tuple[dict[str, object], ...]:
    """The log line's attributes, the journal's verdict and restart entries, for ``label``."""
    identity = follower.identity(label)
    v = _verdict(label)
    r = Restart(ts=20, unit=label, old_pid=7, new_pid=8, downtime_ns=1, cause="cgroup_oom")
    return (
        log_record(v, 0, "i1", identity)["attributes"],
        verdict_entry(v, "boot", 0, "i1", label_parts(label), identity),
        restart_entry(r, "boot", 0, identity),
    )


def _next_attempt() -> bytes:
    """The kubelet's next attempt of "hog": a new container, attempt and count 3."""
    response = pb.ContainerStatusResponse()
    response.ParseFromString(status(id="cd" * 32))
    response.status.metadata.attempt = 3
    response.status.annotations[RESTART_COUNT] = "3"
    return bytes(response.SerializeToString())


NEXT = _next_attempt()


def test_a_unit_a_cri_runtime_named_carries_its_pod_uid_container_id_runtime_and_count() -> None:
    f = Follower([], None, lambda _cid: None, runtimes=[_Cri(status())])
    unit = f.name(1, POD_PATH, 0)
    assert unit is not None
    assert (unit.kind, unit.pod, unit.name) == ("containerd", "serving/llm-0", "hog")
    label = "pod serving/llm-0 container hog"
    assert f.identity(label) == RuntimeIdentity("containerd", CID, UID, 2)
    attrs, journal, restart = _lines(f, label)
    want = {
        "k8s.pod.uid": UID,
        "k8s.container.restart_count": 2,
        "container.id": CID,
        "container.runtime.name": "containerd",
    }
    assert {k: attrs[k] for k in IDENTITY_KEYS} == want
    assert attrs["k8s.pod.name"] == "llm-0" and attrs["k8s.namespace.name"] == "serving"
    assert journal["attributes"] == want and restart["attributes"] == want
    # the next attempt: a new container under the same label, whose identity replaces it
    f = Follower([], None, lambda _cid: None, runtimes=[_Cri(status(), NEXT)])
    f.name(1, POD_PATH, 0)
    f.name(2, f"/kubepods/burstable/pod{UID}/{'cd' * 32}", 0, created=True)
    assert f.identity(label) == RuntimeIdentity("containerd", "cd" * 32, UID, 3)


def test_a_unit_named_any_other_way_has_none_of_the_cri_attributes() -> None:
    """Docker naming the same pod's container, a pod named from its cgroup alone (no runtime
    answers), a CRI container without the pod uid label: the keys are absent, never ""."""
    docker = Follower([], None, lambda _cid: None, runtimes=[_Docker()])
    assert docker.name(1, POD_PATH, 0) is not None
    nobody = Follower([], None, lambda _cid: None, runtimes=[])
    named = nobody.name(1, POD_PATH, 0)
    assert named is not None and named.kind == "k8s"
    for f, label in (
        (docker, "pod serving/llm-0 container hog"),
        (nobody, f"k8s {CID[:12]}"),
        (nobody, f"pod {UID[:8]} container {CID[:12]}"),
    ):
        assert f.identity(label) is None
        attrs, journal, restart = _lines(f, label)
        assert not set(IDENTITY_KEYS) & set(attrs), (label, attrs)
        assert "attributes" not in journal and "attributes" not in restart
    bare = pb.ContainerStatus(
        id=CID,
        metadata=pb.ContainerMetadata(name="hog", attempt=0),
        labels={POD_NAME: "p", POD_NAMESPACE: "n", CONTAINER_NAME: "hog"},
    )
    no_uid = Follower(
        [],
        None,
        lambda _cid: None,
        runtimes=[_Cri(pb.ContainerStatusResponse(status=bare).SerializeToString())],
    )
    assert no_uid.name(1, POD_PATH, 0) is not None
    attrs = _lines(no_uid, "pod n/p container hog")[0]
    assert "k8s.pod.uid" not in attrs
    assert (attrs["container.id"], attrs["k8s.container.restart_count"]) == (CID, 0)
