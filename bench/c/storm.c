/* wr-storm: the fork/exit storm that scripts/bench runs (compiled at bench time with gcc).
 *
 *   wr-storm SECONDS [BATCH [RATE [zero|mixed [vfork]]]]
 *
 * In a loop until SECONDS have passed: fork BATCH children, each of which calls
 * _exit(i & 0xff) at once (i counts every child ever forked), then reap all BATCH of them.
 * Children never exec, so every exit the tracers see carries the comm "wr-storm".
 * With RATE > 0 (exits/s) the loop is paced: after each batch it sleeps until the time at which
 * that many exits are due on an absolute schedule (a paced storm for soak runs); RATE 0 (the
 * default) runs as fast as it can. With "zero", every child exits with status 0 instead (clean
 * exits, which whyrestart keeps fewer of than failures). With "vfork", children are made with
 * vfork(2) instead of fork(2): no page tables to copy, three times the exits a second on the
 * development VM (28k/s against 8-10k/s), for the agent's storm, which must pass 10k/s.
 * WR_JOIN_CGROUP: see join.h.
 * Prints one line of key=value pairs on stdout at the end:
 *   pid=... exits=... wall_s=... exits_per_s=... start_ns=... end_ns=... bad_status=... fork_retries=...
 *   batch=... rate=... codes=... fork=fork|vfork
 * (start_ns/end_ns are CLOCK_BOOTTIME, the clock whyrestart's trace uses). bad_status counts
 * children whose reaped status was not the expected exit code (should be 0).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "join.h"

#define MAXBATCH 4096

/* One child that exits with CODE at once; its pid in the parent. In a function of its own so
 * that no variable of the loop is live across vfork (the child borrows this stack frame). */
static __attribute__((noinline)) pid_t child_exiting(int code, int use_vfork) {
	pid_t p = use_vfork ? vfork() : fork();
	if (p == 0)
		_exit(code);
	return p;
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: %s SECONDS [BATCH [RATE [zero|mixed [vfork]]]]\n", argv[0]);
		return 2;
	}
	double seconds = atof(argv[1]);
	int batch = argc > 2 ? atoi(argv[2]) : 32;
	double rate = argc > 3 ? atof(argv[3]) : 0.0;
	int zero = argc > 4 && strcmp(argv[4], "zero") == 0;
	int use_vfork = argc > 5 && strcmp(argv[5], "vfork") == 0;
	if (batch < 1 || batch > MAXBATCH || seconds <= 0 || rate < 0) {
		fprintf(stderr, "wr-storm: bad arguments\n");
		return 2;
	}
	join_cgroup_from_env();
	static pid_t pids[MAXBATCH];
	static int codes[MAXBATCH];
	long long exits = 0, bad = 0, retries = 0;
	unsigned long i = 0;
	long long start_boot = now_ns(CLOCK_BOOTTIME);
	long long start = now_ns(CLOCK_MONOTONIC);
	long long limit = start + (long long)(seconds * 1e9);
	while (now_ns(CLOCK_MONOTONIC) < limit) {
		int n = 0;
		while (n < batch) {
			int code = zero ? 0 : (int)(i & 0xff);
			pid_t p = child_exiting(code, use_vfork);
			if (p < 0) {
				if (errno == EAGAIN && n > 0)
					break; /* reap what we have, then go on */
				if (errno == EAGAIN) {
					retries++;
					usleep(1000);
					continue;
				}
				perror("wr-storm: fork");
				return 1;
			}
			pids[n] = p;
			codes[n] = code;
			n++;
			i++;
		}
		for (int k = 0; k < n; k++) {
			int st;
			while (waitpid(pids[k], &st, 0) < 0) {
				if (errno != EINTR) {
					perror("wr-storm: waitpid");
					return 1;
				}
			}
			if (!WIFEXITED(st) || WEXITSTATUS(st) != codes[k])
				bad++;
			exits++;
		}
		if (rate > 0) { /* paced: sleep until these exits are due (never past the end) */
			long long due = start + (long long)(exits / rate * 1e9);
			if (due > limit)
				due = limit;
			struct timespec ts = {due / 1000000000LL, due % 1000000000LL};
			while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
				;
		}
	}
	long long end = now_ns(CLOCK_MONOTONIC);
	long long end_boot = now_ns(CLOCK_BOOTTIME);
	double wall = (end - start) / 1e9;
	printf("pid=%d exits=%lld wall_s=%.6f exits_per_s=%.1f start_ns=%lld end_ns=%lld "
	       "bad_status=%lld fork_retries=%lld batch=%d rate=%.0f codes=%s fork=%s\n",
	       (int)getpid(), exits, wall, exits / wall, start_boot, end_boot, bad, retries, batch, rate,
	       zero ? "zero" : "mixed", use_vfork ? "vfork" : "fork");
	return 0;
}
