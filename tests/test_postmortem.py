"""Tier 1: post-mortem's pure parts, on fixtures: the clock alignment, the correlation of the
kernel log's OOM reports with a runtime's record and the cgroup counters, and the same
Analyzer's verdicts on what they assemble; the gatherer on fixture cgroup trees, a fake
runtime and a fake kernel log; bad input. The real-kernel, real-podman cases are in
tests/test_postmortem_root.py.

The kernel-log lines are the ones this machine's kernel (6.18, cgroup v1) printed for a podman
container OOM-killed under --memory=64m.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.containers import podman_container, systemd_unit
from tracer.analysis.analyzer import Analyzer, Verdict
from tracer.cli import main, postmortem_header
from tracer.clock import monotonic_to_boottime, parse_rfc3339_ns, wall_to_boottime
from tracer.errors import UsageError
from tracer.parse.kmsg import KmsgRecord, parse_record
from tracer.postmortem import report
from tracer.postmortem.correlate import (
    Assembled,
    CgroupNow,
    Facts,
    KernelLog,
    RuntimeState,
    Target,
    assemble,
    read_kernel_log,
    wait_status,
)
from tracer.postmortem.gather import World, gather
from tracer.runtimes.base import ContainerInfo, Runtime
from tracer.sources.cgroupfs import CgroupLayout

S = 1_000_000_000
MiB = 1 << 20
CID = "4ac5a825ecece44742b587d2bc7cba42688b88711efc9aec31a31204682bcd0f"
CPATH = f"/libpod_parent/libpod-{CID}"
# the clocks of the fixture: realtime = boottime + REAL, monotonic = boottime + MONO
REAL = 1_796_000_000 * S
MONO = -2 * S  # 2 s suspended since boot
NOW = 1000 * S


def oom_records(
    seq: int, at_s: float, pid: int, path: str = CPATH, limit_kb: int = 65536
) -> list[bytes]:
    """One memcg OOM report as /dev/kmsg prints it, ``at_s`` on CLOCK_BOOTTIME."""
    us = int((at_s * S + MONO) // 1000)
    lines = [
        "dd invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        f"memory: usage {limit_kb}kB, limit {limit_kb}kB, failcnt 128",
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"oom_memcg={path},task_memcg={path},task=dd,pid={pid},uid=0",
        f"Memory cgroup out of memory: Killed process {pid} (dd) total-vm:104668kB, "
        "anon-rss:65024kB, file-rss:1264kB, shmem-rss:0kB, UID:0 pgtables:168kB oom_score_adj:0",
    ]
    return [f"6,{seq + i},{us + i},-;{line}".encode() for i, line in enumerate(lines)]


def records(*raw: Sequence[bytes]) -> list[KmsgRecord]:
    out = []
    for group in raw:
        for r in group:
            rec = parse_record(r)
            assert rec is not None
            out.append(rec)
    return out


def podman_info(
    exit_code: int | None = 137,
    finished_s: float | None = 900.5,
    started_s: float | None = 900.0,
    restarts: int = 2,
    cgroup_path: str | None = None,
) -> ContainerInfo:
    started = None if started_s is None else int(started_s * S) + REAL
    finished = None if finished_s is None else int(finished_s * S) + REAL
    return podman_container(
        CID,
        "llm",
        cgroup_path=cgroup_path,
        restart_count=restarts,
        image="localhost/bb",
        exit_code=exit_code,
        started_ns=started,
        finished_ns=finished,
        command="dd",
    )


def facts(
    log: KernelLog,
    *,
    target: Target | None = None,
    info: ContainerInfo | None = None,
    cgroups: tuple[CgroupNow, ...] = (),
    since: int = 0,
) -> Facts:
    if target is None:
        target = Target("container", "llm", "podman llm", ids=(CID,))
    return Facts(
        target=target,
        now_ns=NOW,
        since_ns=since,
        realtime_offset=REAL,
        monotonic_offset=MONO,
        hierarchy="memory",
        kernel_log=log,
        cgroups=cgroups,
        runtime=None if info is None else RuntimeState(info, NOW),
    )


def judged(f: Facts) -> tuple[Assembled, list[Verdict]]:
    """Assemble, then judge with the analyzer every output uses, built from a header."""
    asm = assemble(f)
    from tracer.cli import analyzer_for

    analyzer: Analyzer = analyzer_for(postmortem_header(f))
    return asm, analyzer.feed_all(asm.events)


# -- clock alignment ------------------------------------------------------------------------


def test_rfc3339_keeps_nanoseconds_and_zones() -> None:
    base = 1796042285 * S  # 2026-11-30T12:38:05Z
    assert parse_rfc3339_ns("2026-11-30T12:38:05.561505333Z") == base + 561505333
    assert parse_rfc3339_ns("2026-11-30T12:38:05.58442517Z") == base + 584425170
    assert parse_rfc3339_ns("2026-11-30T13:38:05+01:00") == base
    assert parse_rfc3339_ns("2026-11-30T07:08:05.5-05:30") == base + S // 2
    assert parse_rfc3339_ns("0001-01-01T00:00:00Z") is None  # Go's zero time: never
    assert parse_rfc3339_ns("2026-11-30T12:38:05") is None  # no zone: a guess, refused
    assert parse_rfc3339_ns("yesterday") is None


def test_wall_and_monotonic_stamps_land_on_boottime() -> None:
    assert wall_to_boottime(REAL + 900 * S, REAL) == 900 * S
    assert monotonic_to_boottime(898 * S, MONO) == 900 * S


def test_runtime_codes_become_wait_statuses() -> None:
    assert wait_status(137) == 9  # killed by SIGKILL, as runtimes report it
    assert wait_status(143) == 15
    assert wait_status(42) == 42 << 8
    assert wait_status(0) == 0
    assert wait_status(255) == 255 << 8  # beyond 128 + 64: an exit code


def test_kernel_log_stamps_and_limit_line() -> None:
    log = read_kernel_log(records(oom_records(10, 900.4, 2193)), MONO)
    assert log.readable and log.records == 4 and log.first_seq == 10
    [o] = log.ooms
    assert o.oom.victim_pid == 2193 and o.oom.oom_memcg == CPATH
    assert o.oom.ts == 900_400_003_000  # monotonic µs - the offset: boottime ns (4th line)
    assert (o.usage_kb, o.limit_kb, o.failcnt) == (65536, 65536, 128)


def test_container_id_is_matched_as_a_whole_name() -> None:
    t = Target("container", "llm", "podman llm", ids=(CID,))
    log = read_kernel_log(
        records(
            oom_records(1, 10, 1, f"/libpod_parent/libpod-{CID}"),
            oom_records(5, 20, 2, f"/machine.slice/libpod-{CID}.scope/container"),
            oom_records(9, 30, 3, f"/libpod_parent/libpod-{CID}ff"),  # a longer id
            oom_records(13, 40, 4, "/libpod_parent/libpod-" + "0" * 64),
        ),
        MONO,
    )
    assert [o.oom.victim_pid for o in log.ooms if t.matches(o.oom)] == [1, 2]


# -- verdicts through the same analyzer -----------------------------------------------------


def test_oom_killed_container_restarted_by_its_policy() -> None:
    # three runs, each OOM-killed; podman keeps the last exit (137) and counts 2 restarts; the
    # container's cgroup is gone
    log = read_kernel_log(
        records(
            oom_records(100, 899.0, 2048),
            oom_records(200, 899.5, 2109),
            oom_records(300, 900.45, 2193),
        ),
        MONO,
    )
    f = facts(log, info=podman_info(), cgroups=(CgroupNow(CPATH, 0, exists=False),))
    asm, verdicts = judged(f)
    assert [(v.pid, v.cause, v.confidence) for v in verdicts] == [
        (2048, "cgroup_oom", "medium"),  # the kernel log alone
        (2109, "cgroup_oom", "medium"),
        (2193, "cgroup_oom", "high"),  # the kernel log and podman's exit 137 agree
    ]
    last = verdicts[-1]
    assert last.ts == 900_500_000_000  # podman's FinishedAt, on boottime
    assert (last.limit_bytes, last.limit_scope, last.limit_cgroup) == (64 * MiB, "own", CPATH)
    assert last.unit == "podman llm"
    assert any("podman says podman llm exited with code 137" in w for _, w in last.evidence)
    assert asm.runtime_exit is not None and asm.runtime_exit.pid == 2193
    assert (900_500_000_000, "pid 2193 (dd) killed by SIGKILL (known from podman)") in last.evidence
    first = verdicts[0].evidence
    assert any(w == "pid 2048 (dd) killed by SIGKILL (known from the kernel log)" for _, w in first)
    text = report.text(f, asm, verdicts)
    assert "podman llm: podman counts 2 restarts" in text
    assert "hit its limit 64.0 MiB" in text
    assert "sudo whyrestart record -o llm.trace --container llm" in text


def test_exit_137_alone_stays_unknown() -> None:
    f = facts(read_kernel_log([], MONO), info=podman_info(restarts=0))
    asm, [v] = judged(f)
    assert (v.cause, v.confidence, v.pid, v.comm) == ("unknown", "low", 0, "dd")
    assert any("who sent a signal" in u for u in report.unknowns(f, asm, [v]))


def test_a_kill_outside_the_last_run_does_not_explain_its_exit() -> None:
    # the report is from a run that ended before the last one started: not its kill
    log = read_kernel_log(records(oom_records(100, 800.0, 2048)), MONO)
    f = facts(log, info=podman_info(restarts=1))
    _, verdicts = judged(f)
    assert [(v.pid, v.cause) for v in verdicts] == [(2048, "cgroup_oom"), (0, "unknown")]


def test_exit_42_is_app_exit() -> None:
    f = facts(read_kernel_log([], MONO), info=podman_info(exit_code=42, restarts=0))
    _, [v] = judged(f)
    assert (v.cause, v.exit_code, v.confidence) == ("app_exit", 42, "high")
    # the exit was not seen: the evidence says where it is known from
    assert [w for _, w in v.evidence] == [
        "dd exited with code 42 (known from podman; it keeps no pid)"
    ]


def test_plain_cgroup_kernel_log_and_counter_agree() -> None:
    path = "/process_api/x/wr-pm-1"
    log = read_kernel_log(records(oom_records(1, 500.0, 77, path, limit_kb=32768)), MONO)
    cg = CgroupNow(path, 4242, exists=True, limit_bytes=32 * MiB, events={"oom_kill": 1})
    f = facts(log, target=Target("cgroup", path, path, paths=(path,)), cgroups=(cg,))
    _, [v] = judged(f)
    assert (v.cause, v.confidence, v.limit_bytes, v.pid) == ("cgroup_oom", "high", 32 * MiB, 77)
    assert any(f"oom_kill counter of {path} reads 1" in w for _, w in v.evidence)


def test_counter_vouches_only_for_the_newest_kills() -> None:
    # two kills logged at the path, the counter reads 1: the cgroup was recreated in between,
    # so the counter corroborates the second kill only
    path = "/process_api/x/wr-pm-2"
    log = read_kernel_log(
        records(oom_records(1, 500.0, 77, path), oom_records(9, 600.0, 78, path)), MONO
    )
    cg = CgroupNow(path, 4242, exists=True, limit_bytes=64 * MiB, events={"oom_kill": 1})
    f = facts(log, target=Target("cgroup", path, path, paths=(path,)), cgroups=(cg,))
    _, verdicts = judged(f)
    assert [(v.pid, v.confidence) for v in verdicts] == [(77, "medium"), (78, "high")]


def killed_unit(
    cgroup_path: str, restarts: int, oom_killed: bool | None, exit_pid: int, finished_ns: int
) -> ContainerInfo:
    """systemctl show of model.service after its main process was killed by signal 9
    (ExecMainCode=2, ExecMainStatus=9; started at 400 s, monotonic times), restarting."""
    return systemd_unit(
        "model.service",
        cgroup_path=cgroup_path,
        restart_count=restarts,
        oom_killed=oom_killed,
        exit_code=137,
        exit_pid=exit_pid,
        started_ns=400 * S + MONO,
        finished_ns=finished_ns,
    )


def test_counter_without_the_log_line_is_medium() -> None:
    # a systemd unit: killed by signal 9, no OOM report left, its cgroup's counter reads 1
    path = "/system.slice/model.service"
    unit = killed_unit(path, 1, None, 5150, 450 * S + MONO)
    cg = CgroupNow(path, 99, exists=True, limit_bytes=512 * MiB, events={"oom_kill": 1})
    f = facts(
        read_kernel_log([], MONO),
        target=Target("unit", "model", "model.service", ids=("model.service",), paths=(path,)),
        info=unit,
        cgroups=(cg,),
    )
    _, [v] = judged(f)
    assert (v.cause, v.confidence, v.pid, v.ts) == ("cgroup_oom", "medium", 5150, 450 * S)
    assert v.limit_bytes == 512 * MiB
    # the same exit without the counter: unknown
    f2 = facts(f.kernel_log, target=f.target, info=unit)
    _, [v2] = judged(f2)
    assert v2.cause == "unknown"


def test_what_is_missing_is_said() -> None:
    # the ring begins after the exit: its report is gone
    log = read_kernel_log(records(oom_records(5000, 950.0, 9, "/other")), MONO)
    f = facts(log, info=podman_info())
    asm, verdicts = judged(f)
    said = report.unknowns(f, asm, verdicts)
    assert any("after the last exit" in u and "overwritten" in u for u in said)
    assert any("first 5000 records" in u for u in said)
    # the log cannot be read at all
    f = facts(KernelLog(readable=False, error="Operation not permitted"), info=podman_info())
    asm, verdicts = judged(f)
    assert verdicts[0].cause == "unknown"
    said = report.unknowns(f, asm, verdicts)
    assert any("could not be read (Operation not permitted)" in u for u in said)


def test_since_leaves_older_exits_out() -> None:
    log = read_kernel_log(
        records(oom_records(100, 899.0, 2048), oom_records(300, 900.45, 2193)), MONO
    )
    f = facts(log, info=podman_info(), since=900 * S)
    _, verdicts = judged(f)
    assert [v.pid for v in verdicts] == [2193]


def test_json_shape() -> None:
    log = read_kernel_log(records(oom_records(300, 900.45, 2193)), MONO)
    f = facts(log, info=podman_info(restarts=0))
    asm, verdicts = judged(f)
    doc = report.to_json(f, asm, verdicts)
    assert sorted(doc) == [
        "agent_journal",
        "cgroups",
        "clock_offset_ns",
        "kernel_log",
        "kind",
        "kubelet",
        "now_ns",
        "record_command",
        "runtime",
        "schema",
        "since_ns",
        "target",
        "unknowns",
        "verdicts",
    ]
    assert (doc["schema"], doc["kind"]) == (1, "postmortem")
    assert doc["runtime"]["restart_count"] == 0 and doc["runtime"]["exit_code"] == 137
    [v] = doc["verdicts"]
    assert (v["cause"], v["confidence"], v["pid"]) == ("cgroup_oom", "high", 2193)
    assert v["t"] == "2026-11-30T01:08:20.500Z"  # REAL + 900.5 s, wall clock


# -- the gatherer on fixtures; bad input ----------------------------------------------------


class FakeRuntime(Runtime):
    name = "podman"

    def __init__(self, known: dict[str, ContainerInfo]) -> None:
        super().__init__()
        self.known = known

    def available(self) -> bool:
        return True

    def find(self, name_or_id: str) -> ContainerInfo | None:
        info = self.known.get(name_or_id)
        if info is None:
            self._fail(f"{self.name}: no container {name_or_id!r}", quiet=True)
        return info


def world(tmp_path: Path, kmsg: list[KmsgRecord], known: dict[str, ContainerInfo]) -> World:
    root = tmp_path / "memory"
    unlimited = 9223372036854771712
    for d, limit, kills in (
        (root, unlimited, 0),
        (root / "test", unlimited, 0),
        (root / "test" / "hog", 32 * MiB, 1),
    ):
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text("")
        (d / "memory.limit_in_bytes").write_text(f"{limit}\n")
        (d / "memory.usage_in_bytes").write_text(f"{MiB}\n")
        (d / "memory.max_usage_in_bytes").write_text(f"{32 * MiB}\n")
        (d / "memory.failcnt").write_text("128\n")
        (d / "memory.stat").write_text("rss 1048576\ncache 0\n")
        (d / "memory.oom_control").write_text(
            f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"
        )
    unified = tmp_path / "unified" / "test" / "hog"
    unified.mkdir(parents=True)
    (unified / "memory.pressure").write_text(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=2500000\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=1000000\n"
    )
    layout = CgroupLayout("hybrid", str(root), 1, str(tmp_path / "unified"))
    return World(
        layout=layout,
        proc_root=str(tmp_path / "proc"),
        kmsg=lambda: kmsg,
        runtimes=[FakeRuntime(known)],
        boottime=lambda: NOW,
        realtime_offset=lambda: REAL,
        monotonic_offset=lambda: MONO,
    )


def test_gather_reads_counters_limits_and_the_log(tmp_path: Path) -> None:
    kmsg = records(oom_records(1, 500.0, 77, "/test/hog", limit_kb=32768))
    f = gather("cgroup", "/test/hog", None, world(tmp_path, kmsg, {}))
    # the target and every ancestor, deepest first, as they are now
    got = [(c.path, c.exists, c.limit_bytes, c.events.get("oom_kill")) for c in f.cgroups]
    assert got == [("/test/hog", True, 32 * MiB, 1), ("/test", True, None, 0), ("/", True, None, 0)]
    lines = report.sources(f, assemble(f))
    assert "effective limit now: 32.0 MiB set on /test/hog" in lines
    # PSI totals from the unified twin of a v1 cgroup (a hybrid host)
    assert f.cgroups[0].psi_some_total_us == 2_500_000
    assert any("memory stalls since created: some 2.5 s, full 1.0 s" in x for x in lines)
    _, [v] = judged(f)
    assert (v.cause, v.confidence) == ("cgroup_oom", "high")


def test_bad_targets_say_what_was_looked_for(tmp_path: Path) -> None:
    w = world(tmp_path, [], {})
    with pytest.raises(UsageError, match="--container nope: no such container"):
        gather("container", "nope", None, w)
    with pytest.raises(UsageError, match="--pid 4242: no such process, and the kernel log holds"):
        gather("pid", "4242", None, w)
    with pytest.raises(UsageError, match="--cgroup /nope: no such cgroup now"):
        gather("cgroup", "/nope", None, w)
    with pytest.raises(UsageError, match="--pid x: not a process id"):
        gather("pid", "x", None, w)


def test_pid_found_in_the_kernel_log_after_it_is_gone(tmp_path: Path) -> None:
    kmsg = records(oom_records(1, 500.0, 77, "/test/hog", limit_kb=32768))
    f = gather("pid", "77", None, world(tmp_path, kmsg, {}))
    _, [v] = judged(f)
    assert (v.pid, v.cause) == (77, "cgroup_oom")


def test_cli_needs_exactly_one_target() -> None:
    r = CliRunner().invoke(main, ["postmortem"])
    assert r.exit_code != 0 and "name exactly one target" in r.output
    r = CliRunner().invoke(main, ["postmortem", "--all", "--pid", "1"])
    assert r.exit_code != 0 and "name exactly one target" in r.output
    r = CliRunner().invoke(main, ["postmortem", "--all", "--since", "soon"])
    assert r.exit_code != 0 and "--since soon: not a duration" in r.output


def test_a_fast_exit_stamped_before_its_start_is_judged() -> None:
    # podman 4.3 stamps StartedAt after start returns: `sh -c "exit 42"` finishes "earlier"
    f = facts(
        read_kernel_log([], MONO),
        info=podman_info(exit_code=42, started_s=900.004, finished_s=900.0, restarts=0),
    )
    _, [v] = judged(f)
    assert (v.cause, v.exit_code, v.ts) == ("app_exit", 42, 900 * S)


def test_a_hostile_container_name_cannot_reach_the_terminal_raw() -> None:
    info = podman_info(exit_code=42, restarts=0)
    evil = "llm\x1b]0;pwned\x07\nfake verdict"
    from dataclasses import replace

    f = facts(
        read_kernel_log([], MONO),
        target=Target("container", evil, f"podman {evil}", ids=(CID,)),
        info=replace(info, name=evil),
    )
    asm, verdicts = judged(f)
    out = report.text(f, asm, verdicts)
    assert "\x1b" not in out and "\x07" not in out and "\nfake verdict" not in out
    assert "llm\\x1b]0;pwned\\x07\\x0afake verdict" in out


UID = "6f1c2a9e-0d4b-4c1e-9a3f-2b7d8e9f0a1b"


def test_pod_kills_and_the_kubelets_logs(tmp_path: Path) -> None:
    pods = tmp_path / "pods"
    llm = pods / f"default_llm-0_{UID}" / "llm"
    llm.mkdir(parents=True)
    (llm / "2.log").write_text(
        "2026-11-30T01:08:19.1Z stdout F loading weights\n"
        "2026-11-30T01:08:20.4Z stderr F allocating KV cache: 30 GiB\n"
    )
    (llm / "3.log").write_text("2026-11-30T01:08:25.0Z stdout F loading weights\n")
    cid = "c" * 64
    kmsg = records(
        # cgroupfs driver, then the systemd driver's spelling (uid with "_"), then another pod
        oom_records(1, 500.0, 77, f"/kubepods/burstable/pod{UID}/{cid}"),
        oom_records(
            9,
            600.0,
            78,
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable"
            f"-pod{UID.replace('-', '_')}.slice/cri-containerd-{cid}.scope",
        ),
        oom_records(17, 700.0, 79, f"/kubepods/burstable/pod{'0' * 8}-{UID[9:]}/{cid}"),
    )
    w = world(tmp_path, kmsg, {})
    w.pods_log_root = str(pods)
    f = gather("pod", "default/llm-0", None, w)
    asm, verdicts = judged(f)
    assert [(v.pid, v.cause, v.unit) for v in verdicts] == [
        (77, "cgroup_oom", f"pod {UID[:8]} container {cid[:12]}"),
        (78, "cgroup_oom", f"pod {UID[:8]} container {cid[:12]}"),
    ]
    [k] = f.kubelet
    assert (k.container, k.restarts, k.last_line) == ("llm", 3, "allocating KV cache: 30 GiB")
    assert k.previous_log.endswith("/llm/2.log")
    assert "kubelet: container llm restarted 3 times" in report.text(f, asm, verdicts)
    assert report.to_json(f, asm, verdicts)["kubelet"][0]["restarts"] == 3
    with pytest.raises(UsageError, match="--pod default/nope: no such pod on this node"):
        gather("pod", "default/nope", None, w)


class FakeSystemd(FakeRuntime):
    name = "systemd"


def test_unit_oom_kill_from_systemd_and_the_kernel_log(tmp_path: Path) -> None:
    # systemctl show: ExecMainCode=2 (killed) ExecMainStatus=9, pid kept, monotonic times;
    # the kernel log's report names the unit's cgroup: two sources
    unit = killed_unit("/test/hog", 4, True, 77, int(500.2 * S) + MONO)  # Result=oom-kill
    kmsg = records(oom_records(1, 500.0, 77, "/test/hog", limit_kb=32768))
    w = world(tmp_path, kmsg, {})
    w.systemd = FakeSystemd({"model": unit})
    w.systemd.available = lambda: True  # type: ignore[method-assign]
    f = gather("unit", "model", None, w)
    _, [v] = judged(f)
    assert (v.pid, v.cause, v.confidence, v.unit) == (
        77,
        "cgroup_oom",
        "high",
        "systemd model.service",
    )
    whats = [w for _, w in v.evidence]
    assert any("systemd says systemd model.service exited with code 137" in x for x in whats)
    assert any("oom_kill counter of /test/hog reads 1" in x for x in whats)
    with pytest.raises(UsageError, match="--unit nope: systemd: no container 'nope'"):
        gather("unit", "nope", None, w)


def test_all_names_the_containers_the_kernel_log_names() -> None:
    from dataclasses import replace

    log = read_kernel_log(
        records(oom_records(100, 899.0, 2048), oom_records(300, 900.45, 2193),
                oom_records(400, 950.0, 3000, "/process_api/x/hog")),
        MONO,
    )  # fmt: skip
    f = replace(
        facts(log, target=Target("all", "", "this host")),
        others=(RuntimeState(podman_info(), NOW),),
    )
    _, verdicts = judged(f)
    assert [(v.pid, v.unit, v.confidence) for v in verdicts] == [
        (2048, "podman llm", "medium"),
        (2193, "podman llm", "high"),  # podman's record of the exit joins the kernel log's
        (3000, "dd (pid 3000)", "medium"),  # no runtime: the process names its own unit
    ]


def test_a_kill_just_before_podmans_late_start_stamp_still_counts() -> None:
    # podman stamps StartedAt after start returns: an immediate OOM kill can precede it
    log = read_kernel_log(records(oom_records(300, 899.998, 2193)), MONO)
    f = facts(log, info=podman_info(started_s=900.0, finished_s=900.01, restarts=0))
    _, [v] = judged(f)
    assert (v.pid, v.cause, v.confidence) == (2193, "cgroup_oom", "high")


def test_the_agents_journal_is_shown_when_an_agent_ran(tmp_path: Path) -> None:
    import orjson

    state = tmp_path / "state"
    state.mkdir()
    entry = {
        "schema": 1,
        "kind": "verdict",
        "key": "boot/77/500",
        "time": "2026-11-30T00:54:40+00:00",
        "ts_ns": 500 * S,
        "boot_id": "boot",
        "unit": "podman llm",
        "labels": {},
        "pid": 77,
        "comm": "dd",
        "cause": "cgroup_oom",
        "confidence": "high",
        "incident": "20261130-005440-77",
        "verdict": {"limit_cgroup": CPATH},
    }
    other = {**entry, "key": "boot/78/600", "unit": "podman other", "pid": 78}
    (state / "journal.jsonl").write_bytes(orjson.dumps(entry) + b"\n" + orjson.dumps(other) + b"\n")
    w = world(tmp_path, [], {"llm": podman_info(exit_code=42, restarts=0)})
    w.agent_state = str(state)
    f = gather("container", "llm", None, w)
    assert [e["pid"] for e in f.journal] == [77]  # only the target's
    asm, verdicts = judged(f)
    text = report.text(f, asm, verdicts)
    assert "1 verdicts about podman llm, reached from its recording" in text
    assert "20261130-005440-77" in text
    doc = report.to_json(f, asm, verdicts)
    assert doc["agent_journal"]["entries"][0]["incident"] == "20261130-005440-77"
    # no agent here: no journal, said as null
    w.agent_state = str(tmp_path / "none")
    assert (
        report.to_json(gather("container", "llm", None, w), asm, verdicts)["agent_journal"] is None
    )
