"""Tier 3 (root): a Kubernetes node's runtime for real: the session's private containerd
(tests/containerd.py) driven over CRI as a kubelet drives it (tests/cri), recorded as
``whyrestart record --pod NS/NAME`` records a pod: its cgroup (``/kubepods/burstable/pod<uid>``,
made with the pod's limit as the kubelet's pod container manager makes it) and every container
below it. The recorder finds the runtime as crictl does (``CONTAINER_RUNTIME_ENDPOINT``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from tests.containerd import ContainerdNode
from tests.cri import Cri, Kubelet, pb
from tests.recording import record_while, wait_for
from tracer.cli import main

pytestmark = pytest.mark.root

MiB = 1024 * 1024
AWK_HOG = 'BEGIN { s = "xxxxxxxxxxxxxxxx"; while (1) s = s s }'
# the kubelet waits before each restart (CrashLoopBackOff: 10 s, doubling); a short one here
BACKOFF_S = 2.0


@pytest.fixture
def kubelet(
    containerd_node: ContainerdNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Kubelet]:
    """One pod (namespace wrcri, a name of this run) on the session's containerd: its cgroup
    made, its sandbox running; removed after, cgroups included."""
    monkeypatch.setenv("CONTAINER_RUNTIME_ENDPOINT", f"unix://{containerd_node.socket}")
    cri = Cri(containerd_node.socket)
    k = Kubelet(cri, "wrcri", f"crihog{time.time_ns() % 10**9}", log_dir=str(tmp_path / "pod"))
    try:
        yield k
    finally:
        try:
            k.remove()
        finally:
            k.remove_pod_cgroup()
            cri.close()


def run_to_exit(k: Kubelet, image: str, command: list[str], limit: int) -> tuple[str, object]:
    """A new attempt of container "hog": created, started, waited for until it has exited."""
    cid = k.create("hog", image, command, memory_limit=limit)
    k.start(cid)
    wait_for(lambda: k.status(cid).state == pb.CONTAINER_EXITED, 60, f"attempt of {cid[:12]}")
    return cid, k.status(cid)


def test_a_container_oom_killed_by_its_limit_and_restarted_twice_by_attempts(
    tmp_path: Path, kubelet: Kubelet, containerd_node: ContainerdNode
) -> None:
    """memory limit 32 MiB and a program that outgrows it; restarted as the kubelet restarts
    (attempt 1, 2: new containers): three cgroup OOMs named ns/pod/container, two restarts
    linked, and the kubelet's count (the attempt, 2) agreeing with them."""
    k = kubelet
    k.make_pod_cgroup()
    k.run_sandbox()
    statuses = []

    def crash_loop() -> None:
        for attempt in range(3):
            if attempt:
                time.sleep(BACKOFF_S)
            statuses.append(run_to_exit(k, containerd_node.image, ["awk", AWK_HOG], 32 * MiB)[1])

    res = record_while(tmp_path, "", crash_loop, cgroups=[k.cgroup_parent])
    # containerd's own record of each attempt
    assert [(s.metadata.attempt, s.exit_code, s.reason) for s in statuses] == [  # type: ignore[attr-defined]
        (n, 137, "OOMKilled") for n in range(3)
    ]
    unit = f"pod wrcri/{k.name} container hog"
    assert [(v.cause, v.unit, v.main, v.confidence) for v in res.verdicts] == [
        ("cgroup_oom", unit, True, "high")
    ] * 3
    assert all(v.limit_bytes == 32 * MiB for v in res.verdicts)
    assert all(
        re.fullmatch(rf"{k.cgroup_parent}/[0-9a-f]{{64}}", v.limit_cgroup or "")
        for v in res.verdicts
    )
    assert [(r.unit, r.cause) for r in res.restarts] == [(unit, "cgroup_oom")] * 2
    assert res.restart_counts == [(unit, 2, 2, "containerd")]


