"""A podman image of the model server, built here from the host's files (no registry is
reachable): the base is a Debian root of the same release as this host (scripts/bare-target,
as tests/test_image_root.py uses it), the server's Python packages are copied from the
checkout's environment (same Python, same C library), the app from this folder. The model is
not in it: it is mounted from the host, as weights are."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

from tests.servers.pymodel import HERE

# what the server imports, from the checkout's environment (uvicorn's and gunicorn's own deps)
PACKAGES = ("gunicorn", "uvicorn", "uvicorn_worker", "h11", "click", "packaging", "numpy")
APP = "/opt/pymodel/app"

CONTAINERFILE = f"""\
FROM {{base}}
COPY site /opt/pymodel/site
COPY app {APP}
ENV PYTHONPATH=/opt/pymodel/site PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["python3", "-m", "gunicorn", "-c", "{APP}/gunicorn_conf.py", "--chdir", "{APP}"]
CMD ["app:app"]
"""


def context(folder: Path) -> Path:
    """The build context: the Containerfile, site/ (the packages) and app/ (this folder)."""
    site = Path(sysconfig.get_paths()["purelib"])
    (folder / "site").mkdir(parents=True)
    for entry in sorted(site.iterdir()):
        top = entry.name.split("-", 1)[0].split(".", 1)[0]
        if top in PACKAGES and (entry.is_dir() or entry.suffix == ".py"):
            # (numpy.libs: its bundled BLAS; *.dist-info: the packages' metadata)
            shutil.copytree(entry, folder / "site" / entry.name, symlinks=True)
    shutil.copytree(HERE, folder / "app", ignore=shutil.ignore_patterns("__pycache__", "image.py"))
    return folder


def build(tag: str, base: str, folder: Path, env: dict[str, str]) -> None:
    """``podman build`` the server's image as ``tag`` on ``base`` (an image with python3)."""
    ctx = context(folder)
    spec = ctx / "Containerfile"
    spec.write_text(CONTAINERFILE.format(base=base))
    r = subprocess.run(
        ["podman", "build", "--network=none", "-t", tag, "-f", str(spec), str(ctx)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if r.returncode != 0:
        raise AssertionError(f"podman build failed: {r.stderr[-3000:]}")
