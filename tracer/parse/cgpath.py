"""Cgroup paths and the facts that follow from them alone, written once. Pure.

A cgroup path here is relative to its hierarchy's root, in canonical form: a leading "/", no
trailing "/", no "." or ".." parts ("/system.slice/llm.service"). Which cgroups contain which,
and which limit on the way to the root is the one that applies (the effective limit), are
answered here for every part of the tool: the recorder's resolver, the samplers, the timeline,
post-mortem and the command line.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

__all__ = ["ancestors", "canonical", "effective_limit", "is_ancestor", "is_within", "relative"]


def canonical(path: str) -> str:
    """``path`` in canonical form. Rooted normalisation cannot climb above "/", so a path never
    escapes the hierarchy's root."""
    # posixpath keeps a leading "//" (POSIX lets it mean something else); cgroups do not
    return posixpath.normpath("/" + path.lstrip("/"))


def relative(path: str, mount_root: str | None) -> str:
    """``path`` below the hierarchy's root, canonical; a path that starts with the mount point
    itself ("/sys/fs/cgroup/memory/a/b" for a root at /sys/fs/cgroup/memory) is accepted."""
    root = (mount_root or "").rstrip("/")
    if root and is_within(path, root):
        path = path[len(root) :]
    return canonical(path)


def is_within(path: str, top: str) -> bool:
    """Is ``path`` ``top`` itself or below it? ("/a/b" is within "/a"; "/ab" is not; every path
    is within "/".)"""
    top = top.rstrip("/")
    return not top or path == top or path.startswith(top + "/")


def is_ancestor(a: str, b: str) -> bool:
    """Is ``a`` a proper ancestor of ``b``?"""
    return a != b and is_within(b, a)


def ancestors(path: str) -> list[str]:
    """``"/a/b/c"`` → ``["/a/b/c", "/a/b", "/a", "/"]``: the path itself first."""
    p = canonical(path)
    out = [p]
    while p != "/":
        p = posixpath.dirname(p)
        out.append(p)
    return out


def effective_limit(limits: Iterable[tuple[str, int | None]]) -> tuple[int | None, str | None]:
    """The limit that applies to a cgroup, from ``(path, limit)`` of it and its ancestors (in
    any order; None: no limit there): the smallest, and the path that sets it; on equal limits
    the deepest cgroup is named. ``(None, None)`` when nothing on the way is limited.

    (v1's ``use_hierarchy=0`` would make parents' limits not apply; kernels >= 5.16 always use
    hierarchy, and older hosts leave it on in practice.)"""
    best: tuple[int, int, str] | None = None
    for path, limit in limits:
        if limit is None:
            continue
        key = (limit, -path.rstrip("/").count("/"), path)
        if best is None or key[:2] < best[:2]:
            best = key
    return (best[0], best[2]) if best else (None, None)
