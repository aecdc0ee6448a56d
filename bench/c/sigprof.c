/* wr-sigprof: a 100 Hz CPU profiler's signal load (compiled at bench time with gcc).
 *
 *   wr-sigprof SECONDS [HZ]
 *
 * Arms setitimer(ITIMER_PROF) at HZ (100, as Go's pprof, gperftools and Pyroscope's default)
 * with a SIGPROF handler that counts, and spins until SECONDS of wall time have passed: the
 * kernel sends SIGPROF (from the timer, to this process) for every 1/HZ s of CPU it uses. Prints
 *   pid=... sigprof=... wall_s=...
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

static volatile sig_atomic_t ticks;
static void on_prof(int s) { (void)s; ticks++; }

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: %s SECONDS [HZ]\n", argv[0]);
		return 2;
	}
	double seconds = atof(argv[1]);
	long hz = argc > 2 ? atol(argv[2]) : 100;
	if (seconds <= 0 || hz <= 0 || hz > 1000000)
		return 2;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_prof;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGPROF, &sa, NULL);
	long us = 1000000 / hz;
	struct itimerval it = {{us / 1000000, us % 1000000}, {us / 1000000, us % 1000000}};
	setitimer(ITIMER_PROF, &it, NULL);
	long long start = now_ns(CLOCK_MONOTONIC), end = start + (long long)(seconds * 1e9);
	volatile unsigned long x = 1;
	while (now_ns(CLOCK_MONOTONIC) < end)
		for (int k = 0; k < 100000; k++)
			x = x * 6364136223846793005UL + 1;
	struct itimerval off = {{0, 0}, {0, 0}};
	setitimer(ITIMER_PROF, &off, NULL);
	printf("pid=%d sigprof=%ld wall_s=%.3f\n", (int)getpid(), (long)ticks,
	       (now_ns(CLOCK_MONOTONIC) - start) / 1e9);
	return 0;
}
