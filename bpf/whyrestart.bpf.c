// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * whyrestart's kernel side: process exits, fatal signals, OOM kills and process lifecycle,
 * streamed through one BPF ring buffer as the records defined in events.h.
 *
 * Every hook has a fallback ladder (ARCHITECTURE.md, "Hook ladders"). The rungs of one hook are twin programs that
 * call one shared __always_inline handler; all twins are loaded, and user space
 * (tracer/bpf/hooks.py) attaches the best one that works on this kernel. Filtering happens here,
 * before a record is reserved: only watched processes (a pid map filled from the recorded
 * command's forks, plus a cgroup map) cost a ring-buffer slot.
 *
 * Wake-ups, not decoding, dominate a ring-buffer consumer's cost (ARCHITECTURE.md, "Wake-ups cost"),
 * so bulk records are submitted with BPF_RB_NO_WAKEUP and user space drains the ring on a 10 ms
 * timer; an OOM kill forces a wake-up so that a live tail shows it at once.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "cgroup.h"
#include "events.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile struct wr_config cfg = {};

/* Ring-buffer records are only reached through void pointers, so clang would leave their types
 * out of the object's BTF (a pointer member only makes a forward declaration); this anchor, by
 * value in .bss and never touched, keeps them there for tests/test_layout.py. */
struct wr_btf_anchor {
	struct wr_exit exit;
	struct wr_signal signal;
	struct wr_oom oom;
	struct wr_fork fork;
	struct wr_exec exec;
	struct wr_stall stall;
	struct wr_cgroup_mkdir cgroup_mkdir;
	struct wr_reclaim_key reclaim_key;
	struct wr_reclaim_stats reclaim_stats;
	enum wr_event_type type; /* the enums too: the test checks the Python numbers */
	enum wr_stall_kind stall_kind;
	enum wr_rung rung;
};
struct wr_btf_anchor wr_btf_anchor __attribute__((used));

/* 2 MiB: a 256 KiB ring dropped 2-8% of a 10k exits/s storm when the consumer shared a core
 * with it; 4 MiB dropped nothing (ARCHITECTURE.md). 2 MiB holds ~26,000 exit records: 2 s of a
 * 12k exits/s storm, 0.4 s at 50,000 signals/s, against a consumer that drains every 10 ms;
 * the bench loses nothing with it either, and the ring is mapped twice, so its size counts
 * double in the recorder's RSS (4 MiB was 8 MB of a 50 MB budget). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 2 * 1024 * 1024);
} events SEC(".maps");

/* Watched processes by tgid: seeded by user space, grown by forks, shrunk by exits. gpu.bpf.c
 * shares this map and watched_cgroups (bpf_map__reuse_fd): change both definitions together. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} watched_pids SEC(".maps");

/* Watched cgroups by id (tracked hierarchy); a task in one of them or below is watched. A
 * followed container gets a new cgroup on every restart: the rmdir hook below removes the id of
 * each one that goes away, so a crash-looping container holds one entry, not one per restart.
 * Inserts that find the map full are counted (pressure_counters[2]), never silent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u8);
} watched_cgroups SEC(".maps");

/* Ids of cgroups removed from the tracked hierarchy (cgroup ids are never reused). User space
 * adds a followed container's new cgroup a few milliseconds after its mkdir record; if the
 * cgroup is already gone by then (a container that dies at once), its rmdir has passed, and
 * user space finds the id here and takes it out again (KernelHooks.watch_cgroup). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u8);
} cgroups_gone SEC(".maps");

/* Threads of watched processes: thread id -> tgid. The classic signal_generate and mark_victim
 * tracepoints (the rungs for kernels without tp_btf, < 5.5) name their task by thread id only;
 * a signal aimed at one thread (a fault in a worker, abort(), pthread_kill) must still find its
 * process. Filled by the fork hook and by user space when it seeds a running process, emptied as
 * threads exit; LRU, so it stays bounded whatever is missed. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
} watched_threads SEC(".maps");

/* The recorder's own helpers (ldconfig, podman inspect, ...) and their descendants, by tgid:
 * never evidence, whatever the filter (--all, --pid 1, a cgroup that holds the recorder). A
 * process forked by one of the recorder's threads is a helper from its fork on, and so are its
 * descendants; user space unmarks the recorded command (KernelHooks.watch_pid(command=True)).
 * Threads, not the whole process: a program that runs the recorder in a thread of its own (the
 * tests, a library user) starts its workloads from its other threads. An entry leaves at its
 * process's exit (a pid may be reused). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u8);
} helpers SEC(".maps");

/* The recorder's threads, by thread id: the one that loaded this object (KernelHooks), and every
 * thread created by one of them since. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u8);
} recorder_threads SEC(".maps");

/* Failed ring-buffer reservations, per CPU: never lose an event silently. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* oom_control seen by the fentry/kprobe rung, keyed by the OOM-ing thread, consumed by
 * mark_victim in the same call chain (oom_kill_process -> __oom_kill_process -> mark_victim),
 * and deleted when oom_kill_process returns (fexit/kretprobe): out_of_memory() also marks a
 * victim without it (task_will_free_mem(current): a task already exiting), and that must not
 * reuse the context of an earlier OOM of the same thread. */
struct oom_ctx {
	__u64 memcg_ptr;
	__u64 chosen_ptr; /* oc->chosen: the victim oom_kill_process() kills */
	__u64 ts_ns;
	__u32 rung;
	__u32 constraint; /* WR_OOM_CONSTRAINT_* from oc->constraint */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct oom_ctx);
} oom_ctxs SEC(".maps");

#define MAX_CGROUP_DEPTH 16
/* PAGE_COUNTER_MAX is LONG_MAX / PAGE_SIZE; anything this large is "no limit". */
#define UNLIMITED_PAGES (1ULL << 40)
/* Default-terminating signals worth attributing an exit to (signal(7) "Term" and "Core"):
 * HUP INT QUIT ILL TRAP ABRT BUS FPE KILL USR1 SEGV USR2 PIPE ALRM TERM STKFLT XCPU XFSZ VTALRM
 * PROF IO PWR SYS, and the real-time signals 32..64 (WR_SIGRTMIN_KERNEL). SIGCHLD, SIGCONT, stop
 * and tty signals are not. */
#define FATAL_SIGNALS                                                                           \
	((1ULL << 1) | (1ULL << 2) | (1ULL << 3) | (1ULL << 4) | (1ULL << 5) | (1ULL << 6) |     \
	 (1ULL << 7) | (1ULL << 8) | (1ULL << 9) | (1ULL << 10) | (1ULL << 11) | (1ULL << 12) | \
	 (1ULL << 13) | (1ULL << 14) | (1ULL << 15) | (1ULL << 16) | (1ULL << 24) |             \
	 (1ULL << 25) | (1ULL << 26) | (1ULL << 27) | (1ULL << 29) | (1ULL << 30) | (1ULL << 31))

/* si_code values of the kernel's special siginfo pointers (include/linux/sched/signal.h). */
#define SEND_SIG_NOINFO_PTR 0
#define SEND_SIG_PRIV_PTR 1
#define WR_SI_USER 0
#define WR_SI_KERNEL 0x80

static __always_inline void count_lost(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&lost, &zero);

	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline void *reserve(__u64 size)
{
	void *e = bpf_ringbuf_reserve(&events, size, 0);

	if (!e)
		count_lost();
	return e;
}

/* A task's cgroup in the hierarchy user space names cgroups from (cgroup.h). */
static __always_inline struct cgroup *task_cgroup(struct task_struct *task)
{
	return task_cgroup_in(task, cfg.memcg_v1);
}

static __always_inline __u64 memcg_id(struct mem_cgroup *memcg)
{
	return memcg ? BPF_CORE_READ(memcg, css.cgroup, kn, id) : 0;
}

static __always_inline bool is_watched(struct task_struct *task, __u32 tgid)
{
	struct cgroup *cgrp;

	if (tgid == cfg.self_tgid || bpf_map_lookup_elem(&helpers, &tgid))
		return false;
	if (cfg.filter_all)
		return true;
	if (bpf_map_lookup_elem(&watched_pids, &tgid))
		return true;
	if (!cfg.watch_cgroups)
		return false;
	cgrp = task_cgroup(task);
	for (int i = 0; i < MAX_CGROUP_DEPTH && cgrp; i++) {
		__u64 id = cgroup_id_of(cgrp);

		if (bpf_map_lookup_elem(&watched_cgroups, &id))
			return true;
		/* struct cgroup starts with its own css ("self"); self.parent is the parent's */
		cgrp = (struct cgroup *)BPF_CORE_READ(cgrp, self.parent);
	}
	return false;
}

