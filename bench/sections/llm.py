"""Section llm: llama.cpp's real `llama-server` (scripts/build-llama, the generated 272 MiB
model of llm/model.py) serving a fixed prompt set bare, under `whyrestart record` and beside
`whyrestart agent`, round-robin over --rounds (the order rotated every round).

Each run starts a fresh server pinned to --storm-cpu with --llm-threads threads, waits for its
/health to answer 200, sends one unmeasured request (the first pages the weights in), then
--llm-requests `/completion` requests one after another, cycling over llm.server.PROMPTS, each
generating exactly --llm-tokens tokens greedily with a fixed seed. Measured: tokens/s (all the
tokens generated over the wall time of the requests, as a client sees it), the server's own
generation rate (its `timings`), and each request's latency (p50, p99). The tools run pinned to
--tool-cpu: `record` wraps the server's command (with an http probe of its /health once a
second, as the README records a server), the agent (a fresh state dir, metrics on a free port)
is ready before the server starts; their CPU and RSS are read while the server runs. The ratios
are each round's variant over that round's bare, medians over the rounds.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.machine import cpu_snapshot, foreign_cpu
from bench.options import Options
from bench.procs import Popen, kill_all, loadavg, proc_cpu_s, proc_status_kb, reap, say, spawn
from bench.records import Section
from bench.report import med, method_lines
from bench.runner import Context, stop_tool
from bench.sections.agent import Agent
from bench.tools import Whyrestart
from llm.server import PROMPTS, SEED, BuildFailed, Built, argv, built, free_port, wait_healthy
from llm.server import complete as completion

VARIANTS = ("bare", "record", "agent")
Result = dict[str, Any]  # one run's raw numbers, as --json keeps them
LOAD_CAP_S = 120.0  # a server not healthy by then fails the run


def _percentile(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) of xs by linear interpolation between the closest ranks."""
    ys = sorted(xs)
    k = (len(ys) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)


class Tool:
    """The process that watches the server in a run (None for bare), and its CPU and RSS."""

    def __init__(self, proc: Popen | None) -> None:
        self.proc = proc
        self.cpu0: float | None = None
        self.rss_kb: list[int] = []

    def start_window(self) -> None:
        if self.proc is not None:
            self.cpu0 = proc_cpu_s(self.proc.pid)
            self.sample()

    def sample(self) -> None:
        if self.proc is not None:
            kb = proc_status_kb(self.proc.pid, "VmRSS")
            if kb is not None:
                self.rss_kb.append(kb)

    def window(self, seconds: float) -> Result:
        if self.proc is None:
            return {}
        c1 = proc_cpu_s(self.proc.pid)
        cpu = c1 - self.cpu0 if c1 is not None and self.cpu0 is not None else None
        return {
            "tool_cpu_s": cpu,
            "tool_cpu_pct": cpu / seconds * 100 if cpu is not None and seconds else None,
            "tool_rss_max_mib": max(self.rss_kb) / 1024 if self.rss_kb else None,
            "tool_vmhwm_mib": (proc_status_kb(self.proc.pid, "VmHWM") or 0) / 1024 or None,
        }


def _server(opts: Options, b: Built, port: int) -> list[str]:
    extra = ("-np", "1", "-c", str(opts.llm_ctx))
    return opts.pinned(argv(b.binary, b.model, port, *extra, threads=opts.llm_threads))


def _serve(opts: Options, port: int, server: Popen, tool: Tool) -> Result:
    """Wait for the server, warm it up, run the measured requests; the numbers."""
    res: Result = {"load_s": wait_healthy(port, LOAD_CAP_S, lambda: server.poll() is None)}
    completion(port, PROMPTS[0], opts.llm_tokens)  # unmeasured: pages the weights in
    tool.start_window()
    latencies: list[float] = []
    rates: list[float] = []
    tokens = 0
    t0 = time.monotonic()
    for i in range(opts.llm_requests):
        a = completion(port, PROMPTS[i % len(PROMPTS)], opts.llm_tokens)
        latencies.append(a.latency_s)
        rates.append(a.tokens_per_s)
        tokens += a.tokens
        tool.sample()
    wall = time.monotonic() - t0
    res.update(
        tokens=tokens,
        wall_s=wall,
        per_s=tokens / wall,
        server_tok_s=statistics.median(rates),
        p50_s=_percentile(latencies, 0.5),
        p99_s=_percentile(latencies, 0.99),
        latencies_s=latencies,
    )
    res.update(tool.window(wall))
    return res


