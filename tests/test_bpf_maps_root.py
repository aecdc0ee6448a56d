"""Tier 1 and 3 (root, real kernel): every LRU map of both objects is created large enough for this
host's possible CPUs (kernel-side review §12), except the pinned one other recorders share."""

from __future__ import annotations

import pytest

from tracer.bpf import hooks, layout
from tracer.bpf.gpuhooks import PEERS_MAP, GpuHooks
from tracer.bpf.libbpf import (
    BPF_MAP_TYPE_LRU_HASH,
    LRU_ENTRIES_PER_CPU,
    BpfObject,
    lib,
    lru_entries,
)


def test_a_map_is_sized_for_the_cpus_only_where_it_declares_less() -> None:
    assert lru_entries(256, 2) == 512
    assert lru_entries(16384, 2) == 16384
    assert lru_entries(16384, 128) == 32768


def lru_sizes(obj: BpfObject) -> dict[str, int]:
    d = lib().dll
    return {
        m.name: m.max_entries for m in obj.maps() if d.bpf_map__type(m.ptr) == BPF_MAP_TYPE_LRU_HASH
    }


@pytest.mark.root
def test_each_lru_map_holds_its_batches_for_every_possible_cpu() -> None:
    want = LRU_ENTRIES_PER_CPU * lib().dll.libbpf_num_possible_cpus()
    main = hooks.KernelHooks(
        layout.WrConfig(filter_all=1, self_tgid=0, stall_threshold_ns=10_000_000)
    )
    try:
        sizes = lru_sizes(main.obj)
        gpu = GpuHooks(layout.WrGpuConfig(), shared={"watched_pids": main.watched_pids.fd})
        try:
            gpu_sizes = lru_sizes(gpu.obj)
        finally:
            gpu.close()
    finally:
        main.close()
    # oom_ctxs is declared with 256 entries: below this host's 2 x 256 before sizing
    assert "oom_ctxs" in sizes and "gpu_calls" in gpu_sizes
    assert {n: s for n, s in sizes.items() if s < want} == {}
    shared = gpu_sizes.pop(PEERS_MAP)
    assert {n: s for n, s in gpu_sizes.items() if s < want} == {}
    assert shared == 4096  # as declared: another recorder may have pinned it so


@pytest.mark.root
def test_a_map_is_read_whole_in_one_batch_and_the_same_key_by_key() -> None:
    """`Map.items` reads a hash map in BPF_MAP_LOOKUP_BATCH calls (5.6+); the per-key listing
    it falls back to gives the same entries. 3,000 entries in a 16,384-entry LRU map, and one
    in a 4,096-entry hash map, each read back exactly."""
    import ctypes

    main = hooks.KernelHooks(
        layout.WrConfig(filter_all=1, self_tgid=0, stall_threshold_ns=10_000_000)
    )
    try:
        clean = main.clean_exits
        want = {(1 << 62) + i: i * 7 for i in range(3000)}
        for k, v in want.items():
            clean.update(layout.CgroupKey(id=k), ctypes.c_uint64(v))
        batched = {
            int(k.id): int(v.value) for k, v in clean.items(layout.CgroupKey, ctypes.c_uint64)
        }
        assert clean._batch is True  # (this kernel has batch lookups: the fast path was taken)
        clean._batch = False
        by_key = {
            int(k.id): int(v.value) for k, v in clean.items(layout.CgroupKey, ctypes.c_uint64)
        }
        assert batched == by_key == want
        assert main.clean_exit_counts() == want

        stats = main.reclaim_stats
        key = layout.WrReclaimKey(cgroup_id=42, kind=1)
        stats.update(key, layout.WrReclaimStats(count=3, total_ns=9_000, reclaimed_pages=5))
        [(k, v)] = stats.items(layout.WrReclaimKey, layout.WrReclaimStats)
        assert (k.cgroup_id, k.kind, v.count, v.total_ns, v.reclaimed_pages) == (42, 1, 3, 9000, 5)
        [(cid, kind, news)] = main.drain_reclaim()
        assert (cid, kind, news.count, news.total_ns) == (42, 1, 3, 9000)
        assert main.drain_reclaim() == []  # nothing new since
    finally:
        main.close()