/* The process of a task that a classic tracepoint names by thread id: the current task's when
 * it is that thread (a fault, abort(), an OOM the victim triggered), a watched process's thread
 * from watched_threads, else the id itself (kill(2) aims at the leader, whose id is the tgid). */
static __always_inline __u32 tgid_of_tid(__u32 tid, struct task_struct *cur)
{
	__u32 *tgid;

	if (tid == BPF_CORE_READ(cur, pid))
		return BPF_CORE_READ(cur, tgid);
	tgid = bpf_map_lookup_elem(&watched_threads, &tid);
	return tgid ? *tgid : tid;
}

static __always_inline void fill_hdr(struct wr_hdr *h, __u16 type, __u16 size, __u16 rung,
				     struct task_struct *task)
{
	h->type = type;
	h->size = size;
	h->rung = rung;
	h->_pad = 0;
	h->ts_ns = bpf_ktime_get_boot_ns();
	h->pid = BPF_CORE_READ(task, pid);
	h->tgid = BPF_CORE_READ(task, tgid);
	h->cgroup_id = cgroup_id_of(task_cgroup(task));
	BPF_CORE_READ_STR_INTO(&h->comm, task, comm);
}

/* ---------------------------------------------------------------------------------------- */
/* Process exit: one record per process (thread group), describing the process.
 *
 * Every thread passes sched_process_exit; the process ended for the one whose own decrement of
 * signal->live reached 0 (do_exit's group_dead). Reading signal->live at the tracepoint is not
 * that test: a thread that decremented earlier but reaches the tracepoint after the last one
 * reads 0 too, and a SIGKILLed process of several threads got two records. Where the tracepoint
 * passes group_dead, the twin that reads it is exact: the argument came with 3e816361e94a
 * ("sched/tracepoints: Move and extend the sched_process_exit() tracepoint", first released in
 * 6.16; before it the tracepoint passed the task only, as on 6.1 and 5.10 in the lab VMs).
 * Elsewhere live == 0 is only a candidate, and the first candidate of a process wins:
 * BPF_NOEXIST into exits_sent, keyed by tgid and the leader's start time (a reused pid is
 * another key), is atomic, so exactly one thread emits.
 *
 * The record describes the process, whichever thread passes last: the group leader's comm and
 * start time, and the status wait() reports (wait_task_zombie(): SIGNAL_GROUP_EXIT ?
 * group_exit_code : the leader's exit_code). A thread's own exit_code is not it: the threads
 * zapped by a core dump exit with the signal alone (0xb) while wait() sees 0x8b. */

/* include/linux/sched/signal.h; the same bit since 2.6 */
#define WR_SIGNAL_GROUP_EXIT 0x00000004

struct exit_key {
	__u32 tgid;
	__u32 _pad;
	__u64 start_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct exit_key);
	__type(value, __u8);
} exits_sent SEC(".maps");

/* The agent's kernel-side filter (cfg.agent_filter). What can change a verdict is sent in full:
 * every exit by a signal or a non-zero code, every exit and exec of a unit's main process (a
 * process that starts a unit: starts_unit() below), fatal signals, OOM kills and reclaim. A clean
 * exit of any other process (the scripts, compilers and health checks a host runs by the
 * thousand) is only counted per cgroup here, and an exec inside a unit is not sent: at 1,000
 * clean exits a second the agent then wakes to nothing. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);   /* cgroup id */
	__type(value, __u64); /* clean exits counted, never reset (user space takes deltas) */
} clean_exits SEC(".maps");

/* The names (comm, zero-padded) of the process supervisors that run programs as their direct
 * children and restart them: supervisord, s6-supervise, runsv, ... User space fills it from the
 * one list the analysis names those units by (tracer/analysis/senders.py PROCESS_SUPERVISORS,
 * through KernelHooks.supervisor_names), so the kernel and the analysis agree on what a
 * supervised program is; compared whole, as the analysis compares them. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, char[16]);
	__type(value, __u8);
} supervisor_comms SEC(".maps");

/* Whether a task starts a unit, so that its clean exit and its execs are sent under the agent's
 * filter:
 * - its cgroup differs from its parent's: runc, conmon, containerd-shim and systemd start a
 *   container's or service's first program from outside its cgroup;
 * - on a v1 host, its unified-tree (dfl_cgrp) cgroup differs from its parent's: systemd there
 *   gives every service a cgroup of its own in its own tree (hybrid mode) but a memory cgroup
 *   only with memory accounting on (systemd 219's default was off: Amazon Linux 2, CentOS 7
 *   userlands), so such a service shares PID 1's memory cgroup and its restarts were invisible;
 * - its parent is a process supervisor (supervisor_comms): s6-overlay, supervisord, runit or pm2
 *   as a container's PID 1 start their programs in their own cgroup; each program is its own
 *   unit to the analysis (tracer/analysis/processes.py find_unit), restarted by the supervisor.
 * What this costs: one more cgroup pointer compare on v1, and a 16-byte hash lookup of the
 *   parent's name for each exit and exec the filter would otherwise drop; what it sends more: the
 *   clean exits and execs of the direct children of supervisors and of unified-tree cgroup
 *   starts. Both are bounded by how often units (re)start, not by the host's exit rate: a
 *   supervisor's direct children are the programs it runs and restarts (s6-supervise and runsv
 *   wait a second between restarts, supervisord backs off), and the busy work (a shell's loop,
 *   a compiler's children) happens below them, where the parent is no supervisor. */
static __always_inline bool is_supervisor(struct task_struct *task)
{
	/* pm2's daemon renames itself "PM2 v5.3.1: God Daemon (...)" (its comm: the first 15
	 * characters): matched by prefix (tracer/analysis/senders.py PM2_TITLE) */
	static const char pm2[] = "PM2 v";
	char comm[16] = {}; /* (zero-padded: the whole key is compared) */

	BPF_CORE_READ_STR_INTO(&comm, task, comm);
	if (bpf_map_lookup_elem(&supervisor_comms, comm))
		return true;
	for (int i = 0; i < sizeof(pm2) - 1; i++)
		if (comm[i] != pm2[i])
			return false;
	return true;
}

static __always_inline bool starts_unit(struct task_struct *task)
{
	struct task_struct *parent = BPF_CORE_READ(task, real_parent);

	if (!parent || cgroup_id_of(task_cgroup(task)) != cgroup_id_of(task_cgroup(parent)))
		return true;
	if (cfg.memcg_v1 &&
	    BPF_CORE_READ(task, cgroups, dfl_cgrp) != BPF_CORE_READ(parent, cgroups, dfl_cgrp))
		return true;
	return is_supervisor(parent);
}

static __always_inline void count_clean_exit(struct task_struct *task)
{
	__u64 id = cgroup_id_of(task_cgroup(task));
	__u64 one = 1, *n = bpf_map_lookup_elem(&clean_exits, &id);

	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&clean_exits, &id, &one, BPF_NOEXIST);
}

#define WR_PF_KTHREAD 0x00200000 /* include/linux/sched.h, the same bit since 2.6.27 */

