"""A Kubernetes node's container runtime, asked through its CRI socket as the kubelet asks it.

This module owns the CRI client: ``CriRuntime`` (``runtime.v1.RuntimeService``'s ``Version``,
``ListContainers``, ``ContainerStatus`` and ``ListPodSandbox`` over gRPC on the runtime's unix
socket) and the pure part, ``decode`` (protobuf wire format → nested dicts, by field number) with
``info_from_status`` (one ``ContainerStatusResponse`` → ``ContainerInfo``), tested without a
runtime.

Why by field number, not generated code: the three messages read here are a few fields of
k8s.io/cri-api's v1 ``api.proto`` (numbers below, stable since CRI v1), and generated code
would tie the recorder to one protobuf runtime's version; gRPC itself (``grpcio``, the ``cri``
extra) carries the bytes. Without grpcio, or without a CRI socket, this runtime is
unavailable and says why; pods are then named from their cgroups (tracer.analysis.units) and
the kubelet's files (tracer.runtimes.kubernetes).

What the kubelet puts on each container and is read back here (pkg/kubelet/kuberuntime/
labels.go): labels ``io.kubernetes.pod.{name,namespace,uid}`` (the uid is ``pod_uid``) and
``io.kubernetes.container.name``; annotation ``io.kubernetes.container.restartCount`` (the
kubelet's restart count: a restart is a new container with ``metadata.attempt`` + 1, the same
number). The runtime's own record of the last exit: ``exit_code``, ``reason`` (containerd says
``OOMKilled`` from the cgroup's OOM counter, kubernetes#140718: a child's OOM kill makes a later
graceful exit "OOMKilled" too; recorded as its claim, not trusted) and ``finished_at``.

Which socket: ``CONTAINER_RUNTIME_ENDPOINT`` (crictl's variable) when set, else the usual
sockets of containerd and CRI-O that exist here. A containerd without its CRI plugin (Docker's:
``disabled_plugins = ["cri"]``) does not answer ``Version`` and is left out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from tracer.runtimes.base import ContainerInfo, LookupFailed, Runtime, cgroup_path_of_pid

__all__ = ["CriRuntime", "cri_endpoints", "decode", "info_from_status", "sandboxes"]

DEFAULT_SOCKETS = ("/run/containerd/containerd.sock", "/run/crio/crio.sock")
SERVICE = "/runtime.v1.RuntimeService/"

POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"
RESTART_COUNT = "io.kubernetes.container.restartCount"

# api.proto field numbers of what is read (runtime.v1, k8s.io/cri-api v0.25.0)
_STATUS = 1  # ContainerStatusResponse.status
_INFO = 2  # ContainerStatusResponse.info (verbose: map "info" -> JSON with pid, runtimeSpec)
# ContainerStatus
_ID, _METADATA, _STATE, _STARTED, _FINISHED, _EXIT, _IMAGE, _REASON = 1, 2, 3, 5, 6, 7, 8, 10
_LABELS, _ANNOTATIONS = 12, 13
_NAME, _ATTEMPT = 1, 2  # ContainerMetadata
# ListContainersResponse.containers (repeated Container): id 1, metadata 3, labels 8
_CONTAINERS, _C_METADATA, _C_LABELS, _C_CREATED = 1, 3, 8, 7
STATES = {0: "created", 1: "running", 2: "exited", 3: "unknown"}  # ContainerState


# ---------------------------------------------------------------------------------------------
# protobuf wire format (pure)

Fields = dict[int, list[Any]]  # field number -> values in order (int, or bytes when delimited)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def decode(buf: bytes) -> Fields:
    """One message's fields: varints as ints, length-delimited as bytes (decode them again
    for a nested message); fixed 32/64-bit fields kept as ints. ValueError when malformed."""
    out: Fields = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > len(buf):
                raise ValueError("truncated field")
            value, i = buf[i : i + size], i + size
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            if i + n > len(buf):
                raise ValueError("truncated field")
            value, i = int.from_bytes(buf[i : i + n], "little"), i + n
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def encode_string(number: int, text: str) -> bytes:
    data = text.encode()
    return _key(number, 2) + _put_varint(len(data)) + data


def encode_bool(number: int, value: bool) -> bytes:
    return _key(number, 0) + _put_varint(int(value)) if value else b""


def _key(number: int, wire: int) -> bytes:
    return _put_varint(number << 3 | wire)


def _put_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _str(f: Fields, n: int) -> str:
    v = f.get(n)
    return v[-1].decode(errors="replace") if v and isinstance(v[-1], bytes) else ""


def _int(f: Fields, n: int) -> int:
    v = f.get(n)
    return v[-1] if v and isinstance(v[-1], int) else 0


def _signed(value: int) -> int:
    """An int32/int64 field's value: negatives are sign-extended 64-bit varints."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _msg(f: Fields, n: int) -> Fields:
    v = f.get(n)
    return decode(v[-1]) if v and isinstance(v[-1], bytes) else {}


