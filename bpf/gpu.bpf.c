// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * whyrestart's GPU side: device allocations that fail inside a process, caught where the CUDA
 * driver library returns CUDA_ERROR_OUT_OF_MEMORY. NVML sees how much memory a process holds,
 * never the allocation it was refused; only the driver library's return value says that.
 *
 * A separate object from whyrestart.bpf.o, with its own ring buffer and maps, so that a libcuda
 * problem can never stop exits and OOM kills from being recorded (and the other way round).
 *
 * User space (tracer/bpf/gpuprobe.py) attaches these programs to the libcuda.so.1 file that a
 * watched process maps, once per file for every process (pid -1): the kernel keys uprobes by
 * inode, so every later process mapping the same library is covered from its first call. The
 * programs therefore filter on the watched set, and it is the main object's own: watched_pids
 * and watched_cgroups are that object's maps (bpf_map__reuse_fd before load), so a process is
 * watched here from the fork the main object saw, not from when user space decodes it.
 *
 * A library file nobody probed yet (LD_LIBRARY_PATH, a conda environment, a container's
 * compat directory) is caught as the loader maps it to run it: when a watched process maps a
 * file named libcuda.so* executable from a descriptor opened for reading only (about_to_run),
 * and that file is not in gpu_probed_files, the process is stopped with SIGSTOP before the mmap
 * returns to user space and put in gpu_held. User space attaches the probes to the file (/proc/PID/fd/FD), adds it to
 * gpu_probed_files and resumes the process with SIGCONT: its very first driver call is then
 * caught. The hold is bounded by user space (and by
 * tracer/gpu/holdguard.py if the recorder dies); holds that could not be taken are counted.
 *
 * For each allocation entry point there is an entry program (saves the requested size and where
 * the result will be written, keyed by thread and function: a driver entry point may call
 * another one) and a return program (reads the CUresult). A failure is sent at once; the first
 * success after failures is sent too (a "recovered" GPU OOM: PyTorch and XLA free their caches
 * and retry). Every success and free updates the process's held bytes and high-water mark in
 * gpu_stats, so a failure record says how much the process already held.
 *
 * One program per entry point rather than one program with a bpf_cookie per attachment: cookies
 * need 5.15, and production hosts still run 5.10.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "cgroup.h"
#include "events.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile struct wr_gpu_config gcfg = {};

/* Records are only reached through void pointers; keep their types in the BTF for
 * tests/test_layout.py (see the same anchor in whyrestart.bpf.c). */
struct wr_gpu_btf_anchor {
	struct wr_gpu_alloc alloc;
	struct wr_gpu_stats stats;
	struct wr_gpu_live_key live_key;
	struct wr_gpu_file file;
	struct wr_gpu_hold hold;
	struct wr_gpu_peer_key peer_key;
	enum wr_gpu_event_type type; /* the enums too: the test checks the Python numbers */
	enum wr_gpu_func func;
};
struct wr_gpu_btf_anchor wr_gpu_btf_anchor __attribute__((used));

/* Allocation failures are rare and user space drains every 10 ms: 256 KiB holds ~2,600
 * records, far more than a process failing in a retry loop sends in that time. The data area is
 * mapped twice into the recorder, so each KiB here is two of its resident memory. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} gpu_events SEC(".maps");

/* The main object's watched processes (by tgid) and cgroups, shared with it (same definitions
 * as in whyrestart.bpf.c: bpf_map__reuse_fd checks them). Without the main object, user space
 * fills watched_pids itself. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} watched_pids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u8);
} watched_cgroups SEC(".maps");

#define MAX_CGROUP_DEPTH 16
#define SIGSTOP 19

/* Library files whose probes are attached (or could not be: no use holding for them again). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct wr_gpu_file);
	__type(value, __u8);
} gpu_probed_files SEC(".maps");

/* Processes stopped until their library is probed, by tgid. Its size bounds how many can be
 * held at once: a hold that finds it full is not taken, and counted. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct wr_gpu_hold);
} gpu_held SEC(".maps");

/* Every recorder's holds, shared (pinned in bpffs under this name; a private map where bpffs is
 * not mounted): key (held tgid, holder), value when it was taken. A recorder resumes a process
 * only when no other recorder's fresh hold of it remains. */