/* group_dead: 1 or 0 from the tracepoint, -1 where the kernel does not pass it. */
static __always_inline int handle_exit(struct task_struct *task, int group_dead, __u16 rung)
{
	struct task_struct *leader;
	struct wr_exit *e;
	__u32 tgid = BPF_CORE_READ(task, tgid);
	bool helper;
	__u64 start;
	__u32 flags, code;

	if (tgid == cfg.self_tgid) {
		__u32 tid = BPF_CORE_READ(task, pid);

		bpf_map_delete_elem(&recorder_threads, &tid);
	} else if (!cfg.filter_all && BPF_CORE_READ(task, pid) != tgid) {
		__u32 tid = BPF_CORE_READ(task, pid);

		bpf_map_delete_elem(&watched_threads, &tid);
	}
	if (tgid == cfg.self_tgid || !group_dead)
		return 0;
	/* A kernel thread's exit (kthread_exit(ret) -> do_exit(ret)) is nobody's restart, and its
	 * code is an errno, not a wait status: -EINTR read as one is "killed by signal 124"
	 * (kernel-side review §18). */
	if (BPF_CORE_READ(task, flags) & WR_PF_KTHREAD)
		return 0;
	if (group_dead < 0 && BPF_CORE_READ(task, signal, live.counter) != 0)
		return 0;
	helper = bpf_map_lookup_elem(&helpers, &tgid) != NULL;
	if (!helper && !is_watched(task, tgid))
		return 0;
	leader = BPF_CORE_READ(task, group_leader);
	start = BPF_CORE_READ(leader, start_boottime);
	if (group_dead < 0) {
		struct exit_key k = {.tgid = tgid, .start_ns = start};
		__u8 one = 1;

		if (bpf_map_update_elem(&exits_sent, &k, &one, BPF_NOEXIST))
			return 0;
	}
	if (helper) {
		/* (only now, once the process has ended: its pid may be reused) */
		bpf_map_delete_elem(&helpers, &tgid);
		return 0;
	}
	bpf_map_delete_elem(&watched_pids, &tgid);
	flags = BPF_CORE_READ(task, signal, flags);
	if (flags & WR_SIGNAL_GROUP_EXIT)
		code = BPF_CORE_READ(task, signal, group_exit_code);
	else
		code = BPF_CORE_READ(leader, exit_code);
	if (cfg.agent_filter && code == 0 && !starts_unit(leader)) {
		count_clean_exit(leader);
		return 0;
	}

	e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->h, WR_EV_EXIT, sizeof(*e), rung, task);
	e->h.pid = tgid;
	BPF_CORE_READ_STR_INTO(&e->h.comm, leader, comm);
	e->exit_code = code;
	e->ppid = BPF_CORE_READ(leader, real_parent, tgid);
	e->start_ns = start;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(exit_btf, struct task_struct *task, bool group_dead)
{
	return handle_exit(task, group_dead, WR_RUNG_TP_BTF);
}

/* Kernels whose tracepoint is sched_process_exit(task) (before 3e816361e94a, 6.16: 6.1, 5.10):
 * the verifier refuses the twin above (no second argument) and this one de-duplicates. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(exit_btf_dedup, struct task_struct *task)
{
	return handle_exit(task, -1, WR_RUNG_TP_BTF);
}

/* Fallbacks for kernels without tp_btf (< 5.5): the classic tracepoint runs in the exiting task,
 * so the task is current. Its record has group_dead where the tp_btf prototype has it; where the
 * field is missing, the CO-RE relocation of ctx->group_dead fails and the load refuses this
 * program, and the de-duplicating twin takes over. (The design paired this rung with
 * syscalls/sys_enter_exit_group for the code; the status read above is exact for exit_group,
 * exit and fatal signals alike, so that second hook is not needed.) */
/* The record's layout since 3e816361e94a (6.16), declared here, not taken from vmlinux.h: before
 * that commit sched_process_exit was a DEFINE_EVENT of sched_process_template, and a DEFINE_EVENT
 * declares no trace_event_raw_<event> struct, so a vmlinux.h generated on a pre-6.16 build host
 * (Debian 12's 6.1, Ubuntu 22.04/24.04, RHEL 9) has none and this file did not compile there.
 * libbpf drops the ___616 flavour suffix when it matches the running kernel's type; a kernel
 * without the struct refuses this program at load, as it always did, and exit_tp_dedup runs. */
struct trace_event_raw_sched_process_exit___616 {
	struct trace_entry ent;
	char comm[16];
	pid_t pid;
	int prio;
	bool group_dead;
} __attribute__((preserve_access_index));

SEC("tracepoint/sched/sched_process_exit")
int exit_tp(struct trace_event_raw_sched_process_exit___616 *ctx)
{
	return handle_exit((struct task_struct *)bpf_get_current_task(), ctx->group_dead,
			   WR_RUNG_TRACEPOINT);
}

SEC("tracepoint/sched/sched_process_exit")
int exit_tp_dedup(void *ctx)
{
	return handle_exit((struct task_struct *)bpf_get_current_task(), -1, WR_RUNG_TRACEPOINT);
}

/* ---------------------------------------------------------------------------------------- */
/* Fatal signals (signal/signal_generate, from __send_signal_locked()). The sender is the current
 * task. The OOM killer's own SIGKILL arrives here too, with si_code SI_KERNEL, right before
 * mark_victim (__oom_kill_process() sends it, then marks the victim): user space links it to
 * the OOM kill instead of counting a second cause. */

/*
 * Only a signal that can end its target, or explain its end, costs a record; the rest are
 * counted here by number (signals_unsent) and user space shows the counts (the footer's
 * signals_unsent, the agent's whyrestart_signals_unrecorded_total). Routine signals are
 * handled or ignored by the thousand a second, each a record before: CPython ignores SIGPIPE
 * (every EPIPE write is an IGNORED generation), Go catches SIGPIPE and its runtime preempts
 * goroutines with SIGURG (not in FATAL_SIGNALS: default-ignored, so never a record), profilers
 * send SIGPROF at 100 Hz per busy thread, JDK safepoint polls fault with SIGSEGV on every
 * running thread, Boehm GC stops the world with SIGPWR/SIGXCPU. A burst of them filled the
 * ring during the agent's idle wait and lost the OOM and exit records that came next.
 * Signals whose default is not to end the process (SIGURG, SIGCHLD, SIGCONT, SIGWINCH, the
 * stop signals) are counted too: what a watched process received is all accounted for.
 *
 * What is sent (tracer/analysis/rules.py reads a signal when its number is the one the process
 * died of, as a stop's SIGTERM before its SIGKILL, or as the signal N a handled stop's exit
 * 128 + N answers):
 * - SIGKILL, always (it can be neither handled nor ignored; the OOM killer's and a
 *   redundant one after the first alike: senders.fatal_signal picks the delivered one);
 * - a signal the kernel did not drop (result != TRACE_SIGNAL_IGNORED: SIG_IGN, or a target
 *   already exiting, prepare_signal()) whose action in the target is SIG_DFL: the kernel
 *   ends the process with it (complete_signal());
 * - a handled or ignored signal sent by another process: the stop a graceful exit answers
 *   (systemd, kubelet, runc kill, a STOPSIGNAL of any number; rules.handled_stop reads the
 *   exit 128 + N after it), the SIGTERM a process ignores before its grace runs out and the
 *   SIGKILL comes (rules: "SIGTERM, then SIGKILL"), and the one a Go program (whose runtime
 *   handles them all) re-raises with SIG_DFL to die of; the re-raise names the process
 *   itself, so only this record names who stopped it;
 * - a handled fault the kernel raised (si_code > 0: SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
 *   SIGSYS at the faulting task): Python's faulthandler and crash reporters re-raise it with
 *   raise() (SI_TKILL), and only this record says the death was a fault.
 * The last two are capped at HANDLED_PER_SECOND per (process, signal) a second
 * (handled_seen): a loop of them (a JVM's safepoint SIGSEGVs, a hostile sender) costs a few
 * records a second, never the ring.
 * What a process sends itself or the kernel raises in its context, handled or ignored, is only
 * counted (CPython's SIGPIPE on EPIPE, send_sig(SIGPIPE, current); an itimer's SIGPROF).
 * On the classic tracepoint (kernels without tp_btf, < 5.5) the target's task is only known
 * when the sender is the target itself: another sender's signal is sent there unless the
 * kernel dropped it (IGNORED), capped then.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, WR_SIG_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} signals_unsent SEC(".maps");

struct handled_window {
	__u64 start_ns;
	__u64 n;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64); /* tgid << 8 | sig */
	__type(value, struct handled_window);
} handled_seen SEC(".maps");

#define HANDLED_PER_SECOND 8
/* Real-time signals, 32..64 (the kernel's SIGRTMIN is 32; glibc keeps 32 and 33 for itself and
 * handles them): their default action ends the process (signal(7)), so one a process leaves at
 * SIG_DFL explains its death like any other; the handled ones are counted like any other. */
#define WR_SIGRTMIN_KERNEL 32
#define WR_PF_EXITING 0x00000004 /* include/linux/sched.h, the same bit since 2.6 */
#define WR_SIG_IGN 1 /* include/uapi/asm-generic/signal-defs.h: SIG_DFL 0, SIG_IGN 1 */
#define WR_TRACE_SIGNAL_IGNORED 1
/* ILL TRAP BUS FPE SEGV SYS */
#define FAULT_SIGNALS ((1ULL << 4) | (1ULL << 5) | (1ULL << 7) | (1ULL << 8) | (1ULL << 11) | \
		       (1ULL << 31))

