"""setuptools hooks for the production wheel; the metadata is in pyproject.toml.

With WHYRESTART_BUNDLE set (scripts/build sets it), the wheel carries the compiled CO-RE objects
(bpf/*.bpf.o) and the libbpf named by WHYRESTART_LIBBPF in tracer/bpf/_bundled/, and is tagged
for the platform (py3-none-linux_x86_64: no Python extension, but a shared library), which
auditwheel then repairs into a manylinux wheel. Without it (scripts/setup's editable install)
nothing changes: a pure package that uses the checkout's bpf/ and the system libbpf.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:  # setuptools >= 70.1 has its own; older ones use the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLE = bool(os.environ.get("WHYRESTART_BUNDLE"))
OBJECTS = ("whyrestart.bpf.o", "gpu.bpf.o")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if not BUNDLE:
            return
        out = os.path.join(self.build_lib, "tracer", "bpf", "_bundled")
        os.makedirs(out, exist_ok=True)
        sources = [os.path.join(HERE, "bpf", name) for name in OBJECTS]
        sources.append(os.environ.get("WHYRESTART_LIBBPF", ""))
        for src in sources:
            if not os.path.isfile(src):
                sys.exit(f"setup.py: {src or 'WHYRESTART_LIBBPF'} missing: build the wheel "
                         "with scripts/build")
        for src in sources[:-1]:
            shutil.copyfile(src, os.path.join(out, os.path.basename(src)))
        # Under its soname, which is what the loader opens.
        shutil.copyfile(sources[-1], os.path.join(out, "libbpf.so.1"))


class BinaryDistribution(Distribution):
    """A shared library inside: installed to platlib, and the wheel is not pure."""

    def has_ext_modules(self) -> bool:
        return BUNDLE


class BdistWheel(bdist_wheel):
    def get_tag(self) -> tuple[str, str, str]:
        if not BUNDLE:
            return super().get_tag()
        return "py3", "none", sysconfig.get_platform().replace("-", "_").replace(".", "_")


setup(distclass=BinaryDistribution, cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel})
