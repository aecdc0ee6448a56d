/* wr-sigstorm: the signal storm that scripts/bench runs (compiled at bench time with gcc).
 *
 *   wr-sigstorm SECONDS [RATE]
 *
 * Forks one child (named "wr-sigrecv") that handles SIGUSR1, then ping-pongs with it until
 * SECONDS have passed: kill(child, SIGUSR1), and wait on a pipe until the child's handler has
 * run and the child has written one byte back. So every signal is delivered (none is merged
 * into one already pending) and each one is exactly one signal/signal_generate tracepoint hit
 * with sig 10 from this process to the child. The child handles SIGUSR1, so whyrestart counts
 * it in the kernel (footer signals_unsent) instead of recording it. With RATE > 0 (signals/s) the loop is paced on an absolute schedule (sleeping
 * every 1 ms worth of signals); RATE 0 (the default) goes as fast as the ping-pong can.
 * At the end the child is told to stop (see below) and reaped.
 * Prints one line of key=value pairs on stdout:
 *   pid=... child=... sent=... acked=... wall_s=... signals_per_s=... cpu_s=... start_ns=...
 *   end_ns=... rate=... child_status=...
 * (cpu_s: user+system time of both processes; start_ns/end_ns: CLOCK_BOOTTIME).
 * WR_JOIN_CGROUP: see join.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "join.h"

static volatile sig_atomic_t got; /* SIGUSR1s handled (child) */
static void on_usr1(int s) { (void)s; got++; }

static double tv_s(struct timeval tv) { return tv.tv_sec + tv.tv_usec / 1e6; }

/* The child: SIGUSR1 is blocked except while it waits in sigsuspend (blocked before the fork,
 * so none can arrive before it waits); it acks each one with a byte and stops when the parent
 * closes the go pipe (polled between signals). */
static int child_main(int ack_w, int go_r, const sigset_t *wait_mask) {
	prctl(PR_SET_NAME, "wr-sigrecv", 0, 0, 0);
	long long acked = 0;
	/* go_r is non-blocking: EOF (0) means stop, EAGAIN means go on */
	for (;;) {
		char c;
		if (read(go_r, &c, 1) == 0)
			break;
		sigsuspend(wait_mask); /* returns after the handler ran */
		for (; acked < got; acked++)
			if (write(ack_w, "a", 1) != 1)
				return 1;
	}
	return 0;
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: %s SECONDS [RATE]\n", argv[0]);
		return 2;
	}
	double seconds = atof(argv[1]);
	double rate = argc > 2 ? atof(argv[2]) : 0.0;
	if (seconds <= 0 || rate < 0) {
		fprintf(stderr, "wr-sigstorm: bad arguments\n");
		return 2;
	}
	join_cgroup_from_env();
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	sigset_t block, wait_mask;
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigprocmask(SIG_BLOCK, &block, &wait_mask);
	sigdelset(&wait_mask, SIGUSR1);
	int ack[2], go[2];
	if (pipe(ack) || pipe2(go, O_NONBLOCK)) {
		perror("wr-sigstorm: pipe");
		return 1;
	}
	pid_t child = fork();
	if (child < 0) {
		perror("wr-sigstorm: fork");
		return 1;
	}
	if (child == 0) {
		close(ack[0]);
		close(go[1]);
		_exit(child_main(ack[1], go[0], &wait_mask));
	}
	close(ack[1]);
	close(go[0]);
	long long sent = 0, acked = 0; /* kill() calls that returned 0; acks read back */
	long long start_boot = now_ns(CLOCK_BOOTTIME);
	long long start = now_ns(CLOCK_MONOTONIC);
	long long limit = start + (long long)(seconds * 1e9);
	long per_tick = rate > 0 ? (long)(rate / 1000.0 + 0.5) : 0; /* signals per 1 ms */
	if (rate > 0 && per_tick < 1)
		per_tick = 1;
	long long now = start;
	while (now < limit) {
		long n = per_tick ? per_tick : 256;
		for (long k = 0; k < n; k++) {
			if (kill(child, SIGUSR1) != 0) {
				perror("wr-sigstorm: kill");
				return 1;
			}
			sent++;
			char c;
			ssize_t r;
			while ((r = read(ack[0], &c, 1)) < 0 && errno == EINTR)
				;
			if (r != 1) {
				fprintf(stderr, "wr-sigstorm: the child stopped answering\n");
				return 1;
			}
			acked++;
		}
		if (rate > 0) {
			long long due = start + (long long)(sent / rate * 1e9);
			if (due > limit)
				due = limit;
			struct timespec ts = {due / 1000000000LL, due % 1000000000LL};
			while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
				;
		}
		now = now_ns(CLOCK_MONOTONIC);
	}
	long long end = now;
	long long end_boot = now_ns(CLOCK_BOOTTIME);
	/* Stop the child: close the go pipe, and send one last SIGUSR1 in case it is already back
	 * in sigsuspend (it then reads EOF and exits). That signal is counted in "sent" like every
	 * other: each kill() that returned 0 is one signal_generate hit, whatever became of it. */
	close(go[1]);
	if (kill(child, SIGUSR1) == 0)
		sent++;
	int st;
	while (waitpid(child, &st, 0) < 0 && errno == EINTR)
		;
	struct rusage self, kids;
	getrusage(RUSAGE_SELF, &self);
	getrusage(RUSAGE_CHILDREN, &kids);
	double cpu = tv_s(self.ru_utime) + tv_s(self.ru_stime) + tv_s(kids.ru_utime) +
		     tv_s(kids.ru_stime);
	double wall = (end - start) / 1e9;
	printf("pid=%d child=%d sent=%lld acked=%lld wall_s=%.6f signals_per_s=%.1f cpu_s=%.4f "
	       "start_ns=%lld end_ns=%lld rate=%.0f child_status=%d\n",
	       (int)getpid(), (int)child, sent, acked, wall, acked / wall, cpu, start_boot, end_boot,
	       rate, st);
	return 0;
}