static __always_inline void count_unsent(int sig)
{
	__u32 slot = (__u32)sig < WR_SIG_SLOTS ? (__u32)sig : 0;
	__u64 *n = bpf_map_lookup_elem(&signals_unsent, &slot);

	if (n)
		*n += 1; /* (per CPU: no other writer) */
}

/* At most HANDLED_PER_SECOND of one signal to one process a second (a fixed window; two CPUs
 * racing may let one or two more through, never a storm). */
static __always_inline bool handled_allowed(__u32 tgid, int sig)
{
	__u64 key = ((__u64)tgid << 8) | (__u32)sig;
	__u64 now = bpf_ktime_get_boot_ns();
	struct handled_window *w = bpf_map_lookup_elem(&handled_seen, &key);

	if (!w || now - w->start_ns >= 1000000000ULL) {
		struct handled_window fresh = {.start_ns = now, .n = 1};

		bpf_map_update_elem(&handled_seen, &key, &fresh, BPF_ANY);
		return true;
	}
	/* The count before this one, read apart from the add: an atomic add whose result is used
	 * is BPF_FETCH, which kernels before 5.12 (5.10: Debian 11, Ubuntu 20.04's HWE, RHEL 8's
	 * 4.18 backports) refuse with EINVAL, and with it the whole signal hook (seen in the
	 * lab's 5.10 VM). Racing CPUs may let one more through: the window is a bound, not a
	 * count. */
	__u64 seen = w->n;

	__sync_fetch_and_add(&w->n, 1);
	return seen < HANDLED_PER_SECOND;
}

/* Whether a generated signal to a watched process is worth a record (see above). */
static __always_inline bool signal_matters(int sig, int si_code, int result,
					   struct task_struct *target, __u32 tgid,
					   struct task_struct *cur)
{
	struct sighand_struct *sh;
	unsigned long handler = 0;

	bool from_other;

	if (sig == 9)
		return true;
	from_other = BPF_CORE_READ(cur, tgid) != tgid;
	if (result == WR_TRACE_SIGNAL_IGNORED)
		return from_other && handled_allowed(tgid, sig);
	if (!target)
		return true; /* (classic tracepoint, another task: its disposition is unknown) */
	sh = BPF_CORE_READ(target, sighand);
	if (!sh || bpf_core_read(&handler, sizeof(handler), &sh->action[(sig - 1) & 63].sa.sa_handler))
		return true; /* (unreadable: send, as before) */
	if (handler == 0)
		return true; /* SIG_DFL */
	if (from_other)
		return handled_allowed(tgid, sig);
	if (handler == WR_SIG_IGN)
		return false;
	if (sig < 64 && ((FAULT_SIGNALS >> sig) & 1) && si_code > 0)
		return handled_allowed(tgid, sig);
	return false;
}

static __always_inline int handle_signal(int sig, int si_code, struct task_struct *target,
					 __u32 target_pid, const char *target_comm, int group,
					 int result, __u16 rung)
{
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task();
	struct wr_signal *e;
	__u32 tgid;

	/* (_NSIG is 64: SIGRTMAX is a signal too) */
	if (sig <= 0 || sig > 64)
		return 0;
	/* the classic tracepoint names the target by thread id only: the sender's own thread
	 * (a fault, abort()) is a task we have */
	if (!target && target_pid == BPF_CORE_READ(cur, pid))
		target = cur;
	if (target) {
		tgid = BPF_CORE_READ(target, tgid);
		if (tgid == cfg.self_tgid || !is_watched(target, tgid))
			return 0;
	} else {
		tgid = tgid_of_tid(target_pid, cur);
		if (tgid == cfg.self_tgid ||
		    (!cfg.filter_all && !bpf_map_lookup_elem(&watched_pids, &tgid)))
			return 0;
	}
	if (!(sig >= WR_SIGRTMIN_KERNEL || ((FATAL_SIGNALS >> (sig & 63)) & 1)) ||
	    !signal_matters(sig, si_code, result, target, tgid, cur)) {
		count_unsent(sig);
		return 0;
	}

	e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->h, WR_EV_SIGNAL, sizeof(*e), rung, cur);
	/* the sending process's name, not its thread's ("tokio-runtime-w", "Executor #1 for") */
	BPF_CORE_READ_STR_INTO(&e->h.comm, cur, group_leader, comm);
	e->target_pid = tgid;
	e->sig = sig;
	e->si_code = si_code;
	e->result = result;
	e->group = group;
	e->flags = BPF_CORE_READ(cur, flags) & WR_PF_EXITING ? WR_SIGF_SENDER_EXITING : 0;
	if (target)
		BPF_CORE_READ_STR_INTO(&e->target_comm, target, group_leader, comm);
	else
		bpf_probe_read_kernel_str(&e->target_comm, sizeof(e->target_comm), target_comm);
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/signal_generate")
int BPF_PROG(signal_btf, int sig, struct kernel_siginfo *info, struct task_struct *task,
	     int group, int result)
{
	int code;

	/* SEND_SIG_NOINFO and SEND_SIG_PRIV are the pointer values 0 and 1, not structs; the
	 * tracepoint's own TP_STORE_SIGINFO maps them the same way. */
	if ((unsigned long)info == SEND_SIG_NOINFO_PTR)
		code = WR_SI_USER;
	else if ((unsigned long)info == SEND_SIG_PRIV_PTR)
		code = WR_SI_KERNEL;
	else
		code = BPF_CORE_READ(info, si_code);
	return handle_signal(sig, code, task, 0, NULL, group, result, WR_RUNG_TP_BTF);
}

SEC("tracepoint/signal/signal_generate")
int signal_tp(struct trace_event_raw_signal_generate *ctx)
{
	return handle_signal(ctx->sig, ctx->code, NULL, ctx->pid, ctx->comm, ctx->group,
			     ctx->result, WR_RUNG_TRACEPOINT);
}

/* ---------------------------------------------------------------------------------------- */
/* OOM kills.
 *
 * Best rung: oom_kill_process(struct oom_control *oc, const char *message) names the memcg the
 * OOM was constrained to (oc->memcg) and the constraint itself. fentry needs BPF trampolines
 * (refused with EPERM on some kernels, e.g. under lockdown), kprobe needs CONFIG_KPROBES; either
 * one only records oc in oom_ctxs. The record is emitted by mark_victim, which fires once per
 * victim, memory.oom.group members included (oom_kill_process runs once per OOM and would miss
 * them).
 *
 * Without oc, the limit is found by walking the memory cgroups from the victim (tp_btf rung: the
 * tracepoint's prototype is mark_victim(task, uid) on recent kernels (6.18, and Debian's 6.1.192
 * and 5.10.262 by backport), while older ones such as Debian 11's 5.10.223 have
 * mark_victim(int pid), which the verifier then refuses and the next rung takes over) or
 * from the OOM-ing current task (classic tracepoint, whose record names the victim only by pid)
 * up to the root, and picking the limited one with the least headroom.
 */

/* out_of_memory() sets oc->constraint (constrained_alloc()) before oom_kill_process(): an
 * allocation restricted to some NUMA nodes by a cpuset (cpuset.mems, the Kubernetes Memory
 * Manager) or a mempolicy (numactl --membind, mbind) can exhaust those nodes while the host has
 * memory to spare: not "the whole machine". The enum's values are read through CO-RE. */
static __always_inline __u32 oc_constraint(struct oom_control *oc)
{
	int c;

	if (!bpf_core_field_exists(oc->constraint))
		return WR_OOM_CONSTRAINT_UNKNOWN;
	c = BPF_CORE_READ(oc, constraint);
	if (c == bpf_core_enum_value(enum oom_constraint, CONSTRAINT_MEMCG))
		return WR_OOM_CONSTRAINT_MEMCG;
	if (c == bpf_core_enum_value(enum oom_constraint, CONSTRAINT_CPUSET))
		return WR_OOM_CONSTRAINT_CPUSET;
	if (c == bpf_core_enum_value(enum oom_constraint, CONSTRAINT_MEMORY_POLICY))
		return WR_OOM_CONSTRAINT_MEMPOLICY;
	return WR_OOM_CONSTRAINT_NONE;
}

