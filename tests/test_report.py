"""Tier 1: the timeline model and the HTML/PNG report, from real recorded traces; the page is
rendered by headless Chromium (Debian's package) when it is installed.

``data/nested_v1_oom.trace`` was recorded on the v1 development VM (as root) with the recorder
of this repository: a Python process in ``wr-report/app`` (limit 128 MiB) under ``wr-report``
(limit 96 MiB) writes 8 MiB to a memfd (shmem), 12 MiB to a file (page cache), then allocates
4 MiB every 50 ms until the *parent's* limit kills it; ``stall_threshold_ns`` was 1 ms so that
single reclaim stalls were recorded too. ``data/demo_v1_oom.trace`` is an older recording
without samplers: the report must still draw its limit and markers.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.streams import header
from tracer.cli import main
from tracer.events import (
    CgroupInfo,
    CgroupSample,
    EffectiveLimit,
    Event,
    Exec,
    Exit,
    GpuAllocFailure,
    GpuProcessSample,
    GpuSample,
    ProbeSample,
)
from tracer.outputs import report
from tracer.outputs.timeline import build, load, thin
from tracer.parse.cgpath import is_ancestor
from tracer.trace.format import TraceHeader

DATA = Path(__file__).parent / "data"
NESTED = DATA / "nested_v1_oom.trace"
DEMO = DATA / "demo_v1_oom.trace"
SESSION = "/process_api/8cc8fa5152fae0761ec959a6a71a95d3"
PARENT = f"{SESSION}/wr-report"
APP = f"{PARENT}/app"
MiB = 1024 * 1024

# Drawing needs matplotlib (the `report` extra, part of `dev`: scripts/setup installs it).
draws = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib not installed (pip install -e '.[dev]' or scripts/setup)",
)


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


# -- the model --------------------------------------------------------------------------------


def test_nested_limits_and_the_effective_one() -> None:
    t = load(NESTED)
    [u] = t.units
    assert u.label == "python (pid 4563)"
    assert [v.cause for v in u.verdicts] == ["cgroup_oom"]
    # the process started in the session's cgroup and moved into app: app is where it lives
    assert [c.path for c in u.cgroups] == [APP]
    assert [c.path for c in u.leaves] == [APP]
    limits = {(ln.path, ln.own): sorted(set(ln.values())) for ln in u.limits}
    assert limits == {(APP, True): [128 * MiB], (PARENT, False): [96 * MiB]}
    assert [a.path for a in u.ancestors] == [PARENT]
    [eff] = u.effective
    assert eff.path == APP
    assert {(v, by) for _, v, by in eff.points} == {(96 * MiB, PARENT)}
    assert eff.label() == f"effective limit 96.0 MiB (set by {PARENT})"
    kinds = [m.kind for m in u.markers]
    assert kinds.count("oom") == 1 and kinds.count("exit") == 1
    assert len(u.stalls) == 4 and len(u.summaries) == 1
    leaf = u.leaves[0]
    # the kernel's high-water mark (memory.max_usage_in_bytes) counts, not only the samples
    assert leaf.peak_usage() == max(v or 0 for v in (*leaf.usage, *leaf.peak))
    assert (leaf.peak_usage() or 0) > 95 * MiB


def test_a_trace_without_samples_still_has_its_limit() -> None:
    t = load(DEMO)
    [u] = t.units
    assert len(u.verdicts) == 5
    # no samplers in this old trace: the limit comes from CgroupInfo / the OOM kill
    [line] = u.limits
    assert line.values() and set(line.values()) == {64 * MiB}
    assert not any(c.sampled for c in u.cgroups)
    assert {m.kind for m in u.markers} == {"oom", "signal", "exit"}


def test_a_restart_is_a_marker_of_its_unit() -> None:
    cg = 9
    events: list[Event] = [
        CgroupInfo(0, cg, "/system.slice/api.service", "memory", None),
        Exec(10, 100, "api", "/usr/bin/api", cg),
        Exit(2_000_000_000, 100, 1, "api", cg, 1 << 8, 10),  # exit code 1
        Exec(3_000_000_000, 101, "api", "/usr/bin/api", cg),  # the supervisor started it again
        Exit(5_000_000_000, 101, 1, "api", cg, 0, 3_000_000_000),
    ]
    t = build(_header(), events)
    [u] = t.units
    assert u.label == "api.service"
    [r] = u.restarts
    assert (r.old_pid, r.new_pid, r.cause) == (100, 101, "app_exit")
    restart = [m for m in u.markers if m.kind == "restart"]
    assert [m.label for m in restart] == ["restart → pid 101"]
    from tracer.outputs.perfetto import export

    names = {e["name"] for e in export(t, "x")["traceEvents"] if e["ph"] == "i"}
    assert "restart → pid 101" in names


def test_thin_keeps_peaks() -> None:
    points = [(i, float(i % 100)) for i in range(10_000)]
    points[5_555] = (5_555, 1e9)
    out = thin(points, 400)
    assert len(out) <= 400
    assert (5_555, 1e9) in out
    assert out == sorted(out)
    assert thin(points[:10], 400) == points[:10]


def test_is_ancestor() -> None:
    assert is_ancestor("/", "/a")
    assert is_ancestor("/a", "/a/b")
    assert not is_ancestor("/a", "/ab")
    assert not is_ancestor("/a", "/a")


def test_short_path_trims_ids_only() -> None:
    assert report.short_path(APP) == "/process_api/8cc8fa51…/wr-report/app"
    assert report.short_path("/system.slice/llama.service") == "/system.slice/llama.service"


# -- the HTML page ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nested_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "nested.html"
    code, _, err = run("report", str(NESTED), "-o", str(out))
    assert code == 0, err
    assert "report written to" in err
    return out


@draws
def test_html_is_self_contained_and_has_verdict_and_limits(nested_html: Path) -> None:
    page = nested_html.read_text()
    assert page.startswith("<!doctype html>")
    # offline: no script, no stylesheet or image fetched from anywhere
    lowered = page.lower()
    for needle in ("<script", "<link", 'src="http', "src='http", "@import", "url(http"):
        assert needle not in lowered, needle
    assert page.count("<svg") == 2  # the unit's timeline and the host's
    assert "cgroup_oom" in page
    assert "OOM-killed: " + PARENT + " hit its limit 96.0 MiB (the ancestor)" in page
    # the limits, in the table (full paths) and in the chart's legend (text kept as text)
    assert f"limit {PARENT}: 96.0 MiB" in page
    assert f"limit {APP}: 128.0 MiB" in page
    assert "effective limit 96.0 MiB" in page
    assert "limit /process_api/8cc8fa51…/wr-report: 96.0 MiB" in page
    # each verdict's evidence
    assert "kernel log: CONSTRAINT_MEMCG" in page
    assert "advice: peak" in page
    assert "OOM kill pid 4563" in page  # the marker's label on the chart


@draws
def test_png_option(tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    png = tmp_path / "r.png"
    code, _, err = run("report", str(NESTED), "-o", str(html), "--png", str(png))
    assert code == 0, err
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(png) as im:
        assert im.width == 1200 and im.height > 1000
        colours = im.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # drawn charts, not a blank canvas


@draws
def test_default_output_name_and_old_trace(tmp_path: Path) -> None:
    trace = tmp_path / "demo.trace"
    trace.write_bytes(DEMO.read_bytes())
    code, _, err = run("report", str(trace))
    assert code == 0, err
    page = (tmp_path / "demo.html").read_text()
    assert page.count("cause cause-cgroup_oom") >= 1
    assert "signal_kill" in page
    assert "no memory samples of this unit" in page
    assert "64.0 MiB" in page


@draws
def test_unwritable_output_is_a_clear_error(tmp_path: Path) -> None:
    code, _, err = run("report", str(NESTED), "-o", str(tmp_path / "no" / "x.html"))
    assert code == 2  # refused before any work, naming the option
    assert "does not exist" in err and "'-o' / '--output'" in err and "Traceback" not in err


def test_missing_matplotlib_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(report.ReportUnavailable) as info:
        report.render_html(load(DEMO), "x")
    assert "whyrestart[report]" in str(info.value)


def _header() -> TraceHeader:
    return header(cgroup={"mode": "v2", "memory_version": 2}, started_ns=1_000_000_000)


def _gpu_probe_events() -> list[Event]:
    s = 1_000_000_000
    cg = 77
    ev: list[Event] = [
        CgroupInfo(s, cg, "/svc.slice/llm.service", "unified", 512 * MiB),
        Exec(s + 1, 42, "serve", "/usr/bin/serve", cg),
        EffectiveLimit(s + 2, cg, "/svc.slice/llm.service", 512 * MiB, "/svc.slice/llm.service"),
    ]
    for i in range(10):
        ts = s + (i + 1) * 100_000_000
        ev.append(
            CgroupSample(
                ts, cg, "/svc.slice/llm.service", (100 + 30 * i) * MiB, 512 * MiB, 400 * MiB,
                None, None, {}, {"anon": (90 + 30 * i) * MiB, "file": 10 * MiB, "shmem": 0},
                float(i), 0.0, None, None,
            )
        )  # fmt: skip
        ev.append(GpuSample(ts, 0, "GPU-0", "Fake GPU", 16 << 30, (2 + i) << 30, 0, None))
        ev.append(GpuProcessSample(ts, 0, 42, (1 + i) << 30, "compute"))
        ev.append(ProbeSample(ts, "http://127.0.0.1/h", "", 5_000_000 * (i + 1), i < 8, i >= 8,
                              200 if i < 8 else None, "" if i < 8 else "timed out"))  # fmt: skip
    ev.append(
        GpuAllocFailure(s + 950_000_000, 42, 42, "serve", 0, "cuMemAlloc_v2", 8 << 30, 2,
                        11 << 30, 11 << 30, 1)
    )  # fmt: skip
    ev.append(Exit(s + 1_100_000_000, 42, 1, "serve", cg, 1 << 8, s))
    return ev


@draws
def test_gpu_and_probe_panels_appear_when_the_trace_has_them() -> None:
    t = build(_header(), _gpu_probe_events())
    [u] = t.units
    assert len(u.gpu_procs) == 10 and len(u.gpu_failures) == 1
    assert len(u.probes) == 10  # one unit: unlabelled probes check it
    page = report.render_html(t, "synthetic.trace")
    assert "GPU memory (GiB)" in page
    assert "allocation failed (held + requested)" in page
    assert "probe latency (ms)" in page and "probe timed out" in page
    assert "memory.high /svc.slice/llm.service: 400.0 MiB" in page
    assert "PSI some avg10 /svc.slice/llm.service" in page
    assert "GPU 0 total Fake GPU" in page  # the host's device memory


@draws
def test_many_units_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole-host recording can hold thousands of units: the most telling get charts."""
    events: list[Event] = []
    for i in range(4):
        cg = 100 + i
        events.append(CgroupInfo(i * 10, cg, f"/system.slice/u{i}.service", "memory", None))
        events.append(Exec(i * 10 + 1, 1000 + i, f"d{i}", f"/bin/d{i}", cg))
        # unit 2 is SIGKILLed (no OOM evidence: unknown), the others exit 0
        events.append(Exit(i * 10 + 5, 1000 + i, 1, f"d{i}", cg, 9 if i == 2 else 0, i * 10))
    t = build(_header(), events)
    assert [u.label for u in t.units] == [f"u{i}.service" for i in range(4)]
    monkeypatch.setattr(report, "MAX_UNIT_CHARTS", 2)
    charted = [u.label for u in report.charted_units(t)]
    assert len(charted) == 2 and "u2.service" in charted  # the killed one is kept
    page = report.render_html(t, "many.trace")
    assert page.count("<svg") == 3  # two units and the host
    assert "2 more units are not charted" in page


