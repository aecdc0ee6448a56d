"""What filled the limiting cgroup at an OOM kill (issue 30 §1): the kernel's memcg stat dump or
a memory.stat read at the kill, split into the parts a user acts on."""

from __future__ import annotations

from tracer.analysis import wording as say
from tracer.analysis.evidence import Evidence
from tracer.analysis.findings import (
    Evidence_,
)
from tracer.analysis.growth import stepwise
from tracer.analysis.quantities import fmt_bytes
from tracer.analysis.rules.view import SECOND, SETTLE_NS, ExitView
from tracer.events import (
    Exit,
    KmsgOom,
)


def breakdown(
    store: Evidence, ex: Exit, km: KmsgOom | None, oom_ts: int, limit_id: int = 0
) -> tuple[tuple[str, int], ...]:
    """The limiting cgroup's composition at the kill (``composition``), followed by the
    victim's own RSS from the kernel log (``anon_rss``, ``file_rss``, ``shmem_rss``: the
    victim's, not the cgroup's; wording.memory_at_kill labels each)."""
    parts = composition(store, ex, km, oom_ts, limit_id)[0]
    if km is not None:
        # The kernel log's numbers are the victim process's RSS, not its cgroup's charge:
        # file-rss counts mapped files (libraries) that may be charged to other cgroups, so
        # anon + file can exceed the limit. Named as what they are (wording.memory_at_kill).
        pairs = (
            ("anon_rss", km.anon_rss_kb),
            ("file_rss", km.file_rss_kb),
            ("shmem_rss", km.shmem_rss_kb),
        )
        parts += tuple((k, val * 1024) for k, val in pairs if val is not None)
    return parts


def composition(
    store: Evidence, ex: Exit, km: KmsgOom | None, oom_ts: int, limit_id: int
) -> tuple[tuple[tuple[str, int], ...], str | None]:
    """What filled the limiting cgroup at the kill, and where that came from: (parts in
    say.COMPOSITION_KEYS order, the source's words or None when nothing was read).

    Best first: the kernel's own OOM report (its "Memory cgroup stats for" dump is the OOM's
    memcg at the moment of the kill); else the first memory.stat read of the limiting cgroup
    after the kill (the sampler reads it at once on a kill; the victim's anon may already be
    freed by then, tmpfs and page cache are not); else the last read in the 5 s before."""
    if km is not None and km.memcg_stat:
        return split_stat(km.memcg_stat), say.composition_source_kmsg(km.memcg_stat_path)
    ids = [i for i in (limit_id, ex.cgroup_id) if i]
    for cid in ids:
        after = [s for s in store.samples_between(cid, oom_ts, oom_ts + SETTLE_NS) if s.stat]
        if after:
            return split_stat(after[0].stat), say.composition_source_sample(
                after[0].path, after[0].ts - oom_ts
            )
    for cid in ids:
        before = [s for s in store.samples_between(cid, oom_ts - 5 * SECOND, oom_ts) if s.stat]
        fresh = before and (
            km is None
            or km.anon_rss_kb is None
            or (before[-1].usage_bytes or 0) * 2 >= km.anon_rss_kb * 1024
        )
        if before and fresh:
            return split_stat(before[-1].stat), say.composition_source_sample(
                before[-1].path, before[-1].ts - oom_ts
            )
    return (), None


def with_composition(
    v: ExitView,
    km: KmsgOom | None,
    oom_ts: int,
    limit_id: int,
    limit: int | None,
    summary: str,
    advice: str,
) -> tuple[str, str, Evidence_ | None]:
    """A cgroup OOM's summary and advice with what filled the limiting cgroup (issue 30 §1),
    and the evidence it was read from."""
    parts, source = composition(v.ev, v.ex, km, oom_ts, limit_id)
    said = say.composition_text(parts, limit)
    if said is None or source is None:
        return summary, advice, None
    what = say.composition_parts(list(parts), fmt_bytes)
    top = dict(parts)
    # Where tmpfs or kernel memory filled it, a higher limit only delays the next kill: that
    # advice comes first. Otherwise the limit's advice stands and the composition refines it.
    pinned = max(top.get("shmem", 0), top.get("kernel", 0) + top.get("sock", 0))
    first = pinned > top.get("anon", 0) + top.get("file_mapped", 0) + top.get("file_unmapped", 0)
    advice = f"{said[1]}; {advice}" if first else f"{advice}; {said[1]}"
    summary = f"{summary}; {said[0]}"
    page_cache = top.get("file_mapped", 0) + top.get("file_unmapped", 0)
    if not first and top.get("anon", 0) > max(pinned, page_cache):
        grew = anon_steps(v.ev, limit_id or v.ex.cgroup_id, v.ex, oom_ts)
        if grew is not None:
            summary, advice = f"{summary}; {grew[0]}", f"{grew[1]}; {advice}"
    return summary, advice, (oom_ts, f"{source}: {what}")


# how far back the steps are looked for: a server's life until its kill, bounded
STEPS_WINDOW_NS = 600 * SECOND


def anon_steps(store: Evidence, cid: int, ex: Exit, oom_ts: int) -> tuple[str, str] | None:
    """The limiting cgroup's anon memory rising in steps that never came back down, from the
    victim's start (at most STEPS_WINDOW_NS) to the kill, as words; None otherwise."""
    start = max(ex.start_ns, oom_ts - STEPS_WINDOW_NS)
    points = [
        (s.ts, s.stat["anon"])
        for s in store.samples_between(cid, start, oom_ts)
        if "anon" in s.stat
    ]
    steps = stepwise(points)
    if steps is None:
        return None
    return say.stepwise_growth(steps.levels, steps.end_ns - steps.start_ns)


def split_stat(stat: dict[str, int]) -> tuple[tuple[str, int], ...]:
    """memory.stat (v2 names, parse.memory.normalize_stat) as the parts a user acts on.

    ``file`` counts shmem in both versions (v1's ``cache`` too), so the page cache proper is
    file - shmem, split into mapped (``file_mapped``, capped: it can count mapped shmem) and
    unmapped. ``kernel`` is v2's (slab, stacks, page tables...) or v1's kmem usage, else the
    sum of the parts printed; ``sock`` is charged beside it on v2."""
    out: dict[str, int] = {}
    if "anon" in stat:
        out["anon"] = stat["anon"]
    shmem = stat.get("shmem", 0)
    if "shmem" in stat:
        out["shmem"] = shmem
    if "file" in stat:
        cache = max(stat["file"] - shmem, 0)
        mapped = min(stat.get("file_mapped", 0), cache)
        out["file_mapped"] = mapped
        out["file_unmapped"] = cache - mapped
    kernel = stat.get("kernel")
    if kernel is None:
        pieces = [stat[k] for k in ("slab", "kernel_stack", "pagetables") if k in stat]
        kernel = sum(pieces) if pieces else None
    if kernel is not None:
        out["kernel"] = kernel
    for k in ("slab", "pagetables", "sock", "swap"):
        if k in stat:
            out[k] = stat[k]
    return tuple(out.items())
