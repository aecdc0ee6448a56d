"""Tier 3 (root): the production wheel (scripts/build) works with no system libbpf.

scripts/build makes the wheel (CO-RE objects and a libbpf built from Debian's source inside,
repaired by auditwheel); it is installed into a fresh virtualenv of the system python, away from
the checkout; then, in a private mount namespace where the system's libbpf and libelf files are
covered by /dev/null (so nothing on the library search path can load), `whyrestart doctor`
loads the bundled libbpf, the bundled objects, and attaches its hooks.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parent.parent
HIDDEN = ("libbpf.so", "libelf.so")  # what the bundled libbpf must not take from the system


def _system_files(prefixes: tuple[str, ...]) -> list[str]:
    """The real files behind every ldconfig entry whose name starts with one of ``prefixes``."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines()[1:]:
        name, _, path = line.strip().partition(" => ")
        if name.startswith(prefixes) and os.path.exists(path):
            found.add(os.path.realpath(path))
    return sorted(found)


def test_wheel_carries_objects_and_libbpf_and_is_manylinux(production_wheel: Path) -> None:
    wheel = production_wheel
    assert re.fullmatch(r"whyrestart-[\d.]+-py3-none-manylinux_2_\d+_x86_64\.whl", wheel.name)
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("libbpf.so.1", "whyrestart.bpf.o", "gpu.bpf.o"):
        assert f"tracer/bpf/_bundled/{name}" in names
    # auditwheel grafted libbpf's own dependency that no manylinux policy allows
    assert any(re.fullmatch(r"whyrestart\.libs/libelf-[^/]+\.so[.\d]*", n) for n in names), names


