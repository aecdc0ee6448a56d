"""Shared fixtures and the tier markers' skip rules.

Tiers: pure tests need nothing; ``bpfobj`` needs the compiled object and bpftool; ``root``
needs root, BTF and a memory cgroup controller; ``lab`` runs only inside the lab VM that
scripts/lab-vm boots (its init sets WHYRESTART_LAB=1), ``lab_systemd`` only inside its systemd
VM (systemd is PID 1 there). A test that cannot run here is skipped with the reason, and
pytest -ra lists every skip in the summary.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import containerd, dockerd
from tests.containerd import ContainerdNode
from tests.dockerd import DockerEngine
from tests.mt import build as mt_build
from tests.unprivileged import unprivileged_whyrestart
from tracer.bpf import hooks
from tracer.errors import KernelUnsupported, UsageError
from tracer.sources.cgroupfs import CgroupLayout, own_memory_cgroup


def _root_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (tier 3: real kernel)"
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        return "kernel has no BTF"
    if not os.path.exists(hooks.object_path()):
        return f"BPF object not built ({hooks.object_path()}): run scripts/setup"
    return None


def _bpfobj_reason() -> str | None:
    if not os.path.exists(hooks.object_path()):
        return f"BPF object not built ({hooks.object_path()}): run scripts/setup"
    if shutil.which("bpftool") is None and not os.path.exists("/usr/sbin/bpftool"):
        return "bpftool not installed"
    return None


def _lab_reason() -> str | None:
    if os.environ.get("WHYRESTART_LAB") != "1":
        return "runs inside the lab VM only (scripts/lab-vm)"
    return _root_reason()


def _lab_systemd_reason() -> str | None:
    if os.environ.get("WHYRESTART_LAB_SYSTEMD") != "1" or not os.path.isdir("/run/systemd/system"):
        return "runs inside the lab's systemd VM only (scripts/lab-vm --systemd)"
    return _lab_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root, bpfobj, lab = _root_reason(), _bpfobj_reason(), _lab_reason()
    lab_systemd = _lab_systemd_reason()
    for item in items:
        if root and "root" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=root))
        if bpfobj and "bpfobj" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=bpfobj))
        # the marker, not keywords: every test under tests/lab/ has "lab" among its keywords
        if lab and item.get_closest_marker("lab"):
            item.add_marker(pytest.mark.skip(reason=lab))
        if lab_systemd and item.get_closest_marker("lab_systemd"):
            item.add_marker(pytest.mark.skip(reason=lab_systemd))


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    """A private Docker Engine for this test session (tests/dockerd.py), with the busybox image
    imported: ``docker_engine.env``/``.host`` for clients, ``.docker()``/``.compose()`` to drive
    it. Root tests only; stopped and removed at the end of the session."""
    if _root_reason() is not None:
        pytest.skip(_root_reason() or "")
    lacks = dockerd.missing()
    if lacks is not None:
        pytest.fail(lacks)  # scripts/setup installs all of it: missing is a bug, not a skip
    try:
        engine = dockerd.start_dockerd()
    except dockerd.DockerdFailed as exc:
        pytest.fail(f"the test dockerd did not start: {exc}")
    try:
        dockerd.import_busybox(engine)
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def containerd_node() -> Iterator[ContainerdNode]:
    """A private containerd with its CRI plugin for this test session (tests/containerd.py),
    the busybox image imported (also its sandbox image): drive it with tests/cri's ``Kubelet``
    at ``containerd_node.socket``. Root tests only; stopped and removed at the end."""
    if _root_reason() is not None:
        pytest.skip(_root_reason() or "")
    lacks = containerd.missing()
    if lacks is not None:
        pytest.fail(lacks)  # scripts/setup installs all of it: missing is a bug, not a skip
    try:
        node = containerd.start_containerd()
    except containerd.ContainerdFailed as exc:
        pytest.fail(f"the test containerd did not start: {exc}")
    try:
        containerd.import_image(node)
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def production_wheel() -> Path:
    """scripts/build's wheel (root tests only: building it compiles the BPF objects). The libbpf
    source and build are cached in .cache/libbpf, so only the first session pays for them."""
    return _script_result("build", timeout=1500)


@pytest.fixture(scope="session")
def bare_target() -> Path:
    """A Debian 12 root with python3, venv and pip and nothing of a checkout's
    (scripts/bare-target: debootstrap once, cached in .cache/bare). Root tests only."""
    return _script_result("bare-target", timeout=1800)


def _script_result(name: str, timeout: float) -> Path:
    """Runs scripts/NAME (root tests only) and returns the path its last output line names."""
    if _root_reason() is not None:
        pytest.skip(_root_reason() or "")
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run(
        [str(root / "scripts" / name)], capture_output=True, text=True, timeout=timeout
    )
    if r.returncode != 0:
        pytest.fail(f"scripts/{name} failed: {r.stderr[-3000:]}")
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def mtwork(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/mt/mtwork.c, the multi-threaded workload of the exactness tests and of the
    multi-threaded twins, built here."""
    if mt_build.gcc() is None:
        pytest.skip("no C compiler (gcc) to build tests/mt")
    return mt_build.mtwork(tmp_path_factory.mktemp("mt-bin"))


@pytest.fixture(scope="session")
def mtwork_static(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same program linked statically, for container images without a C library (mounted
    read-only into the container: podman/docker -v PATH:/mtwork:ro)."""
    if mt_build.gcc() is None:
        pytest.skip("no C compiler (gcc) to build tests/mt")
    return mt_build.mtwork(tmp_path_factory.mktemp("mt-static"), static=True)


@pytest.fixture(scope="session")
def unprivileged() -> Iterator[tuple[list[str], dict[str, str]]]:
    """(argv, env) running whyrestart as any user can, wherever the checkout is
    (tests/unprivileged.py)."""
    with unprivileged_whyrestart() as it:
        yield it


@pytest.fixture(scope="session")
def layout() -> CgroupLayout:
    """This host's cgroup layout; skips where no memory controller is mounted."""
    lay = CgroupLayout.from_system()
    if lay.memory_root is None:
        pytest.skip("no memory cgroup controller mounted")
    return lay


@pytest.fixture
def parent_cgroup(layout: CgroupLayout) -> Iterator[str]:
    """The memory cgroup this test process is in, where tests make their child cgroups."""
    yield own_memory_cgroup(layout=layout)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process sleeping a minute, killed after the test."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def system() -> tuple[CgroupLayout, str]:
    """The real layout and a parent cgroup where children can be made, or a skip."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create memory cgroups")
    layout = CgroupLayout.from_system()
    if layout.memory_root is None:
        pytest.skip(f"no memory controller mounted (cgroup mode {layout.mode})")
    try:
        own = own_memory_cgroup(layout=layout)
    except (KernelUnsupported, UsageError) as exc:
        pytest.skip(f"cannot find our memory cgroup: {exc}")
    parent = own
    if layout.memory_version == 2 and own != "/":
        # v2: our own cgroup holds us, so it may not enable memory for children ("no
        # internal processes"); its parent already has it enabled (we have memory files).
        parent = posixpath.dirname(own)
    if not os.access(layout.memory_root, os.W_OK):
        pytest.skip("memory hierarchy is read-only here")
    return layout, parent