struct {
	/* LRU: the entries of a recorder killed with its guard age out instead of filling it */
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct wr_gpu_peer_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} wr_gpu_peers SEC(".maps");

/* [0] = user space's heartbeat: when it last said it resumes held processes (CLOCK_BOOTTIME ns;
 * 0 = holding off). It is set once its guard runs and refreshed every loop of the recorder
 * (tracer/gpu/side.py HEARTBEAT_NS); a hold is taken only while it is fresher than
 * WR_HEARTBEAT_STALE_NS, so a recorder that is stuck, frozen (cgroup freezer, SIGSTOP) or
 * dead stops nobody new: no hold without somebody to end it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} gpu_hold_on SEC(".maps");

/* The recorder refreshes every loop (at most ~0.5 s apart when idle): 2 s is four missed loops. */
#define WR_HEARTBEAT_STALE_NS 2000000000ULL

/* Per CPU: [0] holds taken, [1] holds not taken (gpu_held full, or the signal failed), [2]
 * spared because the heartbeat was stale, [3] spared because the task is ptraced. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} gpu_hold_counts SEC(".maps");

/* Failed ring-buffer reservations, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} gpu_lost SEC(".maps");

struct gpu_call_key {
	__u32 tid;
	__u32 func;
};

struct gpu_call {
	__u64 size;      /* requested bytes */
	__u64 out;       /* user pointer the driver writes the CUdeviceptr / handle to */
	__u64 pitch_out; /* cuMemAllocPitch_v2: where the chosen pitch is written */
	__u64 height;    /* cuMemAllocPitch_v2: rows */
};

/* Calls in flight. LRU: a thread killed inside the driver never returns, and its entry must
 * not stay forever. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct gpu_call_key);
	__type(value, struct gpu_call);
} gpu_calls SEC(".maps");

/* Per-process bookkeeping and live allocations. User space deletes a GPU process's entries
 * when it exits; LRU is the safety net for the processes it never hears of (under --all a
 * process that never execs): their entries age out instead of filling the maps. Frameworks
 * allocate few large blocks and sub-allocate themselves, so 64k live entries host-wide is
 * ample and an eviction of a live allocation (its free then goes unseen) stays theoretical. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct wr_gpu_stats);
} gpu_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct wr_gpu_live_key);
	__type(value, __u64);
} gpu_live SEC(".maps");

/* A task's cgroup in the hierarchy user space names cgroups from (cgroup.h, as in
 * whyrestart.bpf.c). */
static __always_inline struct cgroup *task_cgroup(struct task_struct *task)
{
	return task_cgroup_in(task, gcfg.memcg_v1);
}

/* whyrestart.bpf.c's is_watched(), on the shared maps. */
static __always_inline bool watched(__u32 tgid)
{
	struct cgroup *cgrp;

	if (tgid == gcfg.self_tgid)
		return false;
	if (gcfg.filter_all || bpf_map_lookup_elem(&watched_pids, &tgid))
		return true;
	if (!gcfg.watch_cgroups)
		return false;
	cgrp = task_cgroup((struct task_struct *)bpf_get_current_task());
	for (int i = 0; i < MAX_CGROUP_DEPTH && cgrp; i++) {
		__u64 id = cgroup_id_of(cgrp);

		if (bpf_map_lookup_elem(&watched_cgroups, &id))
			return true;
		cgrp = (struct cgroup *)BPF_CORE_READ(cgrp, self.parent);
	}
	return false;
}