static __always_inline void note_oc(struct oom_control *oc, __u32 rung)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct oom_ctx c = {};

	c.memcg_ptr = (__u64)BPF_CORE_READ(oc, memcg);
	c.chosen_ptr = (__u64)BPF_CORE_READ(oc, chosen);
	c.ts_ns = bpf_ktime_get_boot_ns();
	c.rung = rung;
	c.constraint = oc_constraint(oc);
	bpf_map_update_elem(&oom_ctxs, &tid, &c, BPF_ANY);
}

SEC("fentry/oom_kill_process")
int BPF_PROG(oom_fentry, struct oom_control *oc, const char *message)
{
	note_oc(oc, WR_RUNG_FENTRY);
	return 0;
}

SEC("kprobe/oom_kill_process")
int BPF_KPROBE(oom_kprobe, struct oom_control *oc, const char *message)
{
	note_oc(oc, WR_RUNG_KPROBE);
	return 0;
}

/* Every victim of this OOM, memory.oom.group members included, was marked inside
 * oom_kill_process(): its context is spent. */
static __always_inline void forget_oc(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	bpf_map_delete_elem(&oom_ctxs, &tid);
}

SEC("fexit/oom_kill_process")
int BPF_PROG(oom_fexit)
{
	forget_oc();
	return 0;
}

SEC("kretprobe/oom_kill_process")
int BPF_KRETPROBE(oom_kretprobe)
{
	forget_oc();
	return 0;
}

/* A memcg charge fails when usage + charge > max, and a charge is at most a PMD-sized folio
 * (512 pages on x86-64), so the counter that ran out is within that of its max when the OOM
 * killer runs. Only an absolute margin: a cgroup merely close to a large limit (say 10 MiB
 * under 1 GiB) when the host runs out is not "at its limit", and a global OOM must not be
 * called a memcg one for it (the kernel log's constraint settles it in the analysis anyway). */
#define AT_LIMIT_PAGES 1024

static __always_inline bool at_limit(__u64 usage, __u64 max)
{
	return max <= usage || max - usage <= AT_LIMIT_PAGES;
}

struct limited {
	__u64 id;
	__u64 max;
	__u64 usage;
	__s64 headroom;
	int memsw; /* the counter found is memory+swap's (v1) */
};

/* Walk one page counter and its parents: the charge path (try_charge_memcg ->
 * page_counter_try_charge) climbs page_counter.parent, not the cgroup tree. They differ on v1
 * with use_hierarchy=0 (a parentless counter; allowed until 5.11 deprecated the mode), where
 * css.parent would blame an ancestor whose limit the charge never met. off is the counter's
 * offset in struct mem_cgroup (memory or memsw), to get each counter's memcg back. */
static __always_inline void walk_counters(struct page_counter *c, __u64 off, int want_high,
					  int memsw, struct limited *out)
{
	for (int i = 0; i < MAX_CGROUP_DEPTH && c; i++) {
		__u64 max = UNLIMITED_PAGES;

		/* page_counter.high exists since 5.8; older kernels kept it elsewhere */
		if (!want_high)
			max = BPF_CORE_READ(c, max);
		else if (bpf_core_field_exists(c->high))
			max = BPF_CORE_READ(c, high);
		__u64 usage = BPF_CORE_READ(c, usage.counter);

		if (max < UNLIMITED_PAGES) {
			/* "headroom" goes negative over memory.high: compare as signed */
			__s64 headroom = (__s64)max - (__s64)usage;

			if (headroom < out->headroom) {
				out->headroom = headroom;
				out->id = memcg_id((struct mem_cgroup *)((__u64)c - off));
				out->max = max;
				out->usage = usage;
				out->memsw = memsw;
			}
		}
		c = BPF_CORE_READ(c, parent);
	}
}

/* The memory cgroup with the least headroom under its max (want_high == 0) or the one furthest
 * over its memory.high (want_high == 1), from memcg up. On cgroup v1 with swap accounting the
 * memory+swap counter (memory.memsw.limit_in_bytes) is a limit of its own: an OOM bound by it
 * happens with memory usage well under memory.limit_in_bytes, so it is walked too. */
static __always_inline void find_limited(struct mem_cgroup *memcg, struct limited *out,
					 int want_high)
{
	out->id = 0;
	out->max = 0;
	out->usage = 0;
	out->headroom = 0x7fffffffffffffffLL;
	out->memsw = 0;
	if (!memcg)
		return;
	walk_counters(&memcg->memory, bpf_core_field_offset(struct mem_cgroup, memory), want_high, 0,
		      out);
	if (!want_high && cfg.memcg_v1 && bpf_core_field_exists(memcg->memsw))
		walk_counters(&memcg->memsw, bpf_core_field_offset(struct mem_cgroup, memsw), 0, 1,
			      out);
}

static __always_inline void find_limit(struct mem_cgroup *memcg, struct wr_oom *e)
{
	struct limited lim;

	find_limited(memcg, &lim, 0);
	e->limit_cgroup_id = lim.id;
	e->limit_pages = lim.max;
	e->usage_pages = lim.usage;
	e->memcg = lim.id && at_limit(lim.usage, lim.max);
	if (e->memcg && lim.memsw)
		e->flags |= WR_OOM_MEMSW;
}

/* One record per victim process: mark_oom_victim() guards on the per-thread TIF_MEMDIE, so in
 * a global OOM each further thread of a killed process that enters out_of_memory() is marked
 * again there (task_will_free_mem(current): no kill, no oom_control), after the kill itself
 * was. The first record of a victim is the kill's, with its exact context; the later marks of
 * the same process (tgid and the leader's start time: a reused pid is another key) are not
 * sent. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct exit_key);
	__type(value, __u8);
} oom_victims SEC(".maps");

/* The mark is not the OOM killer's kill when the victim was already exiting by itself:
 * out_of_memory() and oom_kill_process() only mark a task_will_free_mem() victim (group exit
 * under way, or a single thread in do_exit) and let it go. Its exit status is then its own
 * (exit_group's code, a signal other than SIGKILL). A victim the OOM killer kills has the
 * SIGKILL it was just sent as its group exit code (complete_signal()) when it is marked. */
#define WR_PF_EXITING 0x00000004 /* include/linux/sched.h, the same bit since 2.6 */
#define WR_SIGKILL 9

static __always_inline bool exiting_on_its_own(struct task_struct *victim)
{
	__u32 flags = BPF_CORE_READ(victim, signal, flags);

	if (flags & WR_SIGNAL_GROUP_EXIT)
		return (BPF_CORE_READ(victim, signal, group_exit_code) & 0x7f) != WR_SIGKILL;
	return BPF_CORE_READ(victim, flags) & WR_PF_EXITING;
}