def _map(f: Fields, n: int) -> dict[str, str]:
    """A ``map<string,string>``: repeated entries of key 1, value 2."""
    out = {}
    for entry in f.get(n, []):
        if isinstance(entry, bytes):
            e = decode(entry)
            out[_str(e, 1)] = _str(e, 2)
    return out


# ---------------------------------------------------------------------------------------------
# CRI messages → ContainerInfo (pure)


def info_from_status(response: bytes, runtime: str, proc_root: str = "/proc") -> ContainerInfo:
    """A ``ContainerStatusResponse`` (verbose or not) as a ``ContainerInfo``. The main pid and
    the cgroup path come from the verbose ``info`` JSON (containerd's ``pid`` and
    ``runtimeSpec.linux.cgroupsPath``) when it is there."""
    top = decode(response)
    st = _msg(top, _STATUS)
    meta = _msg(st, _METADATA)
    labels, annotations = _map(st, _LABELS), _map(st, _ANNOTATIONS)
    state = STATES.get(_int(st, _STATE), "unknown")
    attempt = _int(meta, _ATTEMPT)
    try:
        restarts = int(annotations.get(RESTART_COUNT, attempt))
    except ValueError:
        restarts = attempt
    pid, spec_path = 0, None
    verbose = _map(top, _INFO).get("info")
    if verbose:
        try:
            doc = json.loads(verbose)
            pid = int(doc.get("pid") or 0)
            spec_path = doc.get("runtimeSpec", {}).get("linux", {}).get("cgroupsPath") or None
        except (ValueError, TypeError, AttributeError):
            pass
    exited = state == "exited"
    started, finished = _int(st, _STARTED), _int(st, _FINISHED)
    image = _str(_msg(st, _IMAGE), 1)
    return ContainerInfo(
        runtime=runtime,
        id=_str(st, _ID),
        name=labels.get(CONTAINER_NAME) or _str(meta, _NAME),
        cgroup_path=spec_path if state == "running" else None,
        pid=pid if state == "running" else 0,
        restart_count=restarts,
        restart_policy="",  # the pod's restartPolicy is the kubelet's, not the runtime's
        healthcheck=None,  # probes are the kubelet's too
        image=image,
        state=state,
        oom_killed=(_str(st, _REASON) == "OOMKilled") if exited else None,
        pod=labels.get(POD_NAME) or None,
        namespace=labels.get(POD_NAMESPACE) or None,
        exit_code=_signed(_int(st, _EXIT)) if exited else None,
        started_ns=started or None,
        finished_ns=finished if exited and finished else None,
        cgroup_when_started=spec_path,
        pod_uid=labels.get(POD_UID) or None,
    )


def list_ids(response: bytes) -> list[tuple[str, str, str, str, int]]:
    """``ListContainersResponse`` → (id, namespace, pod, container name, created_at) each."""
    out = []
    for raw in decode(response).get(_CONTAINERS, []):
        if not isinstance(raw, bytes):
            continue
        c = decode(raw)
        labels = _map(c, _C_LABELS)
        name = labels.get(CONTAINER_NAME) or _str(_msg(c, _C_METADATA), _NAME)
        created = _int(c, _C_CREATED)
        out.append(
            (_str(c, _ID), labels.get(POD_NAMESPACE, ""), labels.get(POD_NAME, ""), name, created)
        )
    return out


def sandboxes(response: bytes) -> list[tuple[str, str, str, int]]:
    """``ListPodSandboxResponse`` → (namespace, name, uid, created_at) of each pod sandbox
    (``PodSandbox.metadata``: name 1, uid 2, namespace 3; ``created_at`` 4)."""
    out = []
    for raw in decode(response).get(1, []):
        if isinstance(raw, bytes):
            sb = decode(raw)
            meta = _msg(sb, 2)
            out.append((_str(meta, 3), _str(meta, 1), _str(meta, 2), _int(sb, 4)))
    return out


def cri_endpoints(env: dict[str, str] | None = None, given: str | None = None) -> list[str]:
    """Socket paths to ask: ``given`` (--runtime-endpoint), else ``CONTAINER_RUNTIME_ENDPOINT``
    (either unix:// or a path) when set, else the usual ones that exist."""
    env = dict(os.environ) if env is None else env
    given = given or env.get("CONTAINER_RUNTIME_ENDPOINT", "")
    if given:
        return [given.removeprefix("unix://")]
    return [p for p in DEFAULT_SOCKETS if os.path.exists(p)]