@pytest.fixture(scope="module")
def wheel_venv(production_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv of the system python with the wheel installed, once for this module."""
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=300)
    r = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(production_wheel)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return venv


def test_doctor_from_the_wheel_with_no_system_libbpf(wheel_venv: Path, tmp_path: Path) -> None:
    hidden = _system_files(HIDDEN)
    assert any("libbpf" in f for f in hidden), "no system libbpf to hide (scripts/setup has one)"
    venv = wheel_venv
    report = tmp_path / "doctor.json"
    # One shell in a private mount namespace: cover the system libraries, prove they cannot be
    # loaded, then run doctor. cwd and env keep the checkout off sys.path.
    script = "\n".join(
        [
            "set -e",
            *(f"mount --bind /dev/null {f}" for f in hidden),
            f"if {venv}/bin/python -c 'import ctypes; ctypes.CDLL(\"libbpf.so.1\")' 2>/dev/null;"
            " then echo 'system libbpf still loads'; exit 3; fi",
            f"{venv}/bin/python -c 'import tracer; print(tracer.__file__)'",
            f"{venv}/bin/whyrestart doctor --json > {report}",
        ]
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("WHYRESTART_BPF_OBJECT", None)
    env.pop("WHYRESTART_GPU_BPF_OBJECT", None)
    r = _in_private_mounts(script, tmp_path, env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    site = str(venv / "lib")
    assert r.stdout.strip().startswith(site), r.stdout  # the installed package, not the checkout
    doc = json.loads(report.read_text())
    checks = {c["name"]: c for c in doc["checks"]}
    assert doc["ok"] is True, [c for c in doc["checks"] if not c["ok"]]
    libbpf = checks["libbpf"]
    assert libbpf["ok"] is True
    assert re.fullmatch(
        rf"libbpf 1\.\d+, bundled \({re.escape(site)}/.*/libbpf\.so\.1\)", libbpf["detail"]
    )
    assert checks["bpf_object"]["detail"].startswith(site)
    assert checks["hook:exit"]["ok"] is True, checks["hook:exit"]
    # "nothing changes": with the system libbpf on the search path again, the wheel's doctor
    # says the same, check for check (the bundled libbpf included), but for the GPU side's
    # details, which count other recorders on this shared host at that moment
    r = subprocess.run(
        [str(venv / "bin" / "whyrestart"), "doctor", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    visible = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert visible.keys() == checks.keys()
    for name, check in checks.items():
        if name.startswith(("gpu", "hook:gpu", "nvml")):
            assert visible[name]["ok"] == check["ok"], name
        else:
            assert visible[name] == check, name


def test_pipx_install_as_the_readme_says(production_wheel: Path, tmp_path: Path) -> None:
    """The README's pipx route, from the directory holding the wheel: `PIPX_HOME=...
    PIPX_BIN_DIR=... pipx install ./WHEEL` (its /opt/pipx and /usr/local/bin are directories of
    this test's own here: the host is shared), then doctor from the linked command passes with
    the bundled libbpf."""
    pipx = shutil.which("pipx")
    if pipx is None:
        pytest.fail("pipx is not installed (scripts/setup installs it)")
    home, bin_dir = tmp_path / "pipx", tmp_path / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("WHYRESTART_BPF_OBJECT", None)
    env.pop("WHYRESTART_GPU_BPF_OBJECT", None)
    env.update(PIPX_HOME=str(home), PIPX_BIN_DIR=str(bin_dir))
    r = subprocess.run(
        [pipx, "install", f"./{production_wheel.name}"],
        capture_output=True,
        text=True,
        cwd=production_wheel.parent,
        env=env,
        timeout=900,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    r = subprocess.run(
        [str(bin_dir / "whyrestart"), "doctor", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"] is True, [c for c in doc["checks"] if not c["ok"]]
    libbpf = next(c for c in doc["checks"] if c["name"] == "libbpf")
    assert f", bundled ({home}/venvs/whyrestart/" in libbpf["detail"], libbpf


# -- bad input: the same messages from the wheel as from a checkout --------------------------------

# podman's default capabilities (containers.conf default_capabilities): a container that is not
# privileged has these and no others
CONTAINER_CAPS = (
    "chown,dac_override,fowner,fsetid,kill,net_bind_service,setfcap,setgid,setpcap,setuid,"
    "sys_chroot"
)
# Each bad input made real on this host, as (shell lines run first in a private mount namespace,
# the command's prefix):
BAD_INPUTS: dict[str, tuple[list[str], list[str]]] = {
    # this kernel made to report an old release by the UNAME26 personality: uname(2) answers
    # 2.6.(60 + minor) to the process and everything it runs, as an old kernel would
    "kernel_too_old": ([], ["setarch", "--uname-2.6"]),
    # /sys/kernel/btf covered by an empty directory, as on a kernel built without BTF
    "no_btf": (["mount --bind {empty} /sys/kernel/btf"], []),
    # root with a container's default capabilities only (no CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN)
    "no_capability": (
        [],
        ["setpriv", "--bounding-set", f"-all,+{CONTAINER_CAPS.replace(',', ',+')}"],
    ),
}


def _run_bad(
    bad: str, argv: list[str], cwd: Path, env: dict[str, str], tmp: Path
) -> subprocess.CompletedProcess[str]:
    empty = tmp / "empty"
    empty.mkdir(exist_ok=True)
    setup, prefix = BAD_INPUTS[bad]
    script = "\n".join(
        [
            "set -e",
            *(line.format(empty=empty) for line in setup),
            f"exec {shlex.join(prefix + argv)}",
        ]
    )
    return _in_private_mounts(script, cwd, env)


def _in_private_mounts(
    script: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run a bash ``script`` in a mount namespace of its own: what it mounts over the host's
    files (a hidden library, an empty /sys/kernel/btf) is gone when it ends."""
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def assert_names_the_old_kernel(kernel: dict[str, Any]) -> None:
    """doctor's kernel check on a kernel reporting 2.6 (UNAME26): failed, required, and saying
    why with the fix (the image's test checks the same)."""
    assert kernel["ok"] is False and kernel["required"] is True, kernel
    assert re.fullmatch(
        r"kernel 2\.6\.\d+\S* is too old: whyrestart needs Linux 5\.8 or later "
        r"\(BPF ring buffer, bpf_ktime_get_boot_ns\)",
        kernel["detail"],
    ), kernel
    assert kernel["fix"].startswith("boot Linux 5.8 or later"), kernel


def _normalized(text: str, objdir: str) -> str:
    """The text with the directory of the BPF objects (the checkout's bpf/, the wheel's
    tracer/bpf/_bundled/) said the same way: the one thing that differs by design."""
    return text.replace(objdir, "OBJDIR")


@pytest.mark.parametrize("bad", sorted(BAD_INPUTS))
def test_bad_input_gives_the_checkouts_messages_from_the_wheel(
    bad: str, wheel_venv: Path, tmp_path: Path
) -> None:
    """doctor --json and the agent, run from a checkout and from the installed wheel under the
    same bad input: the same checks with the same words and fixes, the same exit codes, the same
    error lines; and those name the problem and the fix."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("WHYRESTART_BPF_OBJECT", None)
    env.pop("WHYRESTART_GPU_BPF_OBJECT", None)
    ways = {
        "checkout": ([sys.executable, "-m", "tracer.cli"], ROOT),
        "wheel": ([str(wheel_venv / "bin" / "whyrestart")], tmp_path),  # (checkout off sys.path)
    }
    doctors: dict[str, tuple[int, dict[str, dict[str, Any]]]] = {}
    agents: dict[str, tuple[int, list[str]]] = {}
    for way, (cmd, cwd) in ways.items():
        r = _run_bad(bad, [*cmd, "doctor", "--json"], cwd, env, tmp_path)
        checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
        objdir = os.path.dirname(checks["bpf_object"]["detail"].split()[0])
        if way == "wheel":
            assert objdir.startswith(str(wheel_venv)), objdir  # the installed package
        else:
            assert objdir == str(ROOT / "bpf"), objdir
        norm = {n: json.loads(_normalized(json.dumps(c), objdir)) for n, c in checks.items()}
        doctors[way] = (r.returncode, norm)
        state = tmp_path / f"state-{way}"
        r = _run_bad(
            bad, [*cmd, "agent", f"--state-dir={state}", "--metrics-addr="], cwd, env, tmp_path
        )
        agents[way] = (r.returncode, _normalized(r.stderr, objdir).splitlines()[:2])

    (rc, checks), (wheel_rc, wheel_checks) = doctors["checkout"], doctors["wheel"]
    assert rc == wheel_rc == 4
    # every check the same but libbpf's (the wheel bundles its own, by design) and the GPU
    # side's details (they count other recorders on this shared host at that moment)
    assert checks.keys() == wheel_checks.keys()
    for name in checks:
        if name == "libbpf" or name.startswith(("gpu", "hook:gpu", "nvml")):
            continue
        assert checks[name] == wheel_checks[name], name
    assert agents["checkout"] == agents["wheel"]
    agent_rc, lines = agents["checkout"]

    if bad == "kernel_too_old":
        kernel = checks["kernel"]
        assert_names_the_old_kernel(kernel)
        assert "not probed" in checks["hooks"]["detail"]
        assert (agent_rc, lines) == (
            4,
            [f"whyrestart: {kernel['detail']}", f"  fix: {kernel['fix']}"],
        )
    elif bad == "no_btf":
        assert checks["kernel"]["ok"] is True
        assert checks["btf"]["ok"] is False
        assert checks["btf"]["detail"] == "/sys/kernel/btf/vmlinux missing"
        assert checks["btf"]["fix"] == "use a kernel with CONFIG_DEBUG_INFO_BTF=y"
        assert (agent_rc, lines) == (
            4,
            [
                "whyrestart: this kernel has no BTF (/sys/kernel/btf/vmlinux is missing)",
                "  fix: use a kernel built with CONFIG_DEBUG_INFO_BTF=y (the default on Debian,"
                " Ubuntu, Fedora and RHEL since 2021)",
            ],
        )
    else:
        assert checks["root"]["ok"] is True  # root, but without the capabilities BPF needs
        hooks = checks["hooks"]
        assert hooks["ok"] is False and "EPERM" in hooks["detail"], hooks
        assert "CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE" in hooks["fix"], hooks
        assert agent_rc == 5, lines
        assert lines == [
            "whyrestart: loading OBJDIR/whyrestart.bpf.o: EPERM (Operation not permitted)",
            "  fix: run as root (or with CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE)",
        ]
