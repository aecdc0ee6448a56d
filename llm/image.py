"""A podman image of llama-server, built here from the host's files (no registry is reachable):
FROM scratch, the binary scripts/build-llama made and the shared libraries it links (ldd: the C
and C++ runtimes, libgomp), nothing else. The model is not in it: it is mounted from the host,
as weights are."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

BINARY = "/usr/local/bin/llama-server"

CONTAINERFILE = f"""\
FROM scratch
COPY rootfs /
ENTRYPOINT ["{BINARY}"]
"""


def libraries(binary: Path) -> list[Path]:
    """The absolute paths the dynamic loader resolves for ``binary`` (its ldd lines)."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    found = re.findall(r"(?:=> )?(/\S+) \(0x", out)
    return [Path(p) for p in found]


def context(folder: Path, binary: Path) -> Path:
    """The build context: the Containerfile and rootfs/ (the binary and its libraries, each at
    the path the loader looks for it, symlinks resolved)."""
    root = folder / "rootfs"
    for lib in libraries(binary):
        dest = root / lib.relative_to("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(lib.resolve(), dest)
    dest = root / BINARY.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(binary, dest)
    (root / "tmp").mkdir(mode=0o1777)
    (folder / "Containerfile").write_text(CONTAINERFILE)
    return folder


def build(tag: str, binary: Path, folder: Path, env: dict[str, str], cwd: Path) -> None:
    """``podman build`` the image as ``tag`` (no network: FROM scratch)."""
    ctx = context(folder, binary)
    r = subprocess.run(
        [
            "podman",
            "build",
            "--network=none",
            "-t",
            tag,
            "-f",
            str(ctx / "Containerfile"),
            str(ctx),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )
    if r.returncode != 0:
        raise AssertionError(f"podman build failed: {r.stderr[-3000:]}")
