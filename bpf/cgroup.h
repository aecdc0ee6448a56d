/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Which cgroup a task is in, for both objects (whyrestart.bpf.c, gpu.bpf.c). Each object keeps
 * its own configuration block, so the hierarchy to read is a parameter: the caller passes its
 * config's memcg_v1.
 */
#ifndef WHYRESTART_CGROUP_H
#define WHYRESTART_CGROUP_H

/* The memory cgroup of a task (its css for the memory controller). */
static __always_inline struct mem_cgroup *task_memcg(struct task_struct *task)
{
	int id = bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id);
	struct css_set *cset = BPF_CORE_READ(task, cgroups);
	struct cgroup_subsys_state *css = NULL;

	if (!cset)
		return NULL;
	bpf_core_read(&css, sizeof(css), &cset->subsys[id]);
	/* css is the first member of struct mem_cgroup */
	return (struct mem_cgroup *)css;
}

/* A task's cgroup in the hierarchy user space names cgroups from: the v1 memory hierarchy on a
 * hybrid host (memcg_v1; the v2 tree is empty there), else the unified (default) hierarchy. */
static __always_inline struct cgroup *task_cgroup_in(struct task_struct *task, bool memcg_v1)
{
	if (memcg_v1) {
		struct mem_cgroup *memcg = task_memcg(task);

		return memcg ? BPF_CORE_READ(memcg, css.cgroup) : NULL;
	}
	return BPF_CORE_READ(task, cgroups, dfl_cgrp);
}

static __always_inline __u64 cgroup_id_of(struct cgroup *cgrp)
{
	return cgrp ? BPF_CORE_READ(cgrp, kn, id) : 0;
}

#endif /* WHYRESTART_CGROUP_H */