static __always_inline int handle_victim(struct task_struct *victim, __u32 victim_pid,
					 __u16 rung)
{
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task();
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct oom_ctx *oc = bpf_map_lookup_elem(&oom_ctxs, &tid);
	struct exit_key k = {};
	struct wr_oom *e;

	/* The classic tracepoint names the victim by thread id: often the thread whose
	 * allocation failed, i.e. the current task; else, where oom_kill_process() was hooked,
	 * the task it was passed (oc->chosen): a victim another task's allocation chose (the
	 * largest process of a cgroup, one that entered it by migration and so is not in
	 * watched_pids) is then known by its task, its comm and its cgroup, not by a bare tid
	 * (kernel-side review §10). memory.oom.group's other members are not oc->chosen and stay
	 * named by the kernel log. */
	if (!victim && victim_pid == BPF_CORE_READ(cur, pid))
		victim = cur;
	if (!victim && oc && oc->chosen_ptr) {
		struct task_struct *chosen = (struct task_struct *)oc->chosen_ptr;

		if (BPF_CORE_READ(chosen, pid) == victim_pid)
			victim = chosen;
	}
	if (victim) {
		__u8 one = 1;

		victim_pid = BPF_CORE_READ(victim, tgid);
		if (!is_watched(victim, victim_pid))
			return 0;
		k.tgid = victim_pid;
		k.start_ns = BPF_CORE_READ(victim, group_leader, start_boottime);
		if (bpf_map_update_elem(&oom_victims, &k, &one, BPF_NOEXIST))
			return 0;
	} else {
		victim_pid = tgid_of_tid(victim_pid, cur);
		if (!cfg.filter_all && !bpf_map_lookup_elem(&watched_pids, &victim_pid) &&
		    !is_watched(cur, BPF_CORE_READ(cur, tgid)))
			return 0;
	}

	e = reserve(sizeof(*e));
	if (!e) {
		/* (lost, and counted: a later mark of the same victim may still tell it) */
		if (k.tgid)
			bpf_map_delete_elem(&oom_victims, &k);
		return 0;
	}
	fill_hdr(&e->h, WR_EV_OOM, sizeof(*e), rung, cur);
	e->victim_pid = victim_pid;
	e->memcg = 0;
	e->limit_cgroup_id = 0;
	e->limit_pages = 0;
	e->usage_pages = 0;
	e->constraint = WR_OOM_CONSTRAINT_UNKNOWN;
	e->flags = victim && exiting_on_its_own(victim) ? WR_OOM_EXITING : 0;
	if (victim) {
		e->victim_cgroup_id = cgroup_id_of(task_cgroup(victim));
		/* the process, not the thread the OOM killer's scan happened to pick (a memcg scan
		 * walks every thread) */
		BPF_CORE_READ_STR_INTO(&e->victim_comm, victim, group_leader, comm);
	} else {
		e->victim_cgroup_id = 0;
		__builtin_memset(&e->victim_comm, 0, sizeof(e->victim_comm));
	}

	/* The context lives from oom_kill_process() entry to its return (fexit/kretprobe delete it)
	 * however long dump_header() prints to a slow serial console or a memory.oom.group scan
	 * takes; the bound only retires a context whose kretprobe was missed (maxactive). */
	if (oc && e->h.ts_ns - oc->ts_ns < 60000000000ULL) {
		struct mem_cgroup *memcg = (struct mem_cgroup *)oc->memcg_ptr;

		e->h.rung = oc->rung;
		e->constraint = oc->constraint;
		if (memcg) {
			e->memcg = 1;
			e->limit_cgroup_id = memcg_id(memcg);
			e->limit_pages = BPF_CORE_READ(memcg, memory.max);
			e->usage_pages = BPF_CORE_READ(memcg, memory.usage.counter);
			/* On v1 with swap accounting the charge that failed may have been the
			 * memory+swap counter's (try_charge_memcg: mem_over_limit is then the memcg
			 * of memsw): report the counter that is at its limit, not memory's at 600 MiB
			 * of 1 GiB (kernel-side review §15). */
			if (cfg.memcg_v1 && bpf_core_field_exists(memcg->memsw) &&
			    !at_limit(e->usage_pages, e->limit_pages)) {
				__u64 max = BPF_CORE_READ(memcg, memsw.max);
				__u64 usage = BPF_CORE_READ(memcg, memsw.usage.counter);

				if (max < UNLIMITED_PAGES && at_limit(usage, max)) {
					e->limit_pages = max;
					e->usage_pages = usage;
					e->flags |= WR_OOM_MEMSW;
				}
			}
		}
	} else {
		find_limit(task_memcg(victim ? victim : cur), e);
	}
	/* urgent: wake the consumer now */
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

SEC("tp_btf/mark_victim")
int BPF_PROG(oom_btf, struct task_struct *task)
{
	/* task->pid is a direct (BTF-typed) load, which the verifier refuses where the argument is
	 * mark_victim(int pid) (a CO-RE read would accept the int and read nothing) */
	return task->pid ? handle_victim(task, 0, WR_RUNG_TP_BTF) : 0;
}

SEC("tracepoint/oom/mark_victim")
int oom_tp(struct trace_event_raw_mark_victim *ctx)
{
	return handle_victim(NULL, ctx->pid, WR_RUNG_TRACEPOINT);
}

/* ---------------------------------------------------------------------------------------- */
/* Lifecycle: a watched process's new processes are watched too (its new threads only go into
 * watched_threads, for the classic tracepoints). Fork records are only sent when filtering
 * (under --all every exit is reported anyway and a fork storm would double the ring traffic),
 * and under the agent's filter for a process supervisor's children.
 * raw_tp twins carry the same arguments as tp_btf and are the fallback where tp_btf is
 * missing. */

static __always_inline int handle_fork(struct task_struct *parent, struct task_struct *child,
				       __u16 rung)
{
	__u32 child_pid = BPF_CORE_READ(child, pid);
	__u32 parent_tgid = BPF_CORE_READ(parent, tgid);
	__u32 parent_tid = BPF_CORE_READ(parent, pid);
	bool by_recorder = parent_tgid == cfg.self_tgid &&
			   bpf_map_lookup_elem(&recorder_threads, &parent_tid) != NULL;
	struct wr_fork *e;
	__u8 one = 1;

	if (child_pid != BPF_CORE_READ(child, tgid)) {
		if (by_recorder)
			bpf_map_update_elem(&recorder_threads, &child_pid, &one, BPF_ANY);
	} else if (by_recorder || bpf_map_lookup_elem(&helpers, &parent_tgid)) {
		bpf_map_update_elem(&helpers, &child_pid, &one, BPF_ANY);
		return 0;
	}
	if (cfg.filter_all) {
		/* Under the agent's filter, a process supervisor's new process is sent: its exec
		 * names a program the supervisor restarts (starts_unit), and the analysis needs its
		 * parent to know it for one (an exec record carries none), and the runtime follower to
		 * know it for the container's own, not a check exec'd in from outside. Bounded as
		 * starts_unit's records are: a supervisor forks the programs it (re)starts. */
		if (!cfg.agent_filter || child_pid != BPF_CORE_READ(child, tgid) ||
		    parent_tgid == cfg.self_tgid || !is_supervisor(parent))
			return 0;
	} else {
		if (!is_watched(parent, parent_tgid))
			return 0;
		if (child_pid != BPF_CORE_READ(child, tgid)) {
			/* a new thread: only its process is needed, for the classic tracepoints */
			bpf_map_update_elem(&watched_threads, &child_pid, &parent_tgid, BPF_ANY);
			return 0;
		}
		bpf_map_update_elem(&watched_pids, &child_pid, &one, BPF_ANY);
	}

	e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->h, WR_EV_FORK, sizeof(*e), rung, parent);
	e->child_pid = child_pid;
	e->_pad = 0;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(fork_btf, struct task_struct *parent, struct task_struct *child)
{
	return handle_fork(parent, child, WR_RUNG_TP_BTF);
}

SEC("raw_tp/sched_process_fork")
int BPF_PROG(fork_raw, struct task_struct *parent, struct task_struct *child)
{
	return handle_fork(parent, child, WR_RUNG_TRACEPOINT);
}

static __always_inline int handle_exec(struct task_struct *task, struct linux_binprm *bprm,
				       __u16 rung)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);
	struct wr_exec *e;

	if (tgid == cfg.self_tgid || !is_watched(task, tgid))
		return 0;
	if (cfg.agent_filter && !starts_unit(task))
		return 0;
	e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->h, WR_EV_EXEC, sizeof(*e), rung, task);
	bpf_probe_read_kernel_str(&e->filename, sizeof(e->filename), BPF_CORE_READ(bprm, filename));
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(exec_btf, struct task_struct *task, pid_t old_pid, struct linux_binprm *bprm)
{
	return handle_exec(task, bprm, WR_RUNG_TP_BTF);
}

SEC("raw_tp/sched_process_exec")
int BPF_PROG(exec_raw, struct task_struct *task, pid_t old_pid, struct linux_binprm *bprm)
{
	return handle_exec(task, bprm, WR_RUNG_TRACEPOINT);
}

/* ---------------------------------------------------------------------------------------- */
/* Memory pressure: reclaim stalls and memory.high throttling of watched tasks.
 *
 * A begin hook stores (start time, cgroup being reclaimed, kind) per thread; the matching end
 * hook adds the duration to a per-(cgroup, kind) aggregate that user space reads once a second,
 * and sends a record only for a stall of at least cfg.stall_threshold_ns: a reclaim storm costs
 * map updates, not ring-buffer traffic.
 *
 * Which cgroup is being reclaimed: the best rung (fentry/kprobe on
 * try_to_free_mem_cgroup_pages) gets it as the first argument. The vmscan tracepoints carry no
 * cgroup on kernels before the memcg-aware tracepoint format (6.18 here has none), so the
 * fallback walks the stalled task's memory cgroups for the one at its limit: the charge path
 * reclaims exactly that one (try_charge -> mem_over_limit). Host direct reclaim is charged to
 * cgroup 0.
 */

