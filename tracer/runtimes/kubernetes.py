"""A Kubernetes pod's cgroup from its namespace and name, without the API server.

The kubelet keeps each pod's logs under ``/var/log/pods/<namespace>_<name>_<uid>/``; the uid
names the pod's cgroup: ``kubepods[-<qos>].slice/...pod<uid with _ for ->.slice`` (systemd
driver) or ``kubepods/<qos>/pod<uid>`` (cgroupfs driver). Watching the pod's cgroup covers every
container of the pod, restarted or not (a restarted container is a new cgroup below it).
"""

from __future__ import annotations

import os
import posixpath
from typing import TYPE_CHECKING

from tracer.errors import UsageError

if TYPE_CHECKING:
    from tracer.sources.cgroupfs import CgroupResolver


def pod_uid(namespace: str, name: str, log_root: str = "/var/log/pods") -> str | None:
    try:
        entries = os.listdir(log_root)
    except OSError:
        return None
    prefix = f"{namespace}_{name}_"
    uids = [e[len(prefix) :] for e in entries if e.startswith(prefix)]
    return uids[0] if len(uids) == 1 else None


def pod_cgroup(uid: str, resolver: CgroupResolver) -> str | None:
    """The pod's cgroup path (relative to the memory hierarchy root), searched under kubepods
    (pods sit at most two levels below it: ``kubepods/<qos>/pod<uid>``)."""
    wanted = {f"pod{uid}", f"pod{uid}.slice", f"pod{uid.replace('-', '_')}.slice"}
    for top in ("/kubepods.slice", "/kubepods"):
        level = resolver.children(top)
        for _depth in range(3):
            for path in level:
                d = posixpath.basename(path)
                if d in wanted or any(d.endswith("-" + w) for w in wanted):
                    return path
            level = [c for p in level for c in resolver.children(p)]
    return None


def parse_pod(spec: str, log_root: str) -> tuple[str, str, str]:
    """``NS/NAME`` -> (namespace, name, the pod's uid from the kubelet's log directories); a
    UsageError naming what is missing."""
    if spec.count("/") != 1 or not all(spec.split("/")):
        raise UsageError(f"--pod {spec}: expected NAMESPACE/NAME", "e.g. --pod default/llm-0")
    namespace, name = spec.split("/")
    uid = pod_uid(namespace, name, log_root)
    if uid is None:
        raise UsageError(
            f"--pod {spec}: no such pod on this node ({log_root}/{namespace}_{name}_<uid> "
            "not found, or not unique)",
            "run whyrestart on the node that runs or ran the pod (kubectl get pod -o wide)",
        )
    return namespace, name, uid


def resolve_pod(spec: str, resolver: CgroupResolver, log_root: str = "/var/log/pods") -> str:
    """``NS/NAME`` -> the pod's cgroup path; UsageError naming what is missing."""
    _namespace, _name, uid = parse_pod(spec, log_root)
    path = pod_cgroup(uid, resolver)
    if path is None:
        raise UsageError(
            f"--pod {spec}: pod uid {uid} has no cgroup under kubepods in "
            f"{resolver.layout.memory_root}",
            "is the pod running?",
        )
    return path
