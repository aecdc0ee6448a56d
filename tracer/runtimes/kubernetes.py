"""A Kubernetes pod's cgroup from its namespace and name, without the API server.

The node's CRI runtime knows each pod's uid (its sandboxes' metadata: tracer.runtimes.cri);
without one that answers, the kubelet's files do: it keeps each pod's logs under
``/var/log/pods/<namespace>_<name>_<uid>/``. The uid names the pod's cgroup:
``kubepods[-<qos>].slice/...pod<uid with _ for ->.slice`` (systemd driver) or
``kubepods/<qos>/pod<uid>`` (cgroupfs driver). Watching the pod's cgroup covers every
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


def split_pod(spec: str) -> tuple[str, str]:
    if spec.count("/") != 1 or not all(spec.split("/")):
        raise UsageError(f"--pod {spec}: expected NAMESPACE/NAME", "e.g. --pod default/llm-0")
    namespace, name = spec.split("/")
    return namespace, name


def parse_pod(spec: str, log_root: str, asked: str = "") -> tuple[str, str, str]:
    """``NS/NAME`` -> (namespace, name, the pod's uid from the kubelet's log directories); a
    UsageError naming what is missing (``asked``: what else was asked first, for the
    message)."""
    namespace, name = split_pod(spec)
    uid = pod_uid(namespace, name, log_root)
    if uid is None:
        raise UsageError(
            f"--pod {spec}: no such pod on this node ({asked}{log_root}/{namespace}_{name}_<uid> "
            "not found, or not unique)",
            "run whyrestart on the node that runs or ran the pod (kubectl get pod -o wide)",
        )
    return namespace, name, uid


def cri_pod_uid(namespace: str, name: str, endpoint: str | None = None) -> tuple[str | None, str]:
    """(the pod's uid as the node's CRI runtime knows it, or None; what was asked, for a
    message): the sockets of ``tracer.runtimes.cri.cri_endpoints``, each that answers."""
    from tracer.runtimes.cri import CriRuntime, cri_endpoints

    asked = []
    for socket in cri_endpoints(given=endpoint):
        rt = CriRuntime(socket)
        if not rt.available():
            continue
        uid = rt.pod_uid(namespace, name)
        if uid is not None:
            return uid, ""
        asked.append(f"{rt.runtime_name} at {socket} has no sandbox for it; ")
    return None, "".join(asked)


def resolve_pod(
    spec: str,
    resolver: CgroupResolver,
    log_root: str = "/var/log/pods",
    cri_endpoint: str | None = None,
) -> str:
    """``NS/NAME`` -> the pod's cgroup path; UsageError naming what is missing. The uid comes
    from the node's CRI runtime when one answers (the kubelet's own source), else from the
    kubelet's log directories."""
    uid, asked = cri_pod_uid(*split_pod(spec), endpoint=cri_endpoint)
    if uid is None:
        _namespace, _name, uid = parse_pod(spec, log_root, asked)
    path = pod_cgroup(uid, resolver)
    if path is None:
        raise UsageError(
            f"--pod {spec}: pod uid {uid} has no cgroup under kubepods in "
            f"{resolver.layout.memory_root}",
            "is the pod running?",
        )
    return path
