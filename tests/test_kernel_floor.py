"""Tier 1 (no root): the kernel version floor (5.8: BPF ring buffer, bpf_ktime_get_boot_ns).

The release strings are real ones (uname -r of stock distribution kernels). The running kernel
is read in one place, ``system.kernel_release``; doctor and the recorder's preflight judge what
it returns. The same message from a checkout and from the installed wheel, on this real kernel
made to report an old release (setarch --uname-2.6), is tests/test_wheel_root.py's.
"""

from __future__ import annotations

import os

import orjson
import pytest
from click.testing import CliRunner

from tracer import cli
from tracer.errors import KernelUnsupported
from tracer.pipeline.record import preflight
from tracer.sources import system


@pytest.mark.parametrize(
    ("release", "version"),
    [
        ("6.18.44-fc-v669", (6, 18)),
        ("6.1.0-18-amd64", (6, 1)),  # Debian 12
        ("5.10.0-28-cloud-amd64", (5, 10)),  # Debian 11
        ("5.15.0-91-generic", (5, 15)),  # Ubuntu 22.04
        ("5.4.0-150-generic", (5, 4)),  # Ubuntu 20.04
        ("4.18.0-513.5.1.el8_9.x86_64", (4, 18)),  # RHEL 8
        ("2.6.78-fc-v669", (2, 6)),  # setarch --uname-2.6 on 6.18
        ("custom", None),
        ("", None),
    ],
)
def test_kernel_version_of_real_releases(release: str, version: tuple[int, int] | None) -> None:
    assert system.kernel_version(release) == version


def test_the_floor_is_5_8() -> None:
    assert system.kernel_too_old("5.8.0") is None
    assert system.kernel_too_old("5.10.0-28-cloud-amd64") is None
    assert system.kernel_too_old("10.0.0") is None
    assert system.kernel_too_old("custom-build") is None  # unreadable: not judged
    assert system.kernel_too_old("5.7.19") == (
        "kernel 5.7.19 is too old: whyrestart needs Linux 5.8 or later (BPF ring buffer, "
        "bpf_ktime_get_boot_ns)"
    )
    assert system.kernel_too_old("4.18.0-513.5.1.el8_9.x86_64") is not None


def test_doctor_names_an_old_kernel_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # as root: the hooks are still not probed
    monkeypatch.setattr(system, "kernel_release", lambda: "5.4.0-150-generic")
    r = CliRunner().invoke(cli.main, ["doctor", "--json"])
    assert r.exit_code == 4
    doc = orjson.loads(r.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    assert doc["ok"] is False and doc["facts"]["kernel"] == "5.4.0-150-generic"
    assert checks["kernel"] == {
        "name": "kernel",
        "ok": False,
        "detail": "kernel 5.4.0-150-generic is too old: whyrestart needs Linux 5.8 or later "
        "(BPF ring buffer, bpf_ktime_get_boot_ns)",
        "fix": system.KERNEL_FIX,
        "required": True,
    }
    assert "Linux 5.8 or later" in system.KERNEL_FIX
    assert checks["hooks"]["ok"] is False and "not probed" in checks["hooks"]["detail"]


def test_doctor_passes_the_kernel_check_on_a_new_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # no hook probe: this tier loads nothing
    monkeypatch.setattr(system, "kernel_release", lambda: "6.1.0-18-amd64")
    r = CliRunner().invoke(cli.main, ["doctor", "--json"])
    checks = {c["name"]: c for c in orjson.loads(r.stdout)["checks"]}
    assert checks["kernel"]["ok"] is True
    assert checks["kernel"]["detail"] == "kernel 6.1.0-18-amd64"


def test_preflight_refuses_an_old_kernel_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # past the root check, to the kernel's
    monkeypatch.setattr(system, "kernel_release", lambda: "5.7.19")
    with pytest.raises(KernelUnsupported) as err:
        preflight()
    assert err.value.exit_code == 4
    assert str(err.value) == (
        "kernel 5.7.19 is too old: whyrestart needs Linux 5.8 or later (BPF ring buffer, "
        f"bpf_ktime_get_boot_ns)\n  fix: {system.KERNEL_FIX}"
    )