static __always_inline void count(void *map, __u32 index)
{
	__u64 *n = bpf_map_lookup_elem(map, &index);

	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline struct wr_gpu_stats *stats_of(__u32 tgid)
{
	struct wr_gpu_stats *st = bpf_map_lookup_elem(&gpu_stats, &tgid);
	struct wr_gpu_stats zero = {};

	if (st)
		return st;
	bpf_map_update_elem(&gpu_stats, &tgid, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&gpu_stats, &tgid);
}

static __always_inline void emit(__u16 type, __u32 func, int result, __u64 requested,
				 __u64 held, __u64 peak, __u64 failures)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 id = bpf_get_current_pid_tgid();
	struct wr_gpu_alloc *e;

	e = bpf_ringbuf_reserve(&gpu_events, sizeof(*e), 0);
	if (!e) {
		count(&gpu_lost, 0);
		return;
	}
	e->h.type = type;
	e->h.size = sizeof(*e);
	e->h.rung = WR_RUNG_UPROBE;
	e->h._pad = 0;
	e->h.ts_ns = bpf_ktime_get_boot_ns();
	e->h.pid = (__u32)id;
	e->h.tgid = id >> 32;
	e->h.cgroup_id = cgroup_id_of(task_cgroup(task));
	bpf_get_current_comm(&e->h.comm, sizeof(e->h.comm));
	e->requested = requested;
	e->held_bytes = held;
	e->peak_bytes = peak;
	e->failures = failures;
	e->func = func;
	e->result = result;
	/* user space drains on a timer: a wake-up per record would only cost */
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

static __always_inline void call_failed(struct wr_gpu_stats *st, __u32 func, int result,
					__u64 size)
{
	/* (read apart from the add: a fetching atomic add is refused before 5.12, see
	 * whyrestart.bpf.c handled_allowed) */
	__u64 n = st->call_failures + 1;

	__sync_fetch_and_add(&st->call_failures, 1);

	if (n <= WR_GPU_CALL_FAIL_SENT)
		emit(WR_EV_GPU_CALL_FAIL, func, result, size, st->held_bytes, st->peak_bytes, n);
}

static __always_inline int alloc_entry(__u32 func, __u64 out, __u64 size, __u64 pitch_out,
				       __u64 height)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct gpu_call_key key = { .tid = (__u32)id, .func = func };
	struct gpu_call call = {
		.size = size, .out = out, .pitch_out = pitch_out, .height = height
	};

	if (!watched(id >> 32))
		return 0;
	bpf_map_update_elem(&gpu_calls, &key, &call, BPF_ANY);
	return 0;
}

static __always_inline int alloc_return(__u32 func, int result)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct gpu_call_key key = { .tid = (__u32)id, .func = func };
	struct gpu_call *call = bpf_map_lookup_elem(&gpu_calls, &key);
	struct wr_gpu_stats *st;
	struct wr_gpu_live_key live = {};
	__u64 size, ptr = 0, old_held, *old;

	if (!call)
		return 0;
	size = call->size;
	live.tgid = tgid;
	if (result == WR_CUDA_SUCCESS) {
		if (bpf_probe_read_user(&ptr, sizeof(ptr), (void *)call->out) != 0)
			ptr = 0;
		if (call->pitch_out) {
			__u64 pitch = 0;

			/* the driver may pad rows: what it holds is pitch * height */
			if (bpf_probe_read_user(&pitch, sizeof(pitch), (void *)call->pitch_out) == 0 &&
			    pitch)
				size = pitch * call->height;
		}
	}
	bpf_map_delete_elem(&gpu_calls, &key);

	st = stats_of(tgid);
	if (!st)
		return 0;
	old_held = st->held_bytes;
	if (result == WR_CUDA_ERROR_OUT_OF_MEMORY) {
		__sync_fetch_and_add(&st->failures, 1);
		__sync_fetch_and_add(&st->pending, 1);
		emit(WR_EV_GPU_ALLOC_FAIL, func, result, size, old_held, st->peak_bytes,
		     st->pending);
		return 0;
	}
	if (result != WR_CUDA_SUCCESS) {
		/* not initialised, no context, an invalid value: why it could not allocate */
		call_failed(st, func, result, size);
		return 0;
	}

	__sync_fetch_and_add(&st->allocs, 1);
	live.ptr = ptr;
	/* a pointer we still hold was freed by a call we do not probe: replace, not add twice */
	old = bpf_map_lookup_elem(&gpu_live, &live);
	if (old) {
		__sync_fetch_and_add(&st->held_bytes, -*old);
		bpf_map_delete_elem(&gpu_live, &live);
	}
	if (ptr && bpf_map_update_elem(&gpu_live, &live, &size, BPF_NOEXIST) == 0) {
		__sync_fetch_and_add(&st->held_bytes, size);
		if (st->held_bytes > st->peak_bytes)
			st->peak_bytes = st->held_bytes; /* racy max: a high-water mark, not a bill */
	} else {
		__sync_fetch_and_add(&st->untracked, 1);
	}
	if (st->pending) {
		/* Racy against a concurrent success in another thread (one extra record at worst);
		 * an atomic exchange would need BPF cpu v3. */
		__u64 failures = st->pending;

		st->pending = 0;
		emit(WR_EV_GPU_ALLOC_RECOVERED, func, result, size, old_held, st->peak_bytes,
		     failures);
	}
	return 0;
}