struct reclaim_start {
	__u64 ts_ns;
	__u64 memcg_id;
	__u32 kind;
	__u32 rung;
};

/* Stalls of different kinds nest (the over-high handler reclaims inside itself), and a thread
 * id is reused: the key is (thread, its start time, kind). LRU, so starts whose end never came
 * (a kretprobe that missed its return, a thread killed in reclaim) cannot fill it. */
struct reclaim_start_key {
	__u32 tid;
	__u32 kind;
	__u64 task_start_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct reclaim_start_key);
	__type(value, struct reclaim_start);
} reclaim_starts SEC(".maps");

/* A start older than this is a leftover whose end was missed, not a stall: closing it would
 * report an inflated duration. The memory.high penalty sleeps at most 2 s a pass
 * (MEMCG_MAX_HIGH_DELAY_JIFFIES); direct reclaim of a minute is a hung host, long past any
 * verdict's window. */
#define STALE_START_NS (60ULL * 1000000000ULL)

/* Per-(cgroup, kind) totals since the recording began. User space reads them and takes
 * differences; it does not delete an entry to reset it, because a stall_end holding the entry
 * would then add to freed memory (a lost increment). Entries idle for a minute are retired by
 * user space (KernelHooks.drain_reclaim). max_ns here is the largest since the beginning. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct wr_reclaim_key);
	__type(value, struct wr_reclaim_stats);
} reclaim_stats SEC(".maps");

/* The longest stall per (cgroup, kind) since the last drain, which takes and deletes it (a max
 * racing the delete is lost: only this summary field, never a count). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct wr_reclaim_key);
	__type(value, __u64);
} reclaim_max SEC(".maps");

/* [0] kswapd wake-ups, [1] aggregate updates that found reclaim_stats full, [2] cgroups that
 * found watched_cgroups full, [3] stale stall starts dropped (their end was missed) */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} pressure_counters SEC(".maps");

static __always_inline void bump_counter(__u32 idx)
{
	__u64 *n = bpf_map_lookup_elem(&pressure_counters, &idx);

	if (n)
		__sync_fetch_and_add(n, 1);
}

/* Is memcg the task's own memory cgroup or one of its ancestors? A task reclaiming a memcg
 * outside that line reclaims on another cgroup's behalf: a write of memory.reclaim,
 * memory.high or memory.max (kubelet's MemoryQoS, senpai/TMO, an operator), or v1's
 * memory.force_empty, reclaims synchronously in the writer. */
static __always_inline bool memcg_contains(struct mem_cgroup *memcg, struct task_struct *task)
{
	struct mem_cgroup *m = task_memcg(task);
	__u64 off = bpf_core_field_offset(struct mem_cgroup, css);

	for (int i = 0; i < MAX_CGROUP_DEPTH && m; i++) {
		if (m == memcg)
			return true;
		struct cgroup_subsys_state *parent = BPF_CORE_READ(m, css.parent);

		m = parent ? (struct mem_cgroup *)((__u64)parent - off) : NULL;
	}
	return false;
}

static __always_inline int stall_begin(__u32 kind, struct mem_cgroup *memcg, __u16 rung)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u32 tgid = BPF_CORE_READ(task, tgid);
	struct reclaim_start st = {};
	struct reclaim_start_key key = {
		.tid = (__u32)bpf_get_current_pid_tgid(),
		.kind = kind,
		.task_start_ns = BPF_CORE_READ(task, start_boottime),
	};

	/* Before the inline wrapper (e.g. 6.1, 5.10) the over-high handler runs on every return to
	 * user space with TIF_NOTIFY_RESUME, which rseq sets for every glibc >= 2.35 thread on
	 * each preemption or migration, and returns at once when nothing is over memory.high: not
	 * a throttle, and checked first, before the watched-set lookups, so that nearly every
	 * context switch on the host costs one field read (kernel-side review §13). Its return
	 * hook still fires: on the kretprobe rung, whose returns can be missed (maxactive), a start
	 * left from a watched task's pass whose end was missed must not be closed by this one;
	 * fexit is never missed, so the fentry rung touches no map here. */
	if (kind == WR_STALL_HIGH && !BPF_CORE_READ(task, memcg_nr_pages_over_high)) {
		if (rung == WR_RUNG_KPROBE && tgid != cfg.self_tgid && is_watched(task, tgid))
			bpf_map_delete_elem(&reclaim_starts, &key);
		return 0;
	}
	if (tgid == cfg.self_tgid || !is_watched(task, tgid))
		return 0;
	st.ts_ns = bpf_ktime_get_boot_ns();
	st.kind = kind;
	st.rung = rung;
	if (memcg) {
		st.memcg_id = memcg_id(memcg);
		/* Not the cgroup's own stall: nothing in it waited (kernel-side review §17). Its
		 * own kind, so it never counts as the stall before an OOM. */
		if (kind == WR_STALL_MEMCG && !memcg_contains(memcg, task))
			st.kind = WR_STALL_EXTERNAL;
	} else if (kind != WR_STALL_DIRECT) {
		struct limited lim;

		find_limited(task_memcg(task), &lim, kind == WR_STALL_HIGH);
		st.memcg_id = lim.id;
	}
	bpf_map_update_elem(&reclaim_starts, &key, &st, BPF_ANY);
	return 0;
}

static __always_inline int stall_end(__u32 kind, __u64 reclaimed_pages)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct reclaim_start_key skey = {
		.tid = (__u32)bpf_get_current_pid_tgid(),
		.kind = kind,
		.task_start_ns = BPF_CORE_READ(task, start_boottime),
	};
	struct reclaim_start *st = bpf_map_lookup_elem(&reclaim_starts, &skey);
	struct wr_reclaim_key key = {};
	struct wr_reclaim_stats *agg, zero = {};
	struct wr_stall *e;
	__u64 now, dur, *longest;

	if (!st)
		return 0;
	now = bpf_ktime_get_boot_ns();
	dur = now - st->ts_ns;
	if (dur > STALE_START_NS) {
		bpf_map_delete_elem(&reclaim_starts, &skey);
		bump_counter(3);
		return 0;
	}
	key.cgroup_id = st->memcg_id;
	key.kind = st->kind;

	agg = bpf_map_lookup_elem(&reclaim_stats, &key);
	if (!agg) {
		if (bpf_map_update_elem(&reclaim_stats, &key, &zero, BPF_NOEXIST) == -7 /* E2BIG */)
			bump_counter(1);
		agg = bpf_map_lookup_elem(&reclaim_stats, &key);
	}
	if (agg) {
		__sync_fetch_and_add(&agg->count, 1);
		__sync_fetch_and_add(&agg->total_ns, dur);
		/* adding a constant 0 (the memory.high twins) becomes an atomic OR, which kernels
		 * before 5.12 refuse ("BPF_STX uses reserved fields") */
		if (reclaimed_pages)
			__sync_fetch_and_add(&agg->reclaimed_pages, reclaimed_pages);
		if (dur > agg->max_ns)
			agg->max_ns = dur; /* racy max: good enough for a summary */
	}
	longest = bpf_map_lookup_elem(&reclaim_max, &key);
	if (!longest)
		bpf_map_update_elem(&reclaim_max, &key, &dur, BPF_NOEXIST);
	else if (dur > *longest)
		*longest = dur;

	if (dur >= cfg.stall_threshold_ns) {
		e = reserve(sizeof(*e));
		if (e) {
			fill_hdr(&e->h, WR_EV_STALL, sizeof(*e), st->rung, task);
			e->memcg_id = st->memcg_id;
			e->duration_ns = dur;
			e->reclaimed_pages = reclaimed_pages;
			e->kind = st->kind;
			e->_pad = 0;
			bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
		}
	}
	bpf_map_delete_elem(&reclaim_starts, &skey);
	return 0;
}

/* memcg reclaim: best rungs name the memcg (first argument of try_to_free_mem_cgroup_pages). */
SEC("fentry/try_to_free_mem_cgroup_pages")
int BPF_PROG(memcg_reclaim_fentry, struct mem_cgroup *memcg)
{
	return stall_begin(WR_STALL_MEMCG, memcg, WR_RUNG_FENTRY);
}