# ---------------------------------------------------------------------------------------------
# the client


class CriRuntime(Runtime):
    """A CRI runtime at a unix socket. Named after what ``Version`` says it is ("containerd",
    "cri-o"); ``available`` is False, with the reason, without grpcio or an answer."""

    name = "cri"

    def __init__(self, socket: str, timeout_s: float = 2.0, proc_root: str = "/proc") -> None:
        super().__init__()
        self.socket = socket
        self.timeout_s = timeout_s
        self.proc_root = proc_root
        self.runtime_name = "cri"
        self._channel: Any = None

    def _call(self, method: str, request: bytes) -> bytes:
        if self._channel is None:
            try:
                import grpc
            except ImportError as exc:
                raise LookupFailed(
                    f"cri {self.socket}: grpcio is not installed (pip install 'whyrestart[cri]')"
                ) from exc
            self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        call: Callable[..., bytes] = self._channel.unary_unary(SERVICE + method)
        try:
            return call(request, timeout=self.timeout_s)
        except Exception as exc:  # grpc.RpcError: its details() are the runtime's words
            details = getattr(exc, "details", None)
            why = details() if callable(details) else str(exc)
            raise LookupFailed(f"cri {self.socket}: {method}: {why}") from exc

    def available(self) -> bool:
        if not os.path.exists(self.socket):
            self._fail(f"cri: no socket at {self.socket}", quiet=True)
            return False
        try:
            resp = decode(self._call("Version", encode_string(1, "v1")))
        except (LookupFailed, ValueError) as exc:
            self._fail(str(exc), quiet=True)
            return False
        self.runtime_name = _str(resp, 2).lower() or "cri"
        self.name = self.runtime_name
        self._ok()
        return True

    def by_id(self, container_id: str) -> ContainerInfo | None:
        try:
            if len(container_id) < 64:
                container_id = self._full_id(container_id) or container_id
            raw = self._call(
                "ContainerStatus", encode_string(1, container_id) + encode_bool(2, True)
            )
            info = info_from_status(raw, self.runtime_name)
        except (LookupFailed, ValueError) as exc:
            self._fail(str(exc))
            return None
        self._ok()
        if info.pid and cgroup_path_of_pid(info.pid, self.proc_root) is not None:
            return self._found(info, self.proc_root)
        return info

    def pod_uid(self, namespace: str, name: str) -> str | None:
        """The uid of pod NAMESPACE/NAME from its newest sandbox (the kubelet keeps one per pod,
        a new one when it recreates it: the same uid), None when the runtime has none."""
        try:
            listed = sandboxes(self._call("ListPodSandbox", b""))
        except (LookupFailed, ValueError) as exc:
            self._fail(str(exc))
            return None
        mine = [sb for sb in listed if (sb[0], sb[1]) == (namespace, name) and sb[2]]
        self._ok()
        return max(mine, key=lambda sb: sb[3])[2] if mine else None

    def _full_id(self, prefix: str) -> str | None:
        ids = [c[0] for c in list_ids(self._call("ListContainers", b"")) if c[0].startswith(prefix)]
        return ids[0] if len(ids) == 1 else None

    def find(self, name_or_id: str) -> ContainerInfo | None:
        """By id (or unique prefix), ``NAMESPACE/POD/CONTAINER``, ``POD/CONTAINER`` or a
        container name that one pod has: its latest container (the kubelet's newest attempt)."""
        try:
            listed = list_ids(self._call("ListContainers", b""))
        except (LookupFailed, ValueError) as exc:
            self._fail(str(exc))
            return None
        parts = name_or_id.split("/")
        by_name = [
            c
            for c in listed
            if (len(parts) == 3 and (c[1], c[2], c[3]) == tuple(parts))
            or (len(parts) == 2 and (c[2], c[3]) == tuple(parts))
            or (len(parts) == 1 and c[3] == name_or_id)
        ]
        pods = {(c[1], c[2]) for c in by_name}
        if len(pods) > 1:
            self._fail(f"{self.runtime_name}: {name_or_id!r} is a container of several pods")
            return None
        if by_name:
            return self.by_id(max(by_name, key=lambda c: c[4])[0])
        ids = [c[0] for c in listed if c[0].startswith(name_or_id)]
        if len(ids) == 1:
            return self.by_id(ids[0])
        self._fail(f"{self.runtime_name}: no container {name_or_id!r}", quiet=True)
        return None