static __always_inline int release(__u64 ptr)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct wr_gpu_live_key live = { .tgid = id >> 32, .ptr = ptr };
	struct wr_gpu_stats *st;
	__u64 *size;

	if (!watched(id >> 32))
		return 0;
	size = bpf_map_lookup_elem(&gpu_live, &live);
	if (!size)
		return 0;
	st = bpf_map_lookup_elem(&gpu_stats, &live.tgid);
	if (st)
		__sync_fetch_and_add(&st->held_bytes, -*size);
	bpf_map_delete_elem(&gpu_live, &live);
	return 0;
}

/* CUresult is an enum (int): the return register's low 32 bits. */
#define ALLOC_RETURN(name, func)                                 \
	SEC("uretprobe")                                         \
	int BPF_KRETPROBE(name##_ret, long ret)                  \
	{                                                        \
		return alloc_return(func, (int)ret);             \
	}

/* CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) */
SEC("uprobe")
int BPF_KPROBE(mem_alloc, void *dptr, __u64 bytesize)
{
	return alloc_entry(WR_GPU_MEM_ALLOC, (__u64)dptr, bytesize, 0, 0);
}
ALLOC_RETURN(mem_alloc, WR_GPU_MEM_ALLOC)

/* CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) */
SEC("uprobe")
int BPF_KPROBE(mem_alloc_managed, void *dptr, __u64 bytesize)
{
	return alloc_entry(WR_GPU_MEM_ALLOC_MANAGED, (__u64)dptr, bytesize, 0, 0);
}
ALLOC_RETURN(mem_alloc_managed, WR_GPU_MEM_ALLOC_MANAGED)

/* CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
 *                             size_t Height, unsigned int ElementSizeBytes) */
SEC("uprobe")
int BPF_KPROBE(mem_alloc_pitch, void *dptr, void *pitch, __u64 width, __u64 height)
{
	return alloc_entry(WR_GPU_MEM_ALLOC_PITCH, (__u64)dptr, width * height, (__u64)pitch,
			   height);
}
ALLOC_RETURN(mem_alloc_pitch, WR_GPU_MEM_ALLOC_PITCH)

/* CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream), and its
 * per-thread-default-stream twin _ptsz */
SEC("uprobe")
int BPF_KPROBE(mem_alloc_async, void *dptr, __u64 bytesize)
{
	return alloc_entry(WR_GPU_MEM_ALLOC_ASYNC, (__u64)dptr, bytesize, 0, 0);
}
ALLOC_RETURN(mem_alloc_async, WR_GPU_MEM_ALLOC_ASYNC)

SEC("uprobe")
int BPF_KPROBE(mem_alloc_async_ptsz, void *dptr, __u64 bytesize)
{
	return alloc_entry(WR_GPU_MEM_ALLOC_ASYNC_PTSZ, (__u64)dptr, bytesize, 0, 0);
}
ALLOC_RETURN(mem_alloc_async_ptsz, WR_GPU_MEM_ALLOC_ASYNC_PTSZ)

/* CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
 *                                  CUstream hStream), and _ptsz */
SEC("uprobe")
int BPF_KPROBE(mem_alloc_pool, void *dptr, __u64 bytesize)
{
	return alloc_entry(WR_GPU_MEM_ALLOC_FROM_POOL, (__u64)dptr, bytesize, 0, 0);
}
ALLOC_RETURN(mem_alloc_pool, WR_GPU_MEM_ALLOC_FROM_POOL)

SEC("uprobe")
int BPF_KPROBE(mem_alloc_pool_ptsz, void *dptr, __u64 bytesize)
{
	return alloc_entry(WR_GPU_MEM_ALLOC_FROM_POOL_PTSZ, (__u64)dptr, bytesize, 0, 0);
}
ALLOC_RETURN(mem_alloc_pool_ptsz, WR_GPU_MEM_ALLOC_FROM_POOL_PTSZ)

/* CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
 *                      const CUmemAllocationProp *prop, unsigned long long flags) */
SEC("uprobe")
int BPF_KPROBE(mem_create, void *handle, __u64 size)
{
	return alloc_entry(WR_GPU_MEM_CREATE, (__u64)handle, size, 0, 0);
}
ALLOC_RETURN(mem_create, WR_GPU_MEM_CREATE)

/* Frees: CUresult cuMemFree_v2(CUdeviceptr dptr), cuMemFreeAsync[_ptsz](CUdeviceptr dptr,
 * CUstream hStream), cuMemRelease(CUmemGenericAllocationHandle handle). Counted at entry: a free
 * of a pointer the driver handed out does not fail. */
SEC("uprobe")
int BPF_KPROBE(mem_free, __u64 dptr)
{
	return release(dptr);
}

SEC("uprobe")
int BPF_KPROBE(mem_free_async, __u64 dptr)
{
	return release(dptr);
}

SEC("uprobe")
int BPF_KPROBE(mem_free_async_ptsz, __u64 dptr)
{
	return release(dptr);
}

SEC("uprobe")
int BPF_KPROBE(mem_release, __u64 handle)
{
	return release(handle);
}

/* ---------------------------------------------------------------------------------------- */
/* CUDA could not start: cuInit and context creation failing (no device 100, driver/runtime
 * mismatch 803, forward compatibility 804, unknown 999, ...). Only the return value matters, so
 * there is no entry program: a failure of a watched process is sent, a success costs a lookup. */

static __always_inline int init_return(__u32 func, int result)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct wr_gpu_stats *st;

	if (result == WR_CUDA_SUCCESS || !watched(tgid))
		return 0;
	st = stats_of(tgid);
	if (st)
		call_failed(st, func, result, 0);
	return 0;
}

