"""Tier 3 (root): the container image (deploy/Containerfile) builds and runs as the DaemonSet
runs it.

No registry is reachable here, so its base is made locally: the bare Debian 12 root of
scripts/bare-target imported into podman. The image is built by `scripts/build image` (the
README's command), from dist/ (its wheel and wheelhouse: no network in the build). Then:

- with what a DaemonSet grants, `whyrestart doctor` passes in it, with the bundled libbpf;
- `whyrestart agent` runs in it as deploy/daemonset.yaml runs it: the podman flags are derived
  from that file (hostPID, hostNetwork, privileged, read-only root, its memory limit, every
  hostPath and emptyDir mount, the container's args), so the two cannot drift; a real cgroup
  OOM kill on the host (a hog in a child memory cgroup) reaches its /metrics;
- bad input gives the checkout's messages: without privileges, the capability error naming
  the fix; with /sys/kernel/btf hidden, the BTF message; on a kernel reporting an old release,
  the kernel message.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.containerd import ContainerdNode
from tests.test_agent_root import free_port, until
from tests.test_wheel_root import assert_names_the_old_kernel
from tests.workloads import HOG, in_cgroup
from tracer.sources.cgroupfs import CgroupLayout, ChildCgroup, own_memory_cgroup

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024

# runc, cgroupfs and the ulimits this kind of host allows (as tests/test_podman_root.py runs it)
CONF = ROOT / "tests" / "data" / "runtimes" / "containers.conf"
ENV = {**os.environ, "CONTAINERS_CONF": str(CONF)}


def _podman(*args: str, timeout: float = 900, stdin: bytes | None = None) -> str:
    r = subprocess.run(
        ["podman", *args], input=stdin, capture_output=True, timeout=timeout, env=ENV
    )
    assert r.returncode == 0, (args, r.stderr.decode(errors="replace")[-3000:])
    return r.stdout.decode(errors="replace")


@pytest.fixture(scope="module")
def image(bare_target: Path) -> Iterator[str]:
    """The image, built once for this module on a base imported from the bare target, by the
    README's command (`IMAGE_BASE=... scripts/build image`: the wheel, the wheelhouse, then
    deploy/Containerfile with podman), under a tag of this run's own."""
    uniq = f"{os.getpid()}"
    base = f"localhost/whyrestart-test-base:{uniq}"
    tag = f"localhost/whyrestart-test-image:{uniq}"
    try:
        tar = subprocess.run(
            ["tar", "-C", str(bare_target), "--exclude=./tmp/*", "-c", "."],
            capture_output=True,
            check=True,
            timeout=300,
        ).stdout
        _podman("import", "-", base, stdin=tar)
        r = subprocess.run(
            [str(ROOT / "scripts" / "build"), "image"],
            capture_output=True,
            text=True,
            timeout=1500,
            env={**ENV, "IMAGE_BASE": base, "IMAGE_TAG": tag},
        )
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"[build] image: {tag}\n" in r.stderr, r.stderr[-3000:]
        wheel = Path(r.stdout.strip().splitlines()[-1])
        assert (wheel.parent / "wheelhouse" / wheel.name).exists()  # what the image took
        yield tag
    finally:
        subprocess.run(
            ["podman", "rmi", "-f", tag, base], capture_output=True, timeout=300, env=ENV
        )


def _doctor(image: str, *flags: str) -> tuple[int, dict[str, Any]]:
    r = subprocess.run(
        ["podman", "run", "--rm", "--network=none", *flags, image, "doctor", "--json"],
        capture_output=True,
        timeout=300,
        env=ENV,
    )
    return r.returncode, json.loads(r.stdout)


LS = "ls /tmp/wheelhouse; ls /opt/whyrestart/bin/whyrestart"


def _layers(image: str) -> list[str]:
    return list(json.loads(_podman("image", "inspect", image))[0]["RootFS"]["Layers"])