# -- in a real browser ------------------------------------------------------------------------


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _chromium_args(profile: Path) -> list[str]:
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
    ]


@draws
@pytest.mark.skipif(_chromium() is None, reason="chromium not installed (scripts/setup adds it)")
def test_report_renders_in_headless_chromium(nested_html: Path, tmp_path: Path) -> None:
    exe = _chromium()
    assert exe is not None
    shot = tmp_path / "shot.png"
    url = nested_html.resolve().as_uri()
    subprocess.run(
        [exe, *_chromium_args(tmp_path / "p1"), f"--screenshot={shot}", "--window-size=1400,2000",
         url],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 50_000
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size == (1400, 2000)
        colours = im.convert("RGB").getcolors(maxcolors=1 << 18)
    # a rendered page of charts has many colours (anti-aliased lines, fills); a blank or an
    # error page has a handful
    assert colours is None or len(colours) > 200
    dom = subprocess.run(
        [exe, *_chromium_args(tmp_path / "p2"), "--dump-dom", url],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "cgroup_oom" in dom
    # the limit lines' labels are SVG text the browser parsed
    assert "<text" in dom and "effective limit 96.0 MiB" in dom
    assert f"limit {PARENT}: 96.0 MiB" in dom


def test_a_stall_band_does_not_start_before_its_cgroup() -> None:
    """Issue 22 finding 5: the report drew a summary's stall band over its whole interval,
    including time before the cgroup existed. The band starts at the cgroup's first record."""
    t = load(str(Path(__file__).parent / "data" / "reclaim_v1_oom.trace"))
    [s] = [s for u in t.units for s in u.summaries]
    first = t.cgroup_first_ns[s.cgroup_id]
    assert s.ts - s.interval_ns < first < s.ts  # the interval began before the cgroup did
    assert t.stall_span(s) == (first, s.ts)


def test_the_report_draws_what_tail_warned(tmp_path: Path) -> None:
    """A recorded leak to an OOM kill (tests/data/eta_leak8_oom, bench/eta_traces.py): the unit
    lists tail's time-to-limit warnings and its memory chart draws their projection; page-cache
    thrash (a synthetic stream shaped on llama-server's, tests/test_thrash.py) is listed and
    marked where it began."""
    t = load(DATA / "eta_leak8_oom.trace.zst")
    warned = [ln for u in t.units for c in u.cgroups for ln in c.warnings]
    assert any(ln.eta is not None for ln in warned)
    out = tmp_path / "leak.html"
    code, _, err = run("report", str(DATA / "eta_leak8_oom.trace.zst"), "-o", str(out))
    assert code == 0, err
    page = out.read_text()
    assert "What <code>tail</code> warned:" in page and "will reach its" in page
    assert "time-to-limit warning (projection)" in page  # the legend of the drawn projection

    from tests.test_thrash import CG, PATH, thrashing
    from tracer.events import EffectiveLimit
    from tracer.trace.writer import TraceWriter

    path = tmp_path / "thrash.trace"
    w = TraceWriter.open(path, header())
    w.write_many(
        [
            EffectiveLimit(ts=0, cgroup_id=CG, path=PATH, limit_bytes=200 << 20, set_by=PATH),
            *thrashing(8, 150_000),
        ]
    )
    w.close(w.make_footer("command exited", ended_ns=9_000_000_000))
    out = tmp_path / "thrash.html"
    code, _, err = run("report", str(path), "-o", str(out))
    assert code == 0, err
    page = out.read_text()
    assert "page cache re-read from disk at 585.9 MiB/s" in page
    assert "page-cache thrash began" in page
