/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The one contract between the BPF programs and Python: every ring-buffer record and the
 * configuration block, fixed-width fields only. tracer/bpf/layout.py mirrors each struct and
 * tests/test_layout.py checks sizes and offsets against the compiled object's BTF.
 *
 * Every record starts with struct wr_hdr; user space dispatches on hdr.type.
 */
#ifndef WHYRESTART_EVENTS_H
#define WHYRESTART_EVENTS_H

#define WR_COMM_LEN 16
#define WR_FILENAME_LEN 128

enum wr_event_type {
	WR_EV_EXIT = 1,
	WR_EV_SIGNAL = 2,
	WR_EV_OOM = 3,
	WR_EV_FORK = 4,
	WR_EV_EXEC = 5,
	WR_EV_STALL = 6,
	WR_EV_CGROUP_MKDIR = 7,
};

/* What stalled a task: reclaim for a memory cgroup at its limit, host-wide direct reclaim, or
 * the cgroup v2 memory.high penalty (throttling). */
enum wr_stall_kind {
	WR_STALL_MEMCG = 1,
	WR_STALL_DIRECT = 2,
	WR_STALL_HIGH = 3,
	/* memcg reclaim done by a task outside the memcg (memory.reclaim, limit writes) */
	WR_STALL_EXTERNAL = 4,
};

/* Which program produced a record: the rung of its hook's fallback ladder. */
enum wr_rung {
	WR_RUNG_FENTRY = 1,
	WR_RUNG_KPROBE = 2,
	WR_RUNG_TP_BTF = 3,
	WR_RUNG_TRACEPOINT = 4,
};

struct wr_hdr {
	__u16 type;      /* enum wr_event_type */
	__u16 size;      /* sizeof the whole record */
	__u16 rung;      /* enum wr_rung */
	__u16 _pad;
	__u64 ts_ns;     /* bpf_ktime_get_boot_ns(): CLOCK_BOOTTIME */
	__u32 pid;       /* current thread id */
	__u32 tgid;      /* current process id */
	__u64 cgroup_id; /* current task's cgroup id in the tracked hierarchy */
	char comm[WR_COMM_LEN];
};

/* A thread group ended (emitted for its last thread). The header names the exiting task. */
struct wr_exit {
	struct wr_hdr h;
	__u32 exit_code;  /* task->exit_code: a wait status */
	__u32 ppid;       /* real_parent's tgid */
	__u64 start_ns;   /* task->start_boottime */
};

/* A fatal signal was generated. The header names the sender (the current task). */
struct wr_signal {
	struct wr_hdr h;
	__u32 target_pid;
	__s32 sig;
	__s32 si_code;
	__s32 result;     /* TRACE_SIGNAL_* */
	__u32 group;
	__u32 flags;      /* WR_SIGF_* (was padding: the layout is unchanged) */
	char target_comm[WR_COMM_LEN];
};

/*
 * The OOM killer picked a victim. The header names the task whose allocation triggered it;
 * hdr.rung is the best program that contributed (fentry/kprobe when oom_control was read).
 */
struct wr_oom {
	struct wr_hdr h;
	__u32 victim_pid;      /* tgid */
	__u32 memcg;           /* 1: a memory cgroup limit was the constraint */
	__u64 victim_cgroup_id;
	__u64 limit_cgroup_id; /* the memory cgroup at its limit, 0 if none */
	__u64 limit_pages;     /* its page_counter max */
	__u64 usage_pages;     /* its page_counter usage */
	char victim_comm[WR_COMM_LEN];
	__u32 constraint;      /* enum wr_oom_constraint: oc->constraint, where it was read */
	__u32 flags;           /* WR_OOM_* */
};

/* wr_oom.constraint: the kernel's enum oom_constraint, and "not read" (the guessing rungs) */
enum wr_oom_constraint {
	WR_OOM_CONSTRAINT_UNKNOWN = 0,
	WR_OOM_CONSTRAINT_NONE = 1, /* the whole machine */
	WR_OOM_CONSTRAINT_CPUSET = 2,
	WR_OOM_CONSTRAINT_MEMPOLICY = 3,
	WR_OOM_CONSTRAINT_MEMCG = 4,
};

/* wr_oom.flags: the victim was already exiting by itself (marked, not killed) */
#define WR_OOM_EXITING 1
/* wr_oom.flags: the limit and usage are the memory+swap counter's (v1 memory.memsw.*) */
#define WR_OOM_MEMSW 2

/* A watched process created a new process. The header names the parent. */
struct wr_fork {
	struct wr_hdr h;
	__u32 child_pid;
	__u32 _pad;
};

/* A watched process called execve. The header names the task after exec. */
struct wr_exec {
	struct wr_hdr h;
	char filename[WR_FILENAME_LEN];
};

