"""A private containerd for tests, with its CRI plugin: the node runtime a kubelet drives.

Its root, state, socket and config live under a temp dir, and it is stopped after. How it runs
on these machines (Debian's containerd 1.6): the CRI plugin on with the ``cgroupfs`` driver
(runc's ``SystemdCgroup = false``; no systemd here: a pod's containers land in
``/kubepods/<qos>/pod<uid>/<id>`` of each v1 hierarchy, as under a kubelet with
``cgroupDriver: cgroupfs``), the ``native`` snapshotter (no overlayfs inside this VM's root, as
dockerd's ``vfs``), no CNI plugin (the tests' sandboxes use the host's network namespace:
CRI's NamespaceMode NODE, a hostNetwork pod, which needs none), the stream server on a
loopback port the kernel picks, ``restrict_oom_score_adj`` (see the config), and
``--config`` pointing at our own file so that a host's /etc/containerd/config.toml cannot
change it.

Images are imported, not pulled (no registry): ``import_image`` writes an OCI archive of
tests/dockerd.py's busybox rootfs and runs ``ctr images import`` into the ``k8s.io``
namespace, the one the CRI plugin serves; the same image is the sandbox ("pause") image, its
default command a ``sleep`` that lasts as long as the pod.

Use it through the ``containerd_node`` fixture (tests/conftest.py, one daemon per session).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.dockerd import BUSYBOX, _die_with_parent, _unmount_under, busybox_rootfs

IMAGE = "docker.io/library/wr-cri-busybox:test"  # CRI resolves bare names into docker.io


class ContainerdFailed(Exception):
    """containerd did not start; the message says why (its own last log lines)."""


def missing() -> str | None:
    """What this machine lacks to run a private containerd with CRI, or None."""
    if os.geteuid() != 0:
        return "needs root to start containerd"
    for tool, pkg in (("containerd", "containerd"), ("ctr", "containerd"), ("runc", "runc")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup installs {pkg})"
    if shutil.which("containerd-shim-runc-v2") is None:
        return "containerd-shim-runc-v2 is not installed (scripts/setup installs containerd)"
    if not os.path.exists(BUSYBOX):
        return f"{BUSYBOX} is missing (scripts/setup installs busybox-static)"
    try:
        import grpc  # noqa: F401
        import grpc_tools  # noqa: F401
    except ImportError:
        return "grpcio/grpcio-tools are not installed (scripts/setup installs the dev extra)"
    return None


def config_text(root: Path) -> str:
    socket = root / "containerd.sock"
    return f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # the sandbox asks for oom_score_adj -998 (the kubelet's for a pod's infrastructure); lowering
  # it needs CAP_SYS_RESOURCE, which a container or a sandboxed CI host may lack (runc fails:
  # "failed to update /proc/self/oom_score_adj: Permission denied"): not below our own then
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{root / "cni-bin"}"
    conf_dir = "{root / "cni-conf"}"
"""


@dataclass
class ContainerdNode:
    root: Path
    socket: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    image: str = ""

    def ctr(self, *args: str, input: bytes | None = None, check: bool = True) -> str:
        r = subprocess.run(
            ["ctr", "-a", self.socket, "-n", "k8s.io", *args],
            input=input,
            capture_output=True,
            timeout=120,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)}: {r.returncode}: {r.stderr.decode()}")
        return r.stdout.decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            # its containers first: the CRI plugin leaves them (and their shims) running when
            # containerd stops, as a node's runtime restart must
            from tests.cri import Cri

            cri = Cri(self.socket, timeout_s=30)
            try:
                for sb in cri.call("ListPodSandbox").items:
                    cri.call("StopPodSandbox", pod_sandbox_id=sb.id)
                    cri.call("RemovePodSandbox", pod_sandbox_id=sb.id)
            except Exception:  # a daemon in trouble: stop it anyway
                pass
            finally:
                cri.close()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        _unmount_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


def _why(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    for key in ("level=fatal", "level=error"):
        found = [ln for ln in lines if key in ln]
        if found:
            return found[-1]
    return " | ".join(lines[-4:]) or "(empty log)"


def start_containerd(root: Path | None = None, timeout_s: float = 60) -> ContainerdNode:
    """Start a private containerd under ``root`` (a new temp dir by default) and wait until its
    CRI service answers. Raises ``ContainerdFailed`` with the daemon's reason."""
    root = root or Path(tempfile.mkdtemp(prefix="wr-ctrd-", dir="/tmp"))  # sockets: <108 bytes
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.toml"
    config.write_text(config_text(root))
    log_path = root / "containerd.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["containerd", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    node = ContainerdNode(root, str(root / "containerd.sock"), proc, log_path)
    deadline = time.monotonic() + timeout_s
    from tests.cri import Cri

    while True:
        if proc.poll() is not None:
            why = _why(log_path)
            node.stop()
            raise ContainerdFailed(f"containerd exited with {proc.returncode}: {why}")
        if os.path.exists(node.socket):
            cri = Cri(node.socket, timeout_s=2)
            try:
                cri.version()
                return node
            except Exception:
                pass
            finally:
                cri.close()
        if time.monotonic() > deadline:
            why = _why(log_path)
            node.stop()
            raise ContainerdFailed(f"containerd's CRI did not answer in {timeout_s:g} s: {why}")
        time.sleep(0.2)


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def oci_archive(ref: str, rootfs: bytes, cmd: list[str]) -> bytes:
    """An OCI image layout archive of one layer (``rootfs``, a tar) named ``ref``."""
    layer = gzip.compress(rootfs, mtime=0)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        layer_digest = _blob(tar, layer)
        config = json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Cmd": cmd, "Env": ["PATH=/bin"]},
                "rootfs": {
                    "type": "layers",
                    "diff_ids": [f"sha256:{hashlib.sha256(rootfs).hexdigest()}"],
                },
            }
        ).encode()
        config_digest = _blob(tar, config)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config_digest,
                    "size": len(config),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": layer_digest,
                        "size": len(layer),
                    }
                ],
            }
        ).encode()
        manifest_digest = _blob(tar, manifest)
        for name, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            (
                "index.json",
                json.dumps(
                    {
                        "schemaVersion": 2,
                        "manifests": [
                            {
                                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                "digest": manifest_digest,
                                "size": len(manifest),
                                "annotations": {"io.containerd.image.name": ref},
                            }
                        ],
                    }
                ).encode(),
            ),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def import_image(node: ContainerdNode, ref: str = IMAGE) -> str:
    """The busybox rootfs as ``ref`` in the CRI's namespace (also the sandbox image: its
    default command sleeps for as long as the pod lives)."""
    archive = oci_archive(ref, busybox_rootfs(), ["sleep", "2147483647"])
    node.ctr("images", "import", "--snapshotter", "native", "-", input=archive)
    node.image = ref
    return ref
