"""Real podman for root tests: a busybox image built here (no registry is reachable), with
runc, cgroupfs and file events (tests/data/runtimes/containers.conf)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
BUSYBOX = "/bin/busybox"  # Debian's busybox-static

# conmon writes a file named "oom" into its working directory (inherited from `podman start`)
# when its container is OOM-killed: run podman from a scratch directory, not the checkout
_CWD = tempfile.mkdtemp(prefix="wr-test-podman-")


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, check=check, timeout=120, cwd=_CWD
    )


def run_detached(name: str, *args: str) -> None:
    """``podman run -d --name NAME --network=none ARGS...`` (the tests' containers need no
    network)."""
    podman("run", "-d", "--name", name, "--network=none", *args)


def create_oom_loop(name: str, restarts: int, image: str) -> None:
    """A container (not started) whose dd asks for 100 MB under --memory=64m: OOM-killed at
    each start, restarted by podman up to ``restarts`` times. ``image`` needs dd."""
    podman(
        "create",
        "--name",
        name,
        "--network=none",
        "--memory=64m",
        f"--restart=on-failure:{restarts}",
        image,
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=100M",
        "count=1",
    )


@contextmanager
def busybox_image(
    root: Path,
    image: str,
    applets: tuple[str, ...],
    prepare: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Import ``image`` (a busybox rootfs with ``applets`` linked in /bin, built under the empty
    folder ``root``) with CONTAINERS_CONF set to this host's config; remove it and restore
    CONTAINERS_CONF after; ``prepare`` adds files to the rootfs first. Skips where podman,
    runc or busybox-static is missing."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("podman and runc are not installed (scripts/setup installs them)")
    if not os.path.exists(BUSYBOX):
        pytest.skip("busybox-static is not installed (scripts/setup installs it)")
    # runc, cgroupfs and file events: what works on this kind of host (DEVELOPERS.md)
    old = os.environ.get("CONTAINERS_CONF")
    os.environ["CONTAINERS_CONF"] = str(DATA / "runtimes" / "containers.conf")
    (root / "bin").mkdir()
    (root / "tmp").mkdir(mode=0o1777)
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    for cmd in applets:
        (root / "bin" / cmd).symlink_to("busybox")
    if prepare is not None:  # more files in the rootfs
        prepare()
    tar = root.parent / f"{root.name}.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True)
    podman("import", str(tar), image)
    try:
        yield
    finally:
        podman("rmi", "-f", image, check=False)
        if old is None:
            os.environ.pop("CONTAINERS_CONF", None)
        else:
            os.environ["CONTAINERS_CONF"] = old


def run_failing_cuinit(image: str, program: str) -> subprocess.CompletedProcess[str]:
    """One start of an image made with ``tests.gpu.build.cuda_rootfs``: its ``/program`` calls
    cuInit, which the stand-in fails (CUDA_ERROR_NO_DEVICE: the program exits 3)."""
    return podman(
        "run",
        "--rm",
        "--network=none",
        "-e",
        "LD_LIBRARY_PATH=/cuda",
        "-e",
        "FAKE_CUDA_INIT_RESULT=100",
        image,
        f"/{program}",
        "noinit",
        check=False,
    )