/* One stall longer than cfg.stall_threshold_ns. The header names the stalled task. */
struct wr_stall {
	struct wr_hdr h;
	__u64 memcg_id;        /* the cgroup being reclaimed / over memory.high (0: host) */
	__u64 duration_ns;
	__u64 reclaimed_pages; /* 0 for memory.high throttling */
	__u32 kind;            /* enum wr_stall_kind */
	__u32 _pad;
};

#define WR_CGROUP_PATH_LEN 256

/* A cgroup was created in the tracked hierarchy (only when cfg.follow_cgroups is set): lets a
 * watched container stay watched when its runtime recreates its cgroup on restart. */
struct wr_cgroup_mkdir {
	struct wr_hdr h;
	__u64 id;
	__u32 level;
	__u32 hierarchy_id;
	char path[WR_CGROUP_PATH_LEN];
};

/* Per-cgroup aggregation of every stall (map reclaim_stats), drained by user space. */
struct wr_reclaim_key {
	__u64 cgroup_id;
	__u32 kind;
	__u32 _pad;
};

struct wr_reclaim_stats {
	__u64 count;
	__u64 total_ns;
	__u64 max_ns;
	__u64 reclaimed_pages;
};

/* Set by user space in .rodata before load (const volatile), read-only afterwards. */
struct wr_config {
	__u32 filter_all;  /* 1: every process; 0: only watched pids and cgroups */
	__u32 memcg_v1;    /* 1: cgroup ids come from the v1 memory hierarchy; 0: from cgroup v2 */
	__u32 self_tgid;   /* the tracer itself: never reported */
	__u32 watch_cgroups; /* 1: watched_cgroups holds ids; walk each task's ancestors */
	__u64 stall_threshold_ns; /* stalls at least this long are sent one by one */
	__u32 follow_cgroups;     /* 1: report cgroup_mkdir in hierarchy_id */
	__u32 hierarchy_id;       /* the tracked hierarchy (v1 memory's id; 0 = cgroup v2) */
	__u32 agent_filter; /* 1 (the agent): clean exits and execs inside a unit are counted per
			     * cgroup in clean_exits, not sent */
	__u32 _pad;
};

/* ---------------------------------------------------------------------------------------- */
/* GPU allocation failures, caught at libcuda.so.1 with uprobes by bpf/gpu.bpf.c: a separate
 * object with its own ring buffer and maps, so that it and whyrestart.bpf.o cannot break each
 * other. Its records share struct wr_hdr and take type numbers from 16 up. */

enum wr_gpu_event_type {
	WR_EV_GPU_ALLOC_FAIL = 16,      /* an allocation returned CUDA_ERROR_OUT_OF_MEMORY */
	WR_EV_GPU_ALLOC_RECOVERED = 17, /* the first successful allocation after failures */
	WR_EV_GPU_CALL_FAIL = 18,       /* cuInit, context creation or an allocation returned an
					 * error other than CUDA_ERROR_OUT_OF_MEMORY */
};

/* hdr.rung of uprobe records (continues enum wr_rung) */
#define WR_RUNG_UPROBE 5

/* Which driver entry point a record is about (tracer/bpf/layout.py GPU_FUNCS names them). */
enum wr_gpu_func {
	WR_GPU_MEM_ALLOC = 1,                  /* cuMemAlloc_v2 */
	WR_GPU_MEM_ALLOC_MANAGED = 2,          /* cuMemAllocManaged */
	WR_GPU_MEM_ALLOC_PITCH = 3,            /* cuMemAllocPitch_v2 */
	WR_GPU_MEM_ALLOC_ASYNC = 4,            /* cuMemAllocAsync */
	WR_GPU_MEM_ALLOC_ASYNC_PTSZ = 5,       /* cuMemAllocAsync_ptsz */
	WR_GPU_MEM_ALLOC_FROM_POOL = 6,        /* cuMemAllocFromPoolAsync */
	WR_GPU_MEM_ALLOC_FROM_POOL_PTSZ = 7,   /* cuMemAllocFromPoolAsync_ptsz */
	WR_GPU_MEM_CREATE = 8,                 /* cuMemCreate */
	WR_GPU_INIT = 9,                       /* cuInit */
	WR_GPU_PRIMARY_CTX_RETAIN = 10,        /* cuDevicePrimaryCtxRetain (the runtime's context) */
	WR_GPU_CTX_CREATE = 11,                /* cuCtxCreate_v2 */
	WR_GPU_CTX_CREATE_V3 = 12,             /* cuCtxCreate_v3 */
	WR_GPU_CTX_CREATE_V4 = 13,             /* cuCtxCreate_v4 (CUDA 12.5) */
};