/* CUresult cuInit(unsigned int Flags) */
SEC("uretprobe")
int BPF_KRETPROBE(init_ret, long ret)
{
	return init_return(WR_GPU_INIT, (int)ret);
}

/* CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev): the runtime's context */
SEC("uretprobe")
int BPF_KRETPROBE(primary_ctx_retain_ret, long ret)
{
	return init_return(WR_GPU_PRIMARY_CTX_RETAIN, (int)ret);
}

/* CUresult cuCtxCreate_v2 / _v3 / _v4 (CUcontext *pctx, ...) */
SEC("uretprobe")
int BPF_KRETPROBE(ctx_create_ret, long ret)
{
	return init_return(WR_GPU_CTX_CREATE, (int)ret);
}

SEC("uretprobe")
int BPF_KRETPROBE(ctx_create_v3_ret, long ret)
{
	return init_return(WR_GPU_CTX_CREATE_V3, (int)ret);
}

SEC("uretprobe")
int BPF_KRETPROBE(ctx_create_v4_ret, long ret)
{
	return init_return(WR_GPU_CTX_CREATE_V4, (int)ret);
}

/* ---------------------------------------------------------------------------------------- */
/* Holding a process that is about to run a driver library nobody probed yet (see the top of the
 * file). The hold is taken at the first mmap of the file with PROT_EXEC, not at its open: a
 * dynamic loader (glibc's _dl_map_segments, musl's map_library) maps a library's code segment
 * executable from the descriptor it opened, and nothing else does. cp, ldconfig, ld linking
 * against the stub, a checksum, an image unpacker or dpkg read or write the file (ldconfig and
 * ld map it PROT_READ): holding at open stopped each of them once per unprobed file, on every
 * host, GPU or not (kernel-side review §1). sys_enter_mmap runs in the mapping task; the SIGSTOP
 * sent from it takes effect as the mmap returns to user space, with the descriptor still open
 * (the loader closes it after mapping every segment) and before the loader has run any of the
 * library's code: its constructors and first driver call come after the probes are attached.
 * (uprobe_register installs the probes into mappings that already exist, register_for_each_vma
 * in kernel/events/uprobes.c, so mapping first and probing second loses nothing.) */

