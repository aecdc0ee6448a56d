"""A private Docker Engine for tests: its own dockerd (and the containerd it manages), socket,
data and state under a temp dir, stopped after; a busybox image imported locally (no registry).

How it runs on these machines (Debian's docker.io): ``--iptables=false --bridge=none`` (no
network set-up to leak into the host's firewall or interfaces), the ``cgroupfs`` cgroup driver
(no systemd here; containers land in ``/docker/<id>`` of each v1 hierarchy), ``vfs`` storage
(no overlayfs inside this VM's root), and an empty ``--config-file`` so that a host's
/etc/docker/daemon.json cannot change it. Containers use ``network_mode: none`` / ``--network
none``.

Use it through the ``docker_engine`` fixture (tests/conftest.py, one daemon per session), or
``start_dockerd()`` for a daemon of your own; ``engine.env`` is the environment a Docker
client needs (``DOCKER_HOST``), ``engine.docker(...)`` and ``engine.compose(...)`` run the CLIs
against it, ``engine.image`` is the imported busybox image.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracer.runtimes.docker import DockerRuntime

BUSYBOX = "/bin/busybox"  # Debian's busybox-static


class DockerdFailed(Exception):
    """dockerd did not start; the message says why (its own last log lines)."""


def docker_cli() -> str | None:
    """The docker.io client (a newer CLI elsewhere on PATH also works: it negotiates down)."""
    return "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else shutil.which("docker")


def missing() -> str | None:
    """What this machine lacks to run a private dockerd, or None."""
    if os.geteuid() != 0:
        return "needs root to start dockerd"
    for tool, pkg in (("dockerd", "docker.io"), ("docker-compose", "docker-compose")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup installs {pkg})"
    if not os.path.exists(BUSYBOX):
        return f"{BUSYBOX} is missing (scripts/setup installs busybox-static)"
    return None


@dataclass
class DockerEngine:
    root: Path
    socket: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    image: str = ""
    _runtime: DockerRuntime | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    @property
    def runtime(self) -> DockerRuntime:
        if self._runtime is None:
            self._runtime = DockerRuntime(self.socket)
        return self._runtime

    def docker(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        cli = docker_cli()
        assert cli is not None
        r = subprocess.run(
            [cli, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: {r.returncode}: {r.stderr.strip()}")
        return r.stdout

    def compose(
        self, project_dir: Path, project: str, *args: str, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """docker-compose (1.29) against this daemon, for the project in project_dir."""
        r = subprocess.run(
            ["docker-compose", "-p", project, *args],
            cwd=project_dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise AssertionError(
                f"docker-compose {' '.join(args)}: {r.returncode}: {r.stderr.strip()}"
            )
        return r

    def inspect(self, name: str) -> dict[str, Any]:
        obj = json.loads(self.docker("inspect", "--type", "container", name))
        assert isinstance(obj, list) and len(obj) == 1
        return dict(obj[0])

    def unique(self, prefix: str) -> str:
        """A container/project name no other test run uses (tests run concurrently)."""
        return f"{prefix}{os.getpid()}{uuid.uuid4().hex[:6]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            # containers first (dockerd stops them on SIGTERM too, but says nothing if it can't)
            ids = self.docker("ps", "-aq", check=False, timeout=60).split()
            if ids:
                self.docker("rm", "-f", *ids, check=False, timeout=120)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        # vfs layers are plain directories; the exec root holds containerd's state
        _unmount_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    """Lazily unmount what dockerd left mounted under root (a daemon that failed to start
    leaves its data root bind-mounted on itself), deepest first, so that it can be removed."""
    prefix = str(root) + "/"
    with open("/proc/self/mounts") as f:
        points = [ln.split()[1] for ln in f if ln.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _why(path: Path) -> str:
    """dockerd's reason from its log: the "failed to start daemon" line (or the last error),
    else its last lines."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    for key in ("failed to start daemon", "level=fatal", "level=error"):
        found = [ln for ln in lines if key in ln]
        if found:
            return found[-1]
    return " | ".join(lines[-4:]) or "(empty log)"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, however it dies (a test
    run killed by a timeout or a crash never reaches the fixture's stop(); its daemon, its
    containerd and their containers must not outlive it). dockerd stops containerd itself."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def start_dockerd(
    root: Path | None = None, extra_args: tuple[str, ...] = (), timeout_s: float = 90
) -> DockerEngine:
    """Start a private dockerd under ``root`` (a new temp dir by default) and wait for its API.
    Raises ``DockerdFailed`` naming the reason (the daemon's last log lines)."""
    # unix socket paths are limited to 108 bytes: keep the root short
    root = root or Path(tempfile.mkdtemp(prefix="wr-dockerd-", dir="/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    socket_path = str(root / "docker.sock")
    config = root / "daemon.json"
    config.write_text("{}")
    log_path = root / "dockerd.log"
    argv = [
        "dockerd",
        f"--config-file={config}",
        f"--data-root={root / 'data'}",
        f"--exec-root={root / 'exec'}",
        f"--pidfile={root / 'dockerd.pid'}",
        f"--host=unix://{socket_path}",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-masq=false",
        "--bridge=none",
        "--exec-opt=native.cgroupdriver=cgroupfs",
        "--storage-driver=vfs",
        "--userland-proxy=false",
        *extra_args,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    engine = DockerEngine(root, socket_path, proc, log_path)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            why = _why(log_path)
            _unmount_under(root)
            shutil.rmtree(root, ignore_errors=True)
            raise DockerdFailed(f"dockerd exited with {proc.returncode}: {why}")
        if os.path.exists(socket_path) and engine.runtime.available():
            return engine
        if time.monotonic() > deadline:
            why = _why(log_path)
            engine.stop()
            raise DockerdFailed(f"dockerd did not answer in {timeout_s:g} s: {why}")
        time.sleep(0.2)


def busybox_rootfs() -> bytes:
    """A tar of a busybox-static root filesystem: /bin/busybox, a link per applet, and the
    directories a container needs."""
    applets = subprocess.run(
        [BUSYBOX, "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "root"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        tar.add(BUSYBOX, "bin/busybox")
        for name in applets:
            if name == "busybox":
                continue
            link = tarfile.TarInfo(f"bin/{name}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        passwd = b"root:x:0:0:root:/root:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
    return buf.getvalue()


def import_busybox(engine: DockerEngine, image: str = "wr-busybox:test") -> str:
    """Import the busybox rootfs as ``image`` (``docker import``: no registry)."""
    cli = docker_cli()
    assert cli is not None
    r = subprocess.run(
        [cli, "import", "-c", 'CMD ["/bin/sh"]', "-", image],
        input=busybox_rootfs(),
        env=engine.env,
        capture_output=True,
        timeout=120,
    )
    if r.returncode != 0:
        raise AssertionError(f"docker import: {r.stderr.decode(errors='replace').strip()}")
    engine.image = image
    return image