def test_the_image_is_its_base_and_one_layer_the_venv(image: str) -> None:
    """Multi-stage: the wheelhouse the builder stage installed from is in no layer of the image
    (a COPY and an rm in one stage would leave it in the COPY's layer)."""
    base = image.replace("whyrestart-test-image", "whyrestart-test-base")
    assert _layers(image)[:-1] == _layers(base)
    assert len(_layers(image)) == len(_layers(base)) + 1
    r = subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            "--network=none",
            "--entrypoint=sh",
            image,
            "-c",
            LS,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert r.stdout == "/opt/whyrestart/bin/whyrestart\n", r
    assert "/tmp/wheelhouse" in r.stderr


def test_image_builds_on_a_local_base_and_doctor_passes_in_it(image: str) -> None:
    rc, doc = _doctor(
        image,
        "--privileged",
        "--pid=host",
        "--cgroupns=host",
        "-v",
        "/sys/fs/cgroup:/sys/fs/cgroup",
    )
    checks = {c["name"]: c for c in doc["checks"]}
    assert rc == 0 and doc["ok"] is True, [c for c in doc["checks"] if not c["ok"]]
    assert checks["libbpf"]["detail"].startswith("libbpf 1."), checks["libbpf"]
    assert ", bundled (/opt/whyrestart/" in checks["libbpf"]["detail"], checks["libbpf"]
    assert checks["hook:exit"]["ok"] is True


