"""Post-mortem's words: the sources read, the verdicts (the replay's own table and evidence
format, with wall-clock times), what a recording would have added, and the command that
records the next one. Pure string and dict building."""

from __future__ import annotations

import shlex
from typing import Any

from tracer import safetext
from tracer.analysis.analyzer import Verdict
from tracer.analysis.quantities import fmt_bytes
from tracer.clock import wall_time
from tracer.outputs.text import Clock, verdict_table
from tracer.postmortem.correlate import Assembled, Facts

SCHEMA = 1


class WallClock(Clock):
    """The replay's clock, showing wall-clock time of day where a trace shows "+s": a
    post-mortem has no start to count from."""

    def rel(self, ts: int) -> str:
        return self.wall(ts)


def iso(ts: int, facts: Facts) -> str:
    return (
        wall_time(ts, facts.realtime_offset)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def record_command(facts: Facts) -> str:
    """The exact command that would have recorded this, for the next time."""
    t = facts.target
    flag = {
        "container": "--container",
        "unit": "--unit",
        "pod": "--pod",
        "cgroup": "--cgroup",
        "pid": "--pid",
    }.get(t.kind)
    if flag is None:
        return "sudo whyrestart record -o host.trace --all"
    base = "".join(c if c.isalnum() or c in "-_." else "-" for c in t.spec.strip("/"))[:40]
    return (
        f"sudo whyrestart record -o {shlex.quote((base or 'target') + '.trace')} {flag} "
        f"{shlex.quote(t.spec)}"
    )


def unknowns(facts: Facts, asm: Assembled, verdicts: list[Verdict]) -> list[str]:
    """What cannot be known without a recording, and what is missing because a source could
    not be read: said plainly, once each."""
    out: list[str] = []
    log = facts.kernel_log
    if not log.readable:
        out.append(
            f"the kernel log could not be read ({log.error}): no OOM report can be seen, so a "
            "SIGKILL (exit 137) cannot be told apart from a kill by a person or a supervisor"
            + (f"; to read it: {log.fix}" if log.fix else "")
        )
    elif (
        log.first_ts is not None
        and asm.runtime_exit_ns is not None
        and asm.runtime_exit_ns < log.first_ts
    ):
        out.append(
            f"the kernel log now begins at {iso(log.first_ts, facts)}, after the last exit "
            f"({iso(asm.runtime_exit_ns, facts)}): its OOM report, if there was one, has "
            "been overwritten"
        )
    if log.readable and log.first_seq:
        out.append(
            f"the kernel log ring has overwritten its first {log.first_seq} records since boot: "
            "older OOM reports are gone"
        )
    if any(v.signal and v.cause != "cgroup_oom" and v.cause != "global_oom" for v in verdicts):
        out.append(
            "who sent a signal: only a recording sees the sender (a `podman kill`, a stop, "
            "the kubelet, systemd-oomd all leave just an exit status)"
        )
    out.append(
        "memory use, reclaim stalls and pressure before an exit: only the kernel's own report "
        "at an OOM kill is left (no peak over time, no stall time)"
    )
    rt = facts.runtime
    if rt is not None and (rt.info.restart_count or 0) > 0:
        out.append(
            "how earlier runs ended: the runtime keeps only the last exit; earlier ones are "
            "known only where the kernel log reports an OOM kill"
        )
    if rt is not None and rt.info.exit_code is not None and asm.runtime_exit is None:
        out.append(
            f"the last exit ({rt.info.exit_code}) is before --since; it was not judged"
            if asm.runtime_exit_ns is not None
            else "when the last exit happened: the runtime did not say"
        )
    out.append("GPU allocation failures: they are never logged; only a recording catches them")
    return out


def sources(facts: Facts, asm: Assembled) -> list[str]:
    """One line per source read: what it said."""
    lines: list[str] = []
    rt = facts.runtime
    if rt is not None:
        i = rt.info
        what = f"{i.runtime}: {i.state or 'state unknown'}"
        if i.exit_code is not None:
            what += f", last exit code {i.exit_code}"
            if asm.runtime_exit_ns is not None:
                what += f" at {iso(asm.runtime_exit_ns, facts)}"
        if i.restart_count is not None:
            what += f"; restarted {i.restart_count} times (policy {i.restart_policy})"
        if i.oom_killed is not None:
            what += f"; its own OOMKilled flag: {i.oom_killed}"
        failing = [c for c in i.health if c[2] != 0]
        if i.health:
            what += f"; health log: {len(failing)} of the last {len(i.health)} checks failed"
        lines.append(what)
    for k in facts.kubelet:
        what = f"kubelet: container {k.container} restarted {k.restarts} times"
        if k.previous_log:
            when = f", last written {iso(k.previous_ns, facts)}" if k.previous_ns else ""
            what += f"; the previous one's log {k.previous_log}{when}"
            if k.last_line:
                what += f", its last line: {k.last_line[:200]}"
        lines.append(what)
    if facts.journal_path is not None:
        lines.append(
            f"agent journal {facts.journal_path}: {len(facts.journal)} verdicts about "
            f"{facts.target.label}, reached from its recording"
        )
    log = facts.kernel_log
    if log.readable:
        since = f" from {iso(log.first_ts, facts)}" if log.first_ts is not None else ""
        lines.append(
            f"kernel log: {log.records} records{since}; {len(asm.ooms)} OOM reports name "
            f"{facts.target.label}"
        )
    else:
        lines.append(f"kernel log: unreadable ({log.error})")
    gone = [c.path for c in facts.cgroups if not c.exists]
    if len(gone) > 3:  # (--all on a busy host: every container that was killed and removed)
        lines.append(f"{len(gone)} cgroups the kernel log names are gone (e.g. {gone[0]})")
    else:
        lines += [f"cgroup {path}: gone" for path in gone]
    for c in facts.cgroups:
        if not c.exists:
            continue
        parts = [f"limit {fmt_bytes(c.limit_bytes) if c.limit_bytes else 'none'}"]
        if c.usage_bytes is not None:
            parts.append(f"usage {fmt_bytes(c.usage_bytes)}")
        if c.peak_bytes is not None:
            parts.append(f"peak {fmt_bytes(c.peak_bytes)}")
        for key in ("oom_kill", "oom", "max"):
            if key in c.events:
                parts.append(f"{key} {c.events[key]}")
        if c.failcnt is not None:
            parts.append(f"failcnt {c.failcnt}")
        if c.psi_some_total_us is not None:
            full = c.psi_full_total_us
            parts.append(
                f"memory stalls since created: some {c.psi_some_total_us / 1e6:.1f} s"
                + (f", full {full / 1e6:.1f} s" if full is not None else "")
            )
        lines.append(f"cgroup {c.path}: " + ", ".join(parts))
    limits = [(c.limit_bytes, c.path) for c in facts.cgroups if c.exists and c.limit_bytes]
    if limits:
        limit, path = min(limits)
        lines.append(f"effective limit now: {fmt_bytes(limit)} set on {path}")
    return lines


def text(facts: Facts, asm: Assembled, verdicts: list[Verdict]) -> str:
    """The report for a terminal. Names, paths and kernel-log text are the workload's choice:
    each line we build goes through ``safetext.field`` (the verdict table escapes its own)."""
    esc = safetext.field
    clock = WallClock(facts.now_ns, facts.realtime_offset)
    label = esc(facts.target.label)
    out = f"post-mortem of {label} (no recording: what this machine still knows)\n"
    for line in sources(facts, asm):
        out += f"  {esc(line)}\n"
    out += "\n"
    if verdicts:
        out += verdict_table(verdicts, clock)
    else:
        since = f" since {iso(facts.since_ns, facts)}" if facts.since_ns else ""
        what = "OOM kill" if facts.target.kind == "all" else f"exit of {label}"
        out += f"No {what} is known{since}.\n"
    if facts.journal:
        out += "\nthe agent recorded (whyrestart history shows them; whyrestart explain ID "
        out += "opens an incident):\n"
        for e in facts.journal[-20:]:
            keys = ("time", "unit", "pid", "comm", "cause", "confidence", "incident")
            row = [e.get(k) or "-" for k in keys]
            out += "  " + "  ".join(esc(str(x)) for x in row) + "\n"
    rt = facts.runtime
    if rt is not None and rt.info.restart_count is not None:
        unit = esc(asm.unit.label) if asm.unit else label
        out += f"\n{unit}: {rt.info.runtime} counts {rt.info.restart_count} restarts\n"
    out += "\nwithout a recording, whyrestart cannot know:\n"
    for line in unknowns(facts, asm, verdicts):
        out += f"  - {esc(line)}\n"
    out += f"\nto catch the next one: {esc(record_command(facts))}\n"
    return out


def to_json(facts: Facts, asm: Assembled, verdicts: list[Verdict]) -> dict[str, Any]:
    rt = facts.runtime
    log = facts.kernel_log
    return {
        "schema": SCHEMA,
        "kind": "postmortem",
        "target": {
            "kind": facts.target.kind,
            "spec": facts.target.spec,
            "label": facts.target.label,
        },
        "now_ns": facts.now_ns,
        "since_ns": facts.since_ns,
        "clock_offset_ns": facts.realtime_offset,
        "kernel_log": {
            "readable": log.readable,
            "error": log.error or None,
            "fix": log.fix or None,
            "records": log.records,
            "first_ns": log.first_ts,
            "first_seq": log.first_seq,
            "oom_reports": len(asm.ooms),
        },
        "runtime": None
        if rt is None
        else {
            "source": rt.info.runtime,
            "id": rt.info.id,
            "name": rt.info.name,
            "state": rt.info.state,
            "exit_code": rt.info.exit_code,
            "finished_ns": asm.runtime_exit_ns,
            "restart_count": rt.info.restart_count,
            "restart_policy": rt.info.restart_policy,
            "oom_killed": rt.info.oom_killed,
            "health_checks": len(rt.info.health),  # in the runtime's health log
            "health_failed": sum(1 for c in rt.info.health if c[2] != 0),
        },
        "kubelet": [
            {
                "container": k.container,
                "restarts": k.restarts,
                "previous_log": k.previous_log or None,
                "previous_ns": k.previous_ns,
                "last_line": k.last_line,
            }
            for k in facts.kubelet
        ],
        "cgroups": [
            {
                "path": c.path,
                "exists": c.exists,
                "limit_bytes": c.limit_bytes,
                "usage_bytes": c.usage_bytes,
                "peak_bytes": c.peak_bytes,
                "failcnt": c.failcnt,
                "events": c.events,
                "psi_some_total_us": c.psi_some_total_us,
                "psi_full_total_us": c.psi_full_total_us,
            }
            for c in facts.cgroups
        ],
        "verdicts": [{**v.to_json(), "t": iso(v.ts, facts)} for v in verdicts],
        "agent_journal": None
        if facts.journal_path is None
        else {"path": facts.journal_path, "entries": list(facts.journal)},
        "unknowns": unknowns(facts, asm, verdicts),
        "record_command": record_command(facts),
    }