/* CUresult values the probes act on (cuda.h) */
#define WR_CUDA_SUCCESS 0
#define WR_CUDA_ERROR_OUT_OF_MEMORY 2

/* One driver call of a watched process: an allocation failure (type WR_EV_GPU_ALLOC_FAIL), the
 * first success after failures (WR_EV_GPU_ALLOC_RECOVERED), or any other failing call
 * (WR_EV_GPU_CALL_FAIL: failures then counts this process's failing calls so far, and only the
 * first WR_GPU_CALL_FAIL_SENT of them are sent). The header names the calling thread. */
struct wr_gpu_alloc {
	struct wr_hdr h;
	__u64 requested;  /* bytes asked for (pitch: width * height) */
	__u64 held_bytes; /* device bytes this process holds from probed allocations, before it */
	__u64 peak_bytes; /* high-water mark of held_bytes */
	__u64 failures;   /* failed allocations since the last success (this one included) */
	__u32 func;       /* enum wr_gpu_func */
	__s32 result;     /* the CUresult returned */
};

/* Per-process allocation bookkeeping (map gpu_stats, keyed by tgid), read by user space. */
struct wr_gpu_stats {
	__u64 held_bytes;
	__u64 peak_bytes;
	__u64 allocs;     /* successful allocations */
	__u64 failures;   /* CUDA_ERROR_OUT_OF_MEMORY returns */
	__u64 pending;    /* failures since the last success */
	__u64 untracked;  /* successes whose pointer could not be read or remembered */
	__u64 call_failures; /* WR_EV_GPU_CALL_FAIL calls (init, contexts, other errors) */
};

/* A process that a failing driver call keeps failing in a loop sends this many records; the
 * rest are counted in wr_gpu_stats.call_failures. */
#define WR_GPU_CALL_FAIL_SENT 64

/* A driver library file as the kernel sees an open file: f_inode's super block dev_t (the
 * kernel's encoding, MAJOR << 20 | MINOR) and inode number. Keys gpu_probed_files. */
struct wr_gpu_file {
	__u64 dev;
	__u64 ino;
};

/* One recorder's hold of one process, in the map every recorder shares (wr_gpu_peers, pinned
 * in bpffs by name): two recorders that watch the same process both hold it, and it is resumed
 * only when neither needs it held any more (tracer/gpu/side.py). */
struct wr_gpu_peer_key {
	__u32 tgid;       /* the held process */
	__u32 holder;     /* the recorder's id (wr_gpu_config.holder) */
};

/* A watched process stopped (SIGSTOP from BPF) right after it opened a libcuda file whose
 * uprobes were not attached yet (map gpu_held, keyed by tgid). User space attaches, then
 * resumes it with SIGCONT and deletes the entry; tracer/gpu/holdguard.py resumes whatever is
 * left if the recorder dies. */
struct wr_gpu_hold {
	struct wr_gpu_file file;
	__u64 ts_ns;      /* when it was stopped (CLOCK_BOOTTIME) */
	__s32 fd;         /* the descriptor openat returned: /proc/PID/fd/FD is the file */
	__u32 _pad;
};

/* One live allocation: what a free gives back (map gpu_live). */
struct wr_gpu_live_key {
	__u32 tgid;
	__u32 _pad;
	__u64 ptr;        /* CUdeviceptr, or CUmemGenericAllocationHandle for cuMemCreate */
};

/* Set by user space in gpu.bpf.o's .rodata before load. */
struct wr_gpu_config {
	__u32 filter_all; /* 1: every process; 0: only pids in watched_pids / watched_cgroups */
	__u32 memcg_v1;   /* as wr_config.memcg_v1: which hierarchy hdr.cgroup_id comes from */
	__u32 self_tgid;  /* the tracer itself: never reported */
	__u32 watch_cgroups; /* as wr_config.watch_cgroups (the maps are the main object's) */
	__u32 holder;     /* this recorder's id in wr_gpu_peers (random: unique per object) */
	__u32 _pad;
};

/* ---------------------------------------------------------------------------------------- */
/* Signals to watched processes that cost no record (handled, ignored, or beyond the per-second
 * cap; whyrestart.bpf.c says which are sent): per-CPU counts in map signals_unsent, one slot
 * per signal number 1..64 (slot 0: a number out of range). */
#define WR_SIG_SLOTS 65

/* wr_signal.flags. SENDER_EXITING: the sender was past do_exit() (PF_EXITING): no program sends
 * a signal then, the kernel's exit path does, i.e. forget_original_parent()'s PR_SET_PDEATHSIG
 * signal to a child of the exiting thread (kernel/exit.c; it fires when the *thread* that forked
 * the child exits, though the process lives on). */
#define WR_SIGF_SENDER_EXITING 1

#endif /* WHYRESTART_EVENTS_H */