def test_the_image_reads_a_nodes_cri_socket(image: str, containerd_node: ContainerdNode) -> None:
    """grpcio is in the image (the `cri` extra): whyrestart's CRI client in it asks this
    session's private containerd (tests/containerd.py), its socket mounted where a node has it,
    and is answered by name (without grpcio it would say "grpcio is not installed")."""
    code = (
        "import grpc; from tracer.runtimes.cri import CriRuntime; "
        "rt = CriRuntime('/run/containerd/containerd.sock'); "
        "print(rt.available(), rt.name, rt.last_error)"
    )
    r = subprocess.run(
        ["podman", "run", "--rm", "--network=none",
         "-v", f"{containerd_node.socket}:/run/containerd/containerd.sock",
         "--entrypoint=python3", image, "-c", code],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "True containerd None\n", (r.stdout, r.stderr[-3000:])


# -- the DaemonSet, run by podman ----------------------------------------------------------------


def daemonset_container() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the pod spec, its one container) of deploy/daemonset.yaml's DaemonSet."""
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "daemonset.yaml").read_text()))
    (ds,) = [d for d in docs if d and d.get("kind") == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


def _bytes(quantity: str) -> int:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", quantity)
    assert m is not None, f"unhandled Kubernetes quantity {quantity!r}"
    return int(m.group(1)) * {None: 1, "Ki": 1024, "Mi": MiB, "Gi": 1024 * MiB}[m.group(2)]


def podman_run_args(state: Path, port: int) -> tuple[list[str], list[str]]:
    """(podman run flags, the container's args) for what deploy/daemonset.yaml grants. Two
    things differ, both because several test runs share this host: the state dir's hostPath is
    a test directory, and --metrics-addr keeps its address but takes a free port."""
    spec, c = daemonset_container()
    flags: list[str] = []
    if spec.get("hostPID"):
        flags.append("--pid=host")
    if spec.get("hostNetwork"):
        flags.append("--network=host")
    # Kubernetes gives containers no cgroup namespace on a cgroup v1 node (this one); podman
    # would on v2, so say it
    flags.append("--cgroupns=host")
    sc = c.get("securityContext", {})
    if sc.get("privileged"):
        flags.append("--privileged")
    for cap in sc.get("capabilities", {}).get("add", []):
        flags.append(f"--cap-add={cap}")
    if sc.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    limit = c.get("resources", {}).get("limits", {}).get("memory")
    if limit:
        flags.append(f"--memory={_bytes(limit)}")
    volumes = {v["name"]: v for v in spec["volumes"]}
    for m in c["volumeMounts"]:
        v = volumes[m["name"]]
        target = m["mountPath"]
        if "hostPath" in v:
            host = v["hostPath"]["path"]
            if host == "/var/lib/whyrestart":
                host = str(state)
            elif v["hostPath"].get("type") == "DirectoryOrCreate":
                os.makedirs(host, exist_ok=True)  # (as the kubelet makes it)
            ro = ":ro" if m.get("readOnly") else ""
            flags += ["-v", f"{host}:{target}{ro}"]
        elif "emptyDir" in v:
            size = v["emptyDir"].get("sizeLimit")
            flags += ["--tmpfs", f"{target}:size={_bytes(size)}" if size else target]
        else:
            raise AssertionError(f"volume kind this test does not translate: {v}")
    args = list(c["args"])
    addrs = [i for i, a in enumerate(args) if a.startswith("--metrics-addr=")]
    assert len(addrs) == 1, args
    host = args[addrs[0]].split("=", 1)[1].rsplit(":", 1)[0]
    args[addrs[0]] = f"--metrics-addr={host}:{port}"
    return flags, args


def _metrics(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return None


def _sample(text: str | None, name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` whose labels are exactly ``labels``."""
    for family in text_string_to_metric_families(text or ""):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def test_the_agent_in_the_image_as_the_daemonset_runs_it_serves_a_host_oom_kill(
    image: str, tmp_path: Path
) -> None:
    layout = CgroupLayout.from_system()
    if layout.memory_root is None:
        pytest.skip("no memory cgroup controller mounted")
    state = tmp_path / "state"
    state.mkdir()
    port = free_port()
    flags, args = podman_run_args(state, port)
    assert args[0] == "agent"
    name = f"whyrestart-test-agent-{os.getpid()}-{tmp_path.name}".lower()
    out = (tmp_path / "agent.out").open("w+b")
    err = (tmp_path / "agent.err").open("w+b")
    proc = subprocess.Popen(
        ["podman", "run", "--rm", "--name", name, *flags, image, *args],
        stdout=out,
        stderr=err,
        env=ENV,
    )

    def ready() -> bool:
        err.seek(0)
        assert proc.poll() is None, err.read().decode(errors="replace")[-3000:]
        return b"ready: watching" in err.read()

    # a systemd-style cgroup name: the agent names the unit by it, so the series is this test's
    # alone (other runs' kills on this host land in other series)
    cgroup = f"wr-image-{os.getpid()}-{tmp_path.name}.service".lower()
    unit = f"systemd {cgroup}"
    try:
        until(ready, timeout=120)
        assert _metrics(port) is not None
        with ChildCgroup(own_memory_cgroup(layout=layout), cgroup, 64 * MiB, layout=layout) as cg:
            hog = subprocess.Popen(in_cgroup(cg, sys.executable, "-c", HOG))
            assert hog.wait(timeout=120) == -signal.SIGKILL
        none = {"namespace": "", "pod": "", "container": ""}
        series = {"unit": unit, **none, "limit_scope": "own"}
        try:
            until(lambda: _sample(_metrics(port), "whyrestart_oom_kills_total", **series), 60)
        except AssertionError:
            kills = [x for x in (_metrics(port) or "").splitlines() if "oom_kills_total{" in x]
            raise AssertionError(f"no {series} in {kills}") from None
        assert _sample(_metrics(port), "whyrestart_oom_kills_total", **series) == 1.0
        exits = {"unit": unit, **none, "cause": "cgroup_oom", "confidence": "high"}
        assert _sample(_metrics(port), "whyrestart_exits_total", **exits) == 1.0
        # its verdict line on stdout (the cluster's log pipeline takes these) names the hog
        out.seek(0)
        lines = [json.loads(x) for x in out.read().splitlines() if x.startswith(b"{")]
        mine = [x for x in lines if x["attributes"].get("process.pid") == hog.pid]
        assert len(mine) == 1, mine
        assert mine[0]["attributes"]["whyrestart.cause"] == "cgroup_oom"
        assert mine[0]["attributes"]["whyrestart.unit"] == unit
        # the state dir (a hostPath) holds what `kubectl exec ... whyrestart history` reads
        assert any(state.iterdir())
    finally:
        subprocess.run(["podman", "stop", "-t", "20", name], capture_output=True, env=ENV)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()
        err.close()
    assert proc.returncode == 0, (tmp_path / "agent.err").read_text()[-3000:]


# -- bad input: the checkout's messages, from the image --------------------------------------------


def _agent_once(image: str, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            "--network=none",
            "--pid=host",
            *flags,
            image,
            "agent",
            "--state-dir=/tmp/state",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )


def test_without_privileges_doctor_and_agent_name_the_capabilities(
    image: str, tmp_path: Path
) -> None:
    """A container that is not privileged (podman's default capabilities and seccomp profile):
    the BPF load is refused, and both say so with the fix, as from a checkout."""
    rc, doc = _doctor(image, "--pid=host")
    checks = {c["name"]: c for c in doc["checks"]}
    assert rc == 4 and doc["ok"] is False
    assert checks["hooks"]["ok"] is False
    assert "EPERM" in checks["hooks"]["detail"]
    assert "CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE" in checks["hooks"]["fix"]
    r = _agent_once(image, tmp_path)
    assert r.returncode == 5, r.stderr[-3000:]
    first, fix = r.stderr.splitlines()[:2]
    assert first.startswith("whyrestart: loading ") and first.endswith(
        "whyrestart.bpf.o: EPERM (Operation not permitted)"
    ), r.stderr
    assert fix == "  fix: run as root (or with CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE)"


def test_a_host_without_btf_gives_the_btf_message(image: str, tmp_path: Path) -> None:
    """/sys/kernel/btf hidden by an empty directory, as on a kernel built without BTF (the
    DaemonSet mounts the host's; a host without it has none to mount)."""
    empty = tmp_path / "btf"
    empty.mkdir()
    hide = ["--privileged", "-v", f"{empty}:/sys/kernel/btf:ro"]
    rc, doc = _doctor(image, "--pid=host", *hide)
    checks = {c["name"]: c for c in doc["checks"]}
    assert rc == 4 and doc["ok"] is False
    assert checks["btf"] == {
        **checks["btf"],
        "ok": False,
        "detail": "/sys/kernel/btf/vmlinux missing",
    }
    assert "CONFIG_DEBUG_INFO_BTF=y" in checks["btf"]["fix"]
    r = _agent_once(image, tmp_path, *hide)
    assert r.returncode == 4, r.stderr[-3000:]
    assert r.stderr.splitlines()[:2] == [
        "whyrestart: this kernel has no BTF (/sys/kernel/btf/vmlinux is missing)",
        "  fix: use a kernel built with CONFIG_DEBUG_INFO_BTF=y (the default on Debian, Ubuntu,"
        " Fedora and RHEL since 2021)",
    ]


def test_a_kernel_too_old_gives_the_kernel_message(image: str) -> None:
    """This kernel made to report an old release (the UNAME26 personality, set by the image's
    own setarch before it runs whyrestart), with every privilege the DaemonSet grants: doctor
    and the agent refuse it by name, with the fix, as from a checkout (tests/test_wheel_root.py
    compares the two there)."""
    old = ["--privileged", "--pid=host", "--entrypoint=setarch", image, "--uname-2.6"]
    r = subprocess.run(
        ["podman", "run", "--rm", "--network=none", *old, "whyrestart", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    doc = json.loads(r.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    assert r.returncode == 4 and doc["ok"] is False
    kernel = checks["kernel"]
    assert_names_the_old_kernel(kernel)
    r = subprocess.run(
        ["podman", "run", "--rm", "--network=none", *old, "whyrestart", "agent",
         "--state-dir=/tmp/state"],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert r.returncode == 4, r.stderr[-3000:]
    assert r.stderr.splitlines()[:2] == [
        f"whyrestart: {kernel['detail']}",
        f"  fix: {kernel['fix']}",
    ]
