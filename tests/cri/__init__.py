"""A CRI client for the tests: what a kubelet asks of its container runtime, over the real gRPC
API (``runtime.v1.RuntimeService`` from the vendored ``api.proto``, k8s.io/cri-api v0.25.0).

The proto is compiled at first import into ``.cache/cri-proto/<hash of the proto and of
grpcio-tools' version>/`` (git-ignored, kept between sessions) rather than checked in: generated
code pinned in git would have to match the protobuf runtime installed beside it, and a cache
keyed on both is rebuilt exactly when one changes (a second or two, once). The compile goes to a
temp dir renamed into place, so concurrent sessions never import half a module.

``Kubelet`` does what a kubelet does for one pod: the sandbox with the pod's metadata and its
cgroup parent in the kubelet's cgroupfs layout (``/kubepods/burstable/pod<uid>``), containers
with the ``io.kubernetes.*`` labels and annotations the kubelet sets (kuberuntime's
labels.go), memory limits, start, stop with a grace period, status, and a restart as a new
container with ``attempt + 1``.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

PROTO = Path(__file__).with_name("api.proto")
CACHE = Path(__file__).resolve().parent.parent.parent / ".cache" / "cri-proto"


def _compile() -> Path:
    """The directory holding api_pb2 / api_pb2_grpc for this proto and this grpcio-tools."""
    import grpc_tools
    from grpc_tools import protoc

    version = getattr(grpc_tools, "__version__", "")
    try:
        from importlib.metadata import version as dist_version

        version = dist_version("grpcio-tools")
    except Exception:
        pass
    key = hashlib.sha256(PROTO.read_bytes() + version.encode()).hexdigest()[:16]
    out = CACHE / key
    if (out / "api_pb2_grpc.py").exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=CACHE))
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")  # well-known types
    rc = protoc.main(
        [
            "protoc",
            f"-I{PROTO.parent}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(PROTO),
        ]
    )
    if rc != 0:
        raise RuntimeError(f"protoc failed on {PROTO} ({rc})")
    try:
        os.rename(tmp, out)
    except OSError:  # another session got there first: its copy is the same
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _modules() -> tuple[ModuleType, ModuleType]:
    where = str(_compile())
    if where not in sys.path:
        sys.path.insert(0, where)  # api_pb2_grpc imports api_pb2 by its bare name
    return importlib.import_module("api_pb2"), importlib.import_module("api_pb2_grpc")


pb, pb_grpc = _modules()

# the labels and annotations a kubelet puts on a container (pkg/kubelet/types/labels.go,
# pkg/kubelet/kuberuntime/labels.go)
POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"
RESTART_COUNT = "io.kubernetes.container.restartCount"
TERMINATION_GRACE = "io.kubernetes.pod.terminationGracePeriod"

# CRI's NamespaceMode: NODE is the host's (the tests' pods are hostNetwork ones, so that no CNI
# plugin is needed: they need no network of their own); CONTAINER a namespace per container,
# what the kubelet asks for the pid namespace unless the pod sets shareProcessNamespace
CONTAINER, NODE = 1, 2


CGROUP_ROOT = "/sys/fs/cgroup"


def _hierarchies() -> list[str]:
    """The mounted hierarchies runc puts a pod in (each v1 controller, name=systemd, and the
    v2 "unified" one of a hybrid host); a comounted controller's link counted once."""
    tops = (f"{CGROUP_ROOT}/{d}" for d in sorted(os.listdir(CGROUP_ROOT)))
    return [t for t in tops if os.path.isdir(t) and not os.path.islink(t)]


class Cri:
    """``runtime.v1.RuntimeService`` at a unix socket."""

    def __init__(self, socket: str, timeout_s: float = 60) -> None:
        import grpc

        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.rt = pb_grpc.RuntimeServiceStub(self.channel)
        self.timeout_s = timeout_s

    def call(self, method: str, **request: Any) -> Any:
        req = getattr(pb, f"{method}Request")(**request)
        return getattr(self.rt, method)(req, timeout=self.timeout_s)

    def version(self) -> Any:
        return self.call("Version", version="v1")

    def close(self) -> None:
        self.channel.close()


def pod_cgroup_parent(uid: str, qos: str = "burstable") -> str:
    """The kubelet's cgroupfs layout of a pod's cgroup (pkg/kubelet/cm/pod_container_manager)."""
    return f"/kubepods/{qos}/pod{uid}"