def test_a_stop_whose_grace_runs_out_is_a_signal_kill(
    tmp_path: Path, kubelet: Kubelet, containerd_node: ContainerdNode
) -> None:
    """StopContainer with a 2 s timeout on a container that ignores SIGTERM (its shell sets
    it ignored, and sleep inherits that): containerd sends SIGKILL once the grace is out;
    whyrestart says signal_kill with the grace it saw."""
    k = kubelet
    k.make_pod_cgroup()
    k.run_sandbox()
    cid = k.create(
        "hog", containerd_node.image, ["sh", "-c", "trap '' TERM; sleep 300"], memory_limit=32 * MiB
    )
    k.start(cid)

    def stop() -> None:
        k.stop(cid, timeout_s=2)

    res = record_while(tmp_path, "", stop, cgroups=[k.cgroup_parent])
    st = k.status(cid)
    assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 137, "Error")
    unit = f"pod wrcri/{k.name} container hog"
    main = [v for v in res.verdicts if v.main]
    assert [(v.cause, v.unit) for v in main] == [("signal_kill", unit)]
    m = re.search(r"SIGTERM, then SIGKILL (\d+\.\d) s later", main[0].summary)
    assert m is not None, main[0].summary
    assert float(m.group(1)) >= 2.0


def test_a_pod_level_limit_hit_by_a_container_without_one_names_the_pods_cgroup(
    tmp_path: Path, kubelet: Kubelet, containerd_node: ContainerdNode
) -> None:
    """The pod's cgroup limited to 32 MiB (the kubelet's pod-level limit), its container
    unlimited: the OOM kill is the pod's cgroup's, an ancestor of the container's."""
    k = kubelet
    k.make_pod_cgroup(memory_limit=32 * MiB)
    k.run_sandbox()
    out: list[object] = []

    def run() -> None:
        out.append(run_to_exit(k, containerd_node.image, ["awk", AWK_HOG], 0)[1])

    res = record_while(tmp_path, "", run, cgroups=[k.cgroup_parent])
    st = out[0]
    assert (st.exit_code, st.reason) == (137, "OOMKilled")  # type: ignore[attr-defined]
    unit = f"pod wrcri/{k.name} container hog"
    assert [
        (v.cause, v.unit, v.main, v.limit_cgroup, v.limit_scope, v.limit_bytes)
        for v in res.verdicts
    ] == [("cgroup_oom", unit, True, k.cgroup_parent, "ancestor", 32 * MiB)]


def test_a_child_oom_then_a_graceful_stop_is_a_stop_whatever_containerd_says(
    tmp_path: Path, kubelet: Kubelet, containerd_node: ContainerdNode
) -> None:
    """A child (awk) OOM-killed in a container that keeps running; then StopContainer: its
    shell handles SIGTERM and exits 143. containerd says "OOMKilled" for that exit (it reads
    the cgroup's cumulative OOM counter, kubernetes#140718); whyrestart says the stop was a
    stop (signal_kill, by the runtime, SIGTERM handled), quotes containerd's record and says
    it disagrees, and names the child's OOM kill, earlier, as a verdict of the same unit
    (recorded as --container NS/POD/CONTAINER: the runtime is asked as the main process ends)."""
    k = kubelet
    k.make_pod_cgroup()
    k.run_sandbox()
    script = f"trap 'exit 143' TERM; awk '{AWK_HOG}'; sleep 300 & wait $!"
    cid = k.create("hog", containerd_node.image, ["sh", "-c", script], memory_limit=32 * MiB)

    def run() -> None:
        k.start(cid)
        wait_for(lambda: b"oom_kill 1" in _memory_oom_control(k.cgroup_parent, cid), 60, "awk")
        k.stop(cid, timeout_s=10)

    res = record_while(tmp_path, f"wrcri/{k.name}/hog", run)
    st = k.status(cid)
    assert (st.exit_code, st.reason) == (143, "OOMKilled")  # containerd's word: wrong
    unit = f"pod wrcri/{k.name} container hog"
    child = [v for v in res.verdicts if not v.main and v.cause == "cgroup_oom"]
    assert [(v.unit, v.limit_bytes) for v in child] == [(unit, 32 * MiB)]
    main = [v for v in res.verdicts if v.main]
    assert [(v.cause, v.unit, v.exit_code) for v in main] == [("signal_kill", unit, 143)]
    assert "SIGTERM, which it handled: it exited with code 143" in main[0].summary
    # containerd's reason beside ours, and the disagreement said
    assert main[0].disagreements == ("containerd says OOMKilled",)
    assert main[0].confidence == "medium"
    assert any(
        f"containerd recorded exit code 143 for {unit} (its OOMKilled flag: True)" in what
        for _, what in main[0].evidence
    )
    assert child[0].ts < main[0].ts


def _memory_oom_control(pod_cgroup: str, cid: str) -> bytes:
    try:
        return Path(f"/sys/fs/cgroup/memory{pod_cgroup}/{cid}/memory.oom_control").read_bytes()
    except OSError:
        return b""


