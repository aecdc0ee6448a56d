/* wr-marker: the start-to-first-event probe of scripts/bench (compiled at bench time with gcc).
 *
 *   wr-marker INTERVAL_MS MAX_COUNT [sig]
 *
 * Every INTERVAL_MS (on an absolute schedule, so a slow iteration does not shift later ones)
 * fork a child that names itself "wrmk%05d" (its iteration number, via PR_SET_NAME) and
 * _exit(0)s at once; reap it. Stops after MAX_COUNT markers or at SIGINT/SIGTERM, then prints
 * one line per marker on stdout:  INDEX FORK_NS REAPED_NS  (CLOCK_BOOTTIME ns: just before fork(),
 * and just after waitpid() returned, i.e. after the child's exit tracepoints had fired).
 * With "sig", each child also sends itself a SIGUSR1 it ignores before exiting, so that signal
 * tracers (whose output names the sender's comm) see the marker too. WR_JOIN_CGROUP: join.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "join.h"

static volatile sig_atomic_t stop;
static void on_sig(int s) { (void)s; stop = 1; }

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: %s INTERVAL_MS MAX_COUNT [sig]\n", argv[0]);
		return 2;
	}
	long interval_ms = atol(argv[1]);
	long max = atol(argv[2]);
	int sig = argc > 3 && strcmp(argv[3], "sig") == 0;
	if (interval_ms < 1 || max < 1) {
		fprintf(stderr, "wr-marker: bad arguments\n");
		return 2;
	}
	join_cgroup_from_env();
	long long *forked = calloc(max, sizeof *forked), *reaped = calloc(max, sizeof *reaped);
	if (!forked || !reaped)
		return 1;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_sig; /* no SA_RESTART: a signal ends the sleep */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	struct timespec next;
	clock_gettime(CLOCK_MONOTONIC, &next);
	long n = 0;
	for (; n < max && !stop; n++) {
		forked[n] = now_ns(CLOCK_BOOTTIME);
		pid_t p = fork();
		if (p == 0) {
			char name[16];
			snprintf(name, sizeof name, "wrmk%05ld", n % 100000);
			prctl(PR_SET_NAME, name, 0, 0, 0);
			if (sig) {
				signal(SIGUSR1, SIG_IGN);
				kill(getpid(), SIGUSR1);
			}
			_exit(0);
		}
		if (p < 0) {
			perror("wr-marker: fork");
			break;
		}
		while (waitpid(p, NULL, 0) < 0 && errno == EINTR)
			;
		reaped[n] = now_ns(CLOCK_BOOTTIME);
		next.tv_nsec += interval_ms * 1000000L;
		while (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec++;
		}
		while (!stop && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
			;
	}
	for (long k = 0; k < n; k++)
		printf("%ld %lld %lld\n", k, forked[k], reaped[k]);
	return 0;
}