@dataclass
class Kubelet:
    """One pod on a CRI runtime, driven as the kubelet's kuberuntime manager drives it."""

    cri: Cri
    namespace: str
    name: str
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_dir: str = ""
    sandbox_id: str = ""
    attempts: dict[str, int] = field(default_factory=dict)  # container name -> last attempt

    @property
    def cgroup_parent(self) -> str:
        return pod_cgroup_parent(self.uid)

    def sandbox_config(self) -> Any:
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(
                name=self.name, namespace=self.namespace, uid=self.uid, attempt=0
            ),
            # (no hostname: the kubelet sets none for a hostNetwork pod, whose UTS namespace
            # is the node's; runc refuses one without a private UTS namespace)
            log_directory=self.log_dir,
            labels={POD_NAME: self.name, POD_NAMESPACE: self.namespace, POD_UID: self.uid},
            annotations={"kubernetes.io/config.source": "api"},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=self.cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=NODE, pid=CONTAINER)
                ),
            ),
        )

    def make_pod_cgroup(self, memory_limit: int = 0) -> None:
        """What the kubelet's pod container manager does before RunPodSandbox: the pod's
        memory cgroup with the pod-level limit (the sum of its containers' limits, when each
        has one; none: unlimited). runc makes the pod's other hierarchies (cpuset's with the
        parent's cpus and mems) as it puts the sandbox in them."""
        path = f"{CGROUP_ROOT}/memory{self.cgroup_parent}"
        os.makedirs(path, exist_ok=True)
        if memory_limit:
            for knob in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
                if os.path.exists(f"{path}/{knob}"):
                    Path(f"{path}/{knob}").write_text(str(memory_limit))

    def remove_pod_cgroup(self) -> None:
        """What the kubelet does once a pod is gone: its cgroups removed (and the QoS ones the
        tests made, once empty)."""
        for top in _hierarchies():
            for rel in (self.cgroup_parent, "/kubepods/burstable", "/kubepods"):
                try:
                    os.rmdir(top + rel)
                except OSError:
                    break  # not empty (another pod of this session) or not there

    def run_sandbox(self) -> str:
        self.sandbox_id = self.cri.call(
            "RunPodSandbox", config=self.sandbox_config()
        ).pod_sandbox_id
        return str(self.sandbox_id)

    def create(
        self,
        container: str,
        image: str,
        command: list[str],
        memory_limit: int = 0,
        grace_s: int = 30,
    ) -> str:
        """A new container for ``container``: attempt 0 the first time, then one more each
        time (the kubelet's restart: a new container, the old one left exited)."""
        attempt = self.attempts.get(container, -1) + 1
        self.attempts[container] = attempt
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=container, attempt=attempt),
            image=pb.ImageSpec(image=image),
            command=command,
            log_path=f"{container}/{attempt}.log",
            labels={
                POD_NAME: self.name,
                POD_NAMESPACE: self.namespace,
                POD_UID: self.uid,
                CONTAINER_NAME: container,
            },
            annotations={
                RESTART_COUNT: str(attempt),
                TERMINATION_GRACE: str(grace_s),
                "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                "io.kubernetes.container.terminationMessagePolicy": "File",
            },
            linux=pb.LinuxContainerConfig(
                resources=pb.LinuxContainerResources(
                    memory_limit_in_bytes=memory_limit,
                    # no swap beyond the limit, as the kubelet sets it on cgroup v1
                    memory_swap_limit_in_bytes=memory_limit,
                ),
                security_context=pb.LinuxContainerSecurityContext(
                    namespace_options=pb.NamespaceOption(network=NODE, pid=CONTAINER)
                ),
            ),
        )
        r = self.cri.call(
            "CreateContainer",
            pod_sandbox_id=self.sandbox_id,
            config=config,
            sandbox_config=self.sandbox_config(),
        )
        return str(r.container_id)

    def start(self, container_id: str) -> None:
        self.cri.call("StartContainer", container_id=container_id)

    def stop(self, container_id: str, timeout_s: int) -> None:
        """StopContainer: SIGTERM (the image's stop signal), SIGKILL after ``timeout_s``."""
        self.cri.call("StopContainer", container_id=container_id, timeout=timeout_s)

    def status(self, container_id: str) -> Any:
        return self.cri.call("ContainerStatus", container_id=container_id).status

    def remove(self) -> None:
        """StopPodSandbox and RemovePodSandbox (which removes the pod's containers too)."""
        if self.sandbox_id:
            self.cri.call("StopPodSandbox", pod_sandbox_id=self.sandbox_id)
            self.cri.call("RemovePodSandbox", pod_sandbox_id=self.sandbox_id)