def test_pod_and_container_resolve_through_the_cri_socket(
    tmp_path: Path,
    kubelet: Kubelet,
    containerd_node: ContainerdNode,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--pod NS/NAME finds the pod's cgroup through CRI (the pod's logs are not under
    /var/log/pods here: only the runtime knows it), and --container NS/POD/CONTAINER finds
    the newest attempt's container; a pod the runtime lacks is an error naming where it looked."""
    from tracer.runtimes import probe
    from tracer.runtimes.kubernetes import resolve_pod
    from tracer.sources.cgroupfs import CgroupLayout, CgroupResolver

    k = kubelet
    k.make_pod_cgroup()
    k.run_sandbox()
    first = k.create("hog", containerd_node.image, ["true"])
    newest = k.create("hog", containerd_node.image, ["true"])
    resolver = CgroupResolver(CgroupLayout.from_system())
    assert resolve_pod(f"wrcri/{k.name}", resolver) == k.cgroup_parent
    [cri] = [rt for rt in probe()[0] if rt.name == "containerd"]
    for spec in (f"wrcri/{k.name}/hog", f"{k.name}/hog", newest[:12]):
        info = cri.find(spec)
        assert info is not None, (spec, cri.last_error)
        assert (info.id, info.name, info.pod, info.namespace, info.restart_count) == (
            newest,
            "hog",
            k.name,
            "wrcri",
            1,
        )
    assert cri.by_id(first) is not None and cri.by_id(first).restart_count == 0  # type: ignore[union-attr]
    monkeypatch.delenv("CONTAINER_RUNTIME_ENDPOINT")  # the option alone, now
    r = CliRunner().invoke(
        main,
        [
            "record",
            "-q",
            "-o",
            str(tmp_path / "x.trace"),
            "--pod",
            "wrcri/wr-no-such-pod",
            "--runtime-endpoint",
            f"unix://{containerd_node.socket}",
        ],
    )
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert f"containerd at {containerd_node.socket} has no sandbox for it" in r.output
    assert "/var/log/pods/wrcri_wr-no-such-pod_<uid> not found" in r.output


def test_a_followed_container_is_followed_across_its_attempts(
    tmp_path: Path, kubelet: Kubelet, containerd_node: ContainerdNode
) -> None:
    """--container NS/POD/CONTAINER through CRI: each restart is a new container in a new
    cgroup, found by its pod and name, not by the first one's id (its pod's cgroup is watched:
    the new cgroup's path is not known ahead); a container of the same name in another pod is
    not followed."""
    k = kubelet
    k.make_pod_cgroup()
    k.run_sandbox()
    other = Kubelet(k.cri, "wrcri", f"{k.name}b", log_dir=str(tmp_path / "other"))
    other.make_pod_cgroup()
    other.run_sandbox()
    try:
        first = k.create("hog", containerd_node.image, ["awk", AWK_HOG], memory_limit=32 * MiB)

        def crash_loop() -> None:
            k.start(first)
            wait_for(lambda: k.status(first).state == pb.CONTAINER_EXITED, 60, "attempt 0")
            time.sleep(BACKOFF_S)
            run_to_exit(k, containerd_node.image, ["awk", AWK_HOG], 32 * MiB)
            # the other pod's "hog" (same name, exit 3): not ours
            run_to_exit(other, containerd_node.image, ["sh", "-c", "exit 3"], 32 * MiB)

        res = record_while(tmp_path, f"wrcri/{k.name}/hog", crash_loop)
    finally:
        try:
            other.remove()
        finally:
            other.remove_pod_cgroup()
    unit = f"pod wrcri/{k.name} container hog"
    assert [(v.cause, v.unit) for v in res.verdicts if v.main] == [("cgroup_oom", unit)] * 2
    assert [(r.unit, r.cause) for r in res.restarts] == [(unit, "cgroup_oom")]
    assert res.restart_counts == [(unit, 1, 1, "containerd")]