/* The return value is read with bpf_get_func_ret() (5.17+): its position in ctx depends on the
 * function's argument count, which changed across kernel versions. */
SEC("fexit/try_to_free_mem_cgroup_pages")
int BPF_PROG(memcg_reclaim_fexit)
{
	__u64 ret = 0;

	bpf_get_func_ret(ctx, &ret);
	return stall_end(WR_STALL_MEMCG, ret);
}

SEC("kprobe/try_to_free_mem_cgroup_pages")
int BPF_KPROBE(memcg_reclaim_kprobe, struct mem_cgroup *memcg)
{
	return stall_begin(WR_STALL_MEMCG, memcg, WR_RUNG_KPROBE);
}

SEC("kretprobe/try_to_free_mem_cgroup_pages")
int BPF_KRETPROBE(memcg_reclaim_kretprobe, unsigned long ret)
{
	return stall_end(WR_STALL_MEMCG, ret);
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_begin")
int BPF_PROG(memcg_reclaim_begin_btf)
{
	return stall_begin(WR_STALL_MEMCG, NULL, WR_RUNG_TP_BTF);
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_end")
int BPF_PROG(memcg_reclaim_end_btf, unsigned long nr_reclaimed)
{
	return stall_end(WR_STALL_MEMCG, nr_reclaimed);
}

SEC("tracepoint/vmscan/mm_vmscan_memcg_reclaim_begin")
int memcg_reclaim_begin_tp(void *ctx)
{
	return stall_begin(WR_STALL_MEMCG, NULL, WR_RUNG_TRACEPOINT);
}

SEC("tracepoint/vmscan/mm_vmscan_memcg_reclaim_end")
int memcg_reclaim_end_tp(struct trace_event_raw_mm_vmscan_direct_reclaim_end_template *ctx)
{
	return stall_end(WR_STALL_MEMCG, ctx->nr_reclaimed);
}

/* Host-wide direct reclaim (try_to_free_pages): the host, not a cgroup, ran short. */
SEC("tp_btf/mm_vmscan_direct_reclaim_begin")
int BPF_PROG(direct_reclaim_begin_btf)
{
	return stall_begin(WR_STALL_DIRECT, NULL, WR_RUNG_TP_BTF);
}

SEC("tp_btf/mm_vmscan_direct_reclaim_end")
int BPF_PROG(direct_reclaim_end_btf, unsigned long nr_reclaimed)
{
	return stall_end(WR_STALL_DIRECT, nr_reclaimed);
}

SEC("tracepoint/vmscan/mm_vmscan_direct_reclaim_begin")
int direct_reclaim_begin_tp(void *ctx)
{
	return stall_begin(WR_STALL_DIRECT, NULL, WR_RUNG_TRACEPOINT);
}

SEC("tracepoint/vmscan/mm_vmscan_direct_reclaim_end")
int direct_reclaim_end_tp(struct trace_event_raw_mm_vmscan_direct_reclaim_end_template *ctx)
{
	return stall_end(WR_STALL_DIRECT, ctx->nr_reclaimed);
}

/* kswapd wake-ups: background reclaim started somewhere on the host. Counted, never sent. */
SEC("tp_btf/mm_vmscan_wakeup_kswapd")
int BPF_PROG(kswapd_wakeup_btf)
{
	bump_counter(0);
	return 0;
}

SEC("tracepoint/vmscan/mm_vmscan_wakeup_kswapd")
int kswapd_wakeup_tp(void *ctx)
{
	bump_counter(0);
	return 0;
}

/* memory.high throttling (cgroup v2): the penalty sleep runs in the over-high handler on the
 * way back to user space. It is __mem_cgroup_handle_over_high() on kernels where the fast-path
 * check became an inline wrapper in include/linux/memcontrol.h (6.18 here), and
 * mem_cgroup_handle_over_high() before; user space resolves which one exists from kallsyms and
 * points these programs at it (bpf_program__set_attach_target / attach_kprobe). No tracepoint
 * covers it: without fentry or kprobes the fallback is memory.events "high" deltas and
 * memory.pressure, sampled from cgroupfs. */
SEC("fentry/__mem_cgroup_handle_over_high")
int BPF_PROG(high_fentry)
{
	return stall_begin(WR_STALL_HIGH, NULL, WR_RUNG_FENTRY);
}

SEC("fexit/__mem_cgroup_handle_over_high")
int BPF_PROG(high_fexit)
{
	return stall_end(WR_STALL_HIGH, 0);
}

SEC("kprobe")
int BPF_KPROBE(high_kprobe)
{
	return stall_begin(WR_STALL_HIGH, NULL, WR_RUNG_KPROBE);
}

SEC("kretprobe")
int BPF_KRETPROBE(high_kretprobe)
{
	return stall_end(WR_STALL_HIGH, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Cgroup creation: a container runtime recreates a container's cgroup on every restart (same
 * path, new id); user space matches the path against the containers it follows and watches the
 * new id. Rare on any host, and only sent when following is on. */

/* FNV-1a hashes of the cgroup paths of followed containers. A runtime that restarts a container
 * recreates its cgroup at the same path; when the new one appears, it is watched right here, in
 * the kernel, before the container's first process runs: a container that dies within
 * milliseconds of its start (an OOM at start-up) is still seen. User space also follows the
 * cgroup_mkdir records, for runtimes that give a restarted container a new id. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u64);
	__type(value, __u8);
} follow_paths SEC(".maps");

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static __always_inline int handle_mkdir(struct cgroup *cgrp, const char *path, __u16 rung)
{
	struct wr_cgroup_mkdir *e;
	__u64 hash = FNV_OFFSET, id;
	__u8 one = 1;
	__u32 hid;

	if (!cfg.follow_cgroups)
		return 0;
	hid = BPF_CORE_READ(cgrp, root, hierarchy_id);
	if (hid != cfg.hierarchy_id)
		return 0;
	e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->h, WR_EV_CGROUP_MKDIR, sizeof(*e), rung,
		 (struct task_struct *)bpf_get_current_task());
	id = cgroup_id_of(cgrp);
	e->id = id;
	e->level = BPF_CORE_READ(cgrp, level);
	e->hierarchy_id = hid;
	bpf_probe_read_kernel_str(&e->path, sizeof(e->path), path);
	for (int i = 0; i < WR_CGROUP_PATH_LEN; i++) {
		char c = e->path[i];

		if (!c)
			break;
		hash = (hash ^ (__u8)c) * FNV_PRIME;
	}
	if (bpf_map_lookup_elem(&follow_paths, &hash) &&
	    bpf_map_update_elem(&watched_cgroups, &id, &one, BPF_ANY))
		bump_counter(2);
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

/* A cgroup went away: it cannot hold a process any more, so it leaves watched_cgroups (a
 * restarted container's old cgroup), and is remembered in cgroups_gone. No record: the rmdir of
 * a followed container's cgroup shows in its processes' exits already. */
static __always_inline int handle_rmdir(struct cgroup *cgrp)
{
	__u64 id;
	__u8 one = 1;

	if (!cfg.watch_cgroups || BPF_CORE_READ(cgrp, root, hierarchy_id) != cfg.hierarchy_id)
		return 0;
	id = cgroup_id_of(cgrp);
	bpf_map_delete_elem(&watched_cgroups, &id);
	bpf_map_update_elem(&cgroups_gone, &id, &one, BPF_ANY);
	return 0;
}

SEC("tp_btf/cgroup_mkdir")
int BPF_PROG(cgroup_mkdir_btf, struct cgroup *cgrp, const char *path)
{
	return handle_mkdir(cgrp, path, WR_RUNG_TP_BTF);
}

SEC("raw_tp/cgroup_mkdir")
int BPF_PROG(cgroup_mkdir_raw, struct cgroup *cgrp, const char *path)
{
	return handle_mkdir(cgrp, path, WR_RUNG_TRACEPOINT);
}

SEC("tp_btf/cgroup_rmdir")
int BPF_PROG(cgroup_rmdir_btf, struct cgroup *cgrp, const char *path)
{
	return handle_rmdir(cgrp);
}

SEC("raw_tp/cgroup_rmdir")
int BPF_PROG(cgroup_rmdir_raw, struct cgroup *cgrp, const char *path)
{
	return handle_rmdir(cgrp);
}
