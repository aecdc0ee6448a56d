"""A verdict as one JSON log line for log pipelines (Fluent Bit, Vector, an OpenTelemetry
collector's file or stdout receiver), with OpenTelemetry semantic-convention attribute names
(``k8s.namespace.name``, ``container.name``, ``process.pid``, ``process.exit.code``, ...), so
the pipeline takes it unchanged. whyrestart's own facts are under ``whyrestart.*``. Pure.

Where a node's CRI runtime named the unit (tracer.pipeline.follow.RuntimeIdentity), its
``k8s.pod.uid``, ``container.id``, ``container.runtime.name`` and
``k8s.container.restart_count`` too (``runtime_attributes``, which the journal's lines share);
a unit named any other way has none of them: absent, not empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from tracer.analysis.findings import HIGH, Verdict
from tracer.analysis.units import label_parts
from tracer.clock import wall_time
from tracer.safetext import json_text

if TYPE_CHECKING:
    from tracer.pipeline.follow import RuntimeIdentity


def runtime_attributes(identity: RuntimeIdentity | None) -> dict[str, Any]:
    """The unit's CRI identity under OpenTelemetry's semantic-convention names; {} without one,
    and a fact the runtime did not give is left out (a pod uid of "" would name no pod)."""
    if identity is None:
        return {}
    attrs: dict[str, Any] = {
        "container.id": identity.container_id,
        "container.runtime.name": identity.runtime,
    }
    if identity.pod_uid:
        attrs["k8s.pod.uid"] = identity.pod_uid
    if identity.restart_count is not None:
        attrs["k8s.container.restart_count"] = identity.restart_count
    return attrs


def log_record(
    v: Verdict,
    clock_offset_ns: int,
    incident: str | None,
    identity: RuntimeIdentity | None = None,
) -> dict[str, Any]:
    parts = label_parts(v.unit)
    attrs: dict[str, Any] = {
        "process.pid": v.pid,
        "process.executable.name": v.comm,
        "whyrestart.cause": v.cause,
        "whyrestart.confidence": v.confidence,
        "whyrestart.advice": v.advice,
        "whyrestart.unit": v.unit,
        "whyrestart.main_process": v.main,
    }
    if v.exit_code is not None:
        attrs["process.exit.code"] = v.exit_code
    if v.signal is not None:
        attrs["whyrestart.signal"] = v.signal
    if "namespace" in parts:
        attrs["k8s.namespace.name"] = parts["namespace"]
        attrs["k8s.pod.name"] = parts["pod"]
        attrs["k8s.container.name"] = parts["container"]
    if "container_name" in parts:
        attrs["container.name"] = parts["container_name"]
    attrs.update(runtime_attributes(identity))
    for name, value in (
        ("whyrestart.sender.pid", v.sender_pid),
        ("whyrestart.sender.name", v.sender_comm),
        ("whyrestart.limit.cgroup", v.limit_cgroup),
        ("whyrestart.limit.scope", v.limit_scope),
        ("whyrestart.limit.bytes", v.limit_bytes),
        ("whyrestart.peak.bytes", v.peak_bytes),
        ("whyrestart.incident", incident),
    ):
        if value is not None:
            attrs[name] = value
    notable = not (v.cause == "app_exit" and v.exit_code == 0)
    return {
        "timestamp": wall_time(v.ts, clock_offset_ns).isoformat(),
        "severity_text": ("WARN" if v.confidence == HIGH else "INFO") if notable else "DEBUG",
        "body": v.summary,
        "attributes": attrs,
    }


def log_line(
    v: Verdict,
    clock_offset_ns: int,
    incident: str | None,
    identity: RuntimeIdentity | None = None,
) -> bytes:
    """One line; C1 and bidi controls in workload-chosen text escaped (orjson does C0)."""
    text = orjson.dumps(log_record(v, clock_offset_ns, incident, identity)).decode()
    return (json_text(text) + "\n").encode()