def test_the_agent_labels_a_pods_oom_kill_from_cri(
    tmp_path: Path, kubelet: Kubelet, containerd_node: ContainerdNode
) -> None:
    """The always-on agent, finding the node's runtime as crictl does: a pod container's OOM
    kills (attempt 0, then the kubelet's restart as attempt 1) are counted in /metrics and
    logged as JSON under its namespace, pod and container, each with the pod uid, container id
    and restart count containerd's ContainerStatus gives for that attempt (OpenTelemetry's
    k8s.pod.uid, container.id, k8s.container.restart_count, container.runtime.name), in its
    log line and its journal entry alike."""
    from tests.cri import POD_UID
    from tests.test_agent_root import AgentProc, until
    from tracer.agent.journal import read_journal

    k = kubelet
    k.make_pod_cgroup()
    k.run_sandbox()
    env = {"CONTAINER_RUNTIME_ENDPOINT": f"unix://{containerd_node.socket}"}
    agent = AgentProc(tmp_path / "state", env=env)
    labels = ('container="hog"', 'namespace="wrcri"', f'pod="{k.name}"')

    def counted(name: str = "whyrestart_oom_kills_total") -> list[str]:
        return [
            ln
            for ln in agent.metrics().splitlines()
            if ln.startswith(name + "{") and all(x in ln for x in labels)
        ]

    try:
        agent.wait_ready()
        attempts = []
        for n in range(2):
            if n:
                time.sleep(BACKOFF_S)
            attempts.append(run_to_exit(k, containerd_node.image, ["awk", AWK_HOG], 32 * MiB))
            want = f" {n + 1}.0"  # (each kill counted before the next attempt starts)
            until(lambda: any(ln.endswith(want) for ln in counted()), 60)  # noqa: B023
        ooms = counted()
        assert len(ooms) == 1 and ooms[0].endswith(" 2.0"), ooms
        # one info series, the newest attempt's container; its count a value, not a label
        last_id = attempts[-1][0]
        info = counted("whyrestart_container_info")
        assert len(info) == 1 and f'container_id="{last_id}"' in info[0], info
        assert f'pod_uid="{k.uid}"' in info[0] and 'container_runtime="containerd"' in info[0]
        assert [ln.rsplit(" ", 1)[1] for ln in counted("whyrestart_container_restarts")] == ["1.0"]
        code, out = agent.stop()
        assert code == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
    unit = f"pod wrcri/{k.name} container hog"
    lines = [orjson.loads(ln) for ln in out.splitlines()]
    mine = [ln["attributes"] for ln in lines if ln["attributes"].get("whyrestart.unit") == unit]
    assert [a["whyrestart.cause"] for a in mine] == ["cgroup_oom"] * 2, lines[-3:]
    # what containerd returned for each attempt, read back over CRI
    said = [(cid, st.labels[POD_UID], st.metadata.attempt) for cid, st in attempts]  # type: ignore[attr-defined]
    assert [s[1] for s in said] == [k.uid] * 2 and [s[2] for s in said] == [0, 1]
    got = [(a["container.id"], a["k8s.pod.uid"], a["k8s.container.restart_count"]) for a in mine]
    assert got == said
    for a in mine:
        assert (a["k8s.namespace.name"], a["k8s.pod.name"], a["k8s.container.name"]) == (
            "wrcri",
            k.name,
            "hog",
        )
        assert a["container.runtime.name"] == "containerd"
    state = tmp_path / "state"
    journal = read_journal(str(state / "journal.1.jsonl"), str(state / "journal.jsonl"))
    entries = [e for e in journal if e["kind"] == "verdict" and e["unit"] == unit]
    assert [(e["attributes"]["container.id"], e["attributes"]["k8s.pod.uid"]) for e in entries] == [
        s[:2] for s in said
    ]


def test_postmortem_of_a_pods_container_reads_its_container_status(
    kubelet: Kubelet, containerd_node: ContainerdNode
) -> None:
    """postmortem --container NS/POD/CONTAINER after the fact, no recording: the kernel's
    OOM report judged with containerd's record of the exit (ContainerStatus: exit code 137,
    OOMKilled), under the pod's names."""
    k = kubelet
    k.make_pod_cgroup()
    k.run_sandbox()
    run_to_exit(k, containerd_node.image, ["awk", AWK_HOG], 32 * MiB)
    r = CliRunner().invoke(
        main, ["postmortem", "--container", f"wrcri/{k.name}/hog", "--since", "5m", "--json"]
    )
    assert r.exit_code == 0, r.output
    doc = orjson.loads(r.output)
    unit = f"pod wrcri/{k.name} container hog"
    assert doc["target"]["label"] == unit
    rt = doc["runtime"]
    assert (rt["source"], rt["name"], rt["exit_code"], rt["oom_killed"]) == (
        "containerd",
        "hog",
        137,
        True,
    )
    assert [(v["cause"], v["unit"], v["confidence"]) for v in doc["verdicts"]] == [
        ("cgroup_oom", unit, "high")
    ]
    said = [e["what"] for e in doc["verdicts"][0]["evidence"]]
    assert f"containerd says {unit} exited with code 137 (its OOMKilled flag: True)" in said