static __always_inline bool named_libcuda(struct file *f)
{
	static const char want[] = "libcuda.so";
	const unsigned char *name = BPF_CORE_READ(f, f_path.dentry, d_name.name);
	char buf[sizeof(want)] = {};

	if (bpf_probe_read_kernel(buf, sizeof(buf) - 1, name) != 0)
		return false;
	for (int i = 0; i < sizeof(want) - 1; i++)
		if (buf[i] != want[i])
			return false;
	return true;
}

/* include/uapi/linux/magic.h */
#define WR_OVERLAYFS_SUPER_MAGIC 0x794c7630
/* the dev of a file seen through overlayfs (tracer/bpf/gpuhooks.py OVERLAY_DEV): no dev_t is
 * wider than 32 bits */
#define WR_GPU_FILE_OVERLAY (1ULL << 63)

/* fmode_t bits (include/linux/fs.h; stable since 2.6.39, when FMODE_PATH came with O_PATH). */
#define WR_FMODE_READ 0x1
#define WR_FMODE_WRITE 0x2
#define WR_FMODE_PATH 0x4000

/* The descriptor being mapped executable is one a loader opens: for reading alone (O_PATH ones
 * cannot be mapped at all; a read-write one is not a loader's). A file that anyone still has
 * open for writing (i_writecount > 0) is half-written: probing it now would attach uprobes to
 * offsets that are about to change and mark it probed for good. */
static __always_inline bool about_to_run(struct file *f)
{
	unsigned int mode = BPF_CORE_READ(f, f_mode);

	if ((mode & (WR_FMODE_READ | WR_FMODE_WRITE | WR_FMODE_PATH)) != WR_FMODE_READ)
		return false;
	return BPF_CORE_READ(f, f_inode, i_writecount.counter) <= 0;
}