def _run_bare(opts: Options, tmp: Path, b: Built) -> Result:
    port = free_port()
    with open(tmp / "server.err", "wb") as fe:
        server = spawn(_server(opts, b, port), stdout=subprocess.DEVNULL, stderr=fe)
    try:
        return _serve(opts, port, server, Tool(None))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        reap(server, 30)


def _run_record(opts: Options, tmp: Path, b: Built) -> Result:
    port = free_port()
    cmd = [
        "taskset", "-c", str(opts.tool_cpu), opts.whyrestart_exe(), "record", "-q",
        "-o", str(tmp / "wr.trace"), "--probe", f"http://127.0.0.1:{port}/health",
        "--", *_server(opts, b, port),
    ]  # fmt: skip
    with open(tmp / "tool.stderr", "wb") as fe:
        rec = spawn(cmd, stdout=subprocess.DEVNULL, stderr=fe)
    try:
        res = _serve(opts, port, rec, Tool(rec))
    finally:
        stopped = stop_tool(opts, rec)  # SIGINT: record passes it to the server, then ends
    res["tool_rc"] = stopped.get("tool_rc")
    return res


def _run_agent(opts: Options, tmp: Path, b: Built) -> Result:
    agent = Agent(opts, tmp)
    try:
        res: Result = {"agent_ready_s": agent.wait_ready(opts.startup_cap)}
        port = free_port()
        with open(tmp / "server.err", "wb") as fe:
            server = spawn(_server(opts, b, port), stdout=subprocess.DEVNULL, stderr=fe)
        try:
            res.update(_serve(opts, port, server, Tool(agent.proc)))
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            reap(server, 30)
    finally:
        stopped = agent.stop()
    res["tool_rc"] = stopped.get("tool_rc")
    return res


RUNNERS = {"bare": _run_bare, "record": _run_record, "agent": _run_agent}


def run(opts: Options, tmp: Path, ctx: Context) -> Section:
    v = Whyrestart(opts, "llm")
    missing = v.missing()
    if missing:
        return Section(f"## llm\n\nwhyrestart {missing}\n", {"skipped": {"whyrestart": missing}})
    ctx.versions.setdefault("whyrestart", v.version())
    try:
        b = built(timeout=3600, quiet=False)
    except BuildFailed as exc:
        why = f"llama-server could not be built (scripts/build-llama): {exc}"
        say(f"llm: {why}")
        return Section(_report(opts, [], why, {}), {"skipped": {"llama-server": why}})
    load = {"before": loadavg()}
    runs: list[Result] = []
    total = opts.rounds * len(VARIANTS)
    for rnd in range(opts.rounds):
        k = rnd % len(VARIANTS)
        for name in VARIANTS[k:] + VARIANTS[:k]:
            d = tmp / f"llm-r{rnd}-{name}"
            d.mkdir()
            t0, cpu0 = time.monotonic(), cpu_snapshot()
            try:
                res = {"variant": name, "round": rnd, **RUNNERS[name](opts, d, b)}
            except Exception as exc:  # a failed run is reported, the others go on
                res = {"variant": name, "round": rnd, "error": repr(exc)}
            finally:
                kill_all()
            # what else ran meanwhile: on a shared machine, the number that says a run is noise
            res["foreign_cpu_pct"] = foreign_cpu(cpu0)["other_s"] / (time.monotonic() - t0) * 100
            runs.append(res)
            msg = f"llm [{len(runs)}/{total}] round {rnd + 1} {name}: "
            if "error" in res:
                msg += f"FAILED: {res['error'][:200]}"
            else:
                msg += f"{res['per_s']:.1f} tokens/s, p50 {res['p50_s']:.3f} s"
            say(msg)
            if not opts.keep_tmp:
                shutil.rmtree(d, ignore_errors=True)
    load["after"] = loadavg()
    model = {"model": str(b.model), "model_bytes": b.model.stat().st_size}
    return Section(_report(opts, runs, None, model), {"runs": runs, "loadavg": load, **model})


def _ratio(runs: list[Result], name: str, key: str) -> float | None:
    """Median over rounds of the variant's ``key`` over bare's, same round."""
    bare = {r["round"]: r[key] for r in runs if r["variant"] == "bare" and "error" not in r}
    return med(
        [
            r[key] / bare[r["round"]]
            for r in runs
            if r["variant"] == name and "error" not in r and bare.get(r["round"])
        ]
    )


