/* join.h: shared by scripts/bench's helpers.
 *
 * If the environment variable WR_JOIN_CGROUP names a cgroup.procs file, the helper writes its
 * own pid there before doing anything else (so everything it forks starts inside that cgroup,
 * and no exec of a wrapper shell shows up in a tracer's output). Exits with status 3 if the
 * write fails: a workload that silently ran in the wrong cgroup would measure nothing.
 */
#ifndef WR_JOIN_H
#define WR_JOIN_H
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void join_cgroup_from_env(void) {
	const char *procs = getenv("WR_JOIN_CGROUP");
	if (!procs || !*procs)
		return;
	FILE *f = fopen(procs, "w");
	if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0) {
		perror("joining WR_JOIN_CGROUP");
		exit(3);
	}
}
#endif