static __always_inline int hold_if_unprobed(int ret)
{
	struct task_struct *task;
	struct fdtable *fdt;
	struct file **fds, *f = NULL;
	struct wr_gpu_hold h = {};
	struct wr_gpu_peer_key peer = {};
	__u32 zero = 0, tgid;
	__u64 *beat;

	if (ret < 0)
		return 0;
	beat = bpf_map_lookup_elem(&gpu_hold_on, &zero);
	if (!beat || !*beat)
		return 0;
	tgid = bpf_get_current_pid_tgid() >> 32;
	if (!watched(tgid))
		return 0;
	task = (struct task_struct *)bpf_get_current_task();
	fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || ret >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	fds = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&f, sizeof(f), fds + ret) != 0 || !f)
		return 0;
	if (!named_libcuda(f))
		return 0;
	if (!about_to_run(f))
		return 0;
	h.file.dev = BPF_CORE_READ(f, f_inode, i_sb, s_dev);
	h.file.ino = BPF_CORE_READ(f, f_inode, i_ino);
	/* Through overlayfs (every container's image) f_inode is the overlay's inode, and each
	 * overlay mount (each container start) has a dev of its own; uprobes are keyed by the real
	 * inode underneath (d_real_inode, kernel/trace/trace_uprobe.c), which every container of
	 * the image shares. Its i_ino is the real inode's number where the layers share one file
	 * system (fs/overlayfs/inode.c ovl_map_ino: the usual /var/lib/containers or containerd
	 * snapshotter layout; with xino, the real number plus the layer's fsid in the high bits),
	 * so overlay files are keyed by that number alone: one hold per real file, not one per
	 * container. (The real inode itself sits behind overlayfs-private structures that changed
	 * in 6.6 and 6.13.) */
	if (BPF_CORE_READ(f, f_inode, i_sb, s_magic) == WR_OVERLAYFS_SUPER_MAGIC)
		h.file.dev = WR_GPU_FILE_OVERLAY;
	if (bpf_map_lookup_elem(&gpu_probed_files, &h.file))
		return 0;
	h.ts_ns = bpf_ktime_get_boot_ns();
	/* Past this point the process would be held. Nobody is resuming holds (the recorder stopped
	 * its loop, or is gone with its guard): hold nobody, count it. (A stale read of the beat
	 * only errs one way: an older value spares the opener.) */
	if ((__s64)(h.ts_ns - *beat) > (__s64)WR_HEARTBEAT_STALE_NS) {
		count(&gpu_hold_counts, 2);
		return 0;
	}
	/* A traced task: SIGSTOP reaches its debugger (gdb shows "SIGSTOP"), which may swallow it
	 * or pass it later, and SIGCONT wakes only __TASK_STOPPED, never TASK_TRACED
	 * (kernel/signal.c prepare_signal): the one SIGCONT is spent and the task group-stops with
	 * nobody to resume it. Its first driver calls are left to the maps scan. */
	if (BPF_CORE_READ(task, ptrace)) {
		count(&gpu_hold_counts, 3);
		return 0;
	}
	h.fd = ret;
	if (bpf_map_update_elem(&gpu_held, &tgid, &h, BPF_NOEXIST) != 0) {
		/* already held (another thread opened it too), or the map is full */
		if (!bpf_map_lookup_elem(&gpu_held, &tgid))
			count(&gpu_hold_counts, 1);
		return 0;
	}
	peer.tgid = tgid;
	peer.holder = gcfg.holder;
	if (bpf_send_signal(SIGSTOP) != 0) {
		bpf_map_delete_elem(&gpu_held, &tgid);
		count(&gpu_hold_counts, 1);
		return 0;
	}
	/* a full shared map only costs the coordination with other recorders, not the hold */
	bpf_map_update_elem(&wr_gpu_peers, &peer, &h.ts_ns, BPF_ANY);
	count(&gpu_hold_counts, 0);
	return 0;
}

/* include/uapi/asm-generic/mman-common.h */
#define WR_PROT_EXEC 0x4
#define WR_MAP_ANONYMOUS 0x20

/* mmap(addr, len, prot, flags, fd, off): x86-64 and arm64 both define the syscall as "mmap"
 * (arch/x86/kernel/sys_x86_64.c, arch/arm64/kernel/sys.c), so this one tracepoint is the loader's
 * way in on both. */
SEC("tracepoint/syscalls/sys_enter_mmap")
int hold_mmap(struct trace_event_raw_sys_enter *ctx)
{
	unsigned long prot = ctx->args[2], flags = ctx->args[3];
	long fd = (long)ctx->args[4];

	if (!(prot & WR_PROT_EXEC) || (flags & WR_MAP_ANONYMOUS) || (int)fd < 0)
		return 0;
	return hold_if_unprobed((int)fd);
}