def _f(x: Any, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _report(opts: Options, runs: list[Result], skipped: str | None, model: Result) -> str:
    out = [
        f"## llama.cpp llama-server: tokens/s and latency, {opts.rounds} round(s) x "
        f"{opts.llm_requests} requests of {opts.llm_tokens} tokens",
        "",
        "| variant | tokens/s | ratio to bare | server gen tok/s | p50 s | p50 ratio | p99 s "
        "| p99 ratio | tool CPU % of a core | tool RSS max MB | CPU not ours % |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    if skipped is not None:
        return "\n".join([*out, f"| all | skipped: {skipped} |" + " |" * 9]) + "\n"
    for name in VARIANTS:
        ok = [r for r in runs if r["variant"] == name and "error" not in r]
        if not ok:
            errs = [r["error"] for r in runs if r["variant"] == name and "error" in r]
            out.append(f"| {name} | failed: {(errs or ['no run'])[0][:80]} |" + " |" * 9)
            continue
        bare = name == "bare"

        def m(key: str, rs: list[Result] = ok) -> float | None:
            return med([r.get(key) for r in rs])

        def ratio(key: str, name: str = name, bare: bool = bare) -> str:
            return "1.00x" if bare else _f(_ratio(runs, name, key), ".3f") + "x"

        out.append(
            f"| {name} | {_f(m('per_s'), '.1f')} | {ratio('per_s')} "
            f"| {_f(m('server_tok_s'), '.1f')} | {_f(m('p50_s'), '.3f')} | {ratio('p50_s')} "
            f"| {_f(m('p99_s'), '.3f')} | {ratio('p99_s')} "
            f"| {'-' if bare else _f(m('tool_cpu_pct'), '.2f')} "
            f"| {'-' if bare else _f(m('tool_rss_max_mib'), '.1f')} "
            f"| {_f(m('foreign_cpu_pct'), '.0f')} |"
        )
    failed = [r for r in runs if "error" in r]
    if failed:
        out += ["", f"{len(failed)} run(s) failed; the first: {failed[0]['error'][:300]}"]
    out += method_lines(
        [
            "llama.cpp's `llama-server` (scripts/build-llama: CPU only, GGML_NATIVE=OFF) serving "
            "the generated {model_mib:.1f} MiB llama model (llm/model.py: 1024 wide, 6 layers, "
            "F16, random weights from a seed), `-t {llm_threads} -np 1 -c {llm_ctx} "
            "--no-warmup`, pinned to CPU {storm_cpu} with taskset; the tools pinned to CPU "
            "{tool_cpu}. A fresh server per run; the variants run round-robin for {rounds} "
            "round(s), the order rotated every round.",
            "Per run: /health polled until 200, one unmeasured request (the first pages the "
            "weights in), then {llm_requests} `/completion` requests one after another over "
            "llm.server.PROMPTS ({prompts} prompts, in order), each `n_predict` {llm_tokens} "
            "with `ignore_eos`, temperature 0, seed {seed}, no prompt cache.",
            "**tokens/s**: tokens generated over the requests' wall time, as the client sees "
            "it; **server gen tok/s**: the server's own `timings.predicted_per_second`, median "
            "over the requests; **p50/p99**: each request's latency, client side (with "
            "{llm_requests} requests, p99 is about the slowest). Every figure is the median "
            "over rounds; a **ratio** is each round's variant over that round's bare, median "
            "over rounds (tokens/s: 1.00x is no cost, lower is slower; latency: higher is "
            "slower).",
            "**record**: `whyrestart record -q -o TRACE --probe http://127.0.0.1:PORT/health "
            "-- SERVER` (probe once a second); **agent**: `whyrestart agent` (fresh state dir, "
            "--log-format none, metrics on a free port), ready before the server starts. "
            "**tool CPU**: its utime+stime from /proc/PID/stat over the measured requests, in "
            "% of a core; **tool RSS**: its VmRSS, the largest of the samples taken before the "
            "requests and after each one. **CPU not ours**: busy CPU (/proc/stat) during the run "
            "that neither the bench nor anything it started used (other users of the machine, "
            "kernel overhead), in % of a core: a run beside a busy neighbour is noise, not cost.",
        ],
        opts,
        model_mib=model.get("model_bytes", 0) / (1 << 20),
        prompts=len(PROMPTS),
        seed=SEED,
    )
    return "\n".join(out) + "\n"
