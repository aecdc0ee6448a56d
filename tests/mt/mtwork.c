/*
 * A multi-threaded program for the exactness tests: its threads are named differently from the
 * program (wrk1, wrk2, ...), and its fatal event happens in a worker thread, as in a model
 * server whose worker dies. The exit record and the verdict must name the program, not a worker.
 *
 *   mtwork wait THREADS            threads start, then everyone sleeps until killed
 *   mtwork oom THREADS             the last worker allocates until the OOM killer ends us
 *   mtwork segv THREADS            the last worker dereferences NULL (a core dump is allowed)
 *   mtwork abort THREADS           the last worker calls abort() (thread-directed SIGABRT)
 *   mtwork exit THREADS CODE       the last worker calls exit(CODE)
 *   mtwork touch THREADS SECS MIB  each thread touches MIB MiB of its own, 256 KiB at a time,
 *                                  for at most SECS seconds; then exit 0 (memory.high tests:
 *                                  every thread is throttled on its own way back to user space)
 *   mtwork storm N OUT [spin]      forks N children of 2-4 threads each (mode wait), SIGKILLs
 *                                  each once its threads run, reaps it, and writes
 *                                  "PID STATUS" per child to OUT (the wait status wait() saw)
 *
 * Every mode writes "r" to stdout (storm: to a pipe) once all threads run. All but storm chdir
 * to $MT_DIR (if set) with an unlimited core size first: a crash dumps core there (status 0x80).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *mode;
static int code;
static int spin; /* storm: workers spin (on a CPU when the SIGKILL lands) instead of sleeping */
static pthread_barrier_t started;

static void fatal(void)
{
	if (!strcmp(mode, "oom")) {
		for (;;) {
			char *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p == MAP_FAILED)
				continue;
			memset(p, 1, 1 << 20);
		}
	} else if (!strcmp(mode, "segv")) {
		*(volatile int *)0 = 1;
	} else if (!strcmp(mode, "abort")) {
		abort();
	} else if (!strcmp(mode, "exit")) {
		exit(code);
	}
}

static void *worker(void *arg)
{
	long i = (long)arg;
	char name[16];

	snprintf(name, sizeof(name), "wrk%ld", i < 0 ? -i : i);
	pthread_setname_np(pthread_self(), name);
	pthread_barrier_wait(&started);
	if (i < 0)
		fatal();
	if (spin)
		for (;;)
			;
	for (;;)
		pause();
	return NULL;
}

/* Start n-1 workers; the last one (index -1) is the one that dies first. */
static void run_threads(int n, int ready_fd)
{
	pthread_t t;

	pthread_barrier_init(&started, NULL, (unsigned)n);
	for (long i = 1; i < n; i++)
		if (pthread_create(&t, NULL, worker, (void *)(i == n - 1 ? -i : i))) {
			perror("pthread_create");
			exit(100);
		}
	pthread_barrier_wait(&started);
	if (write(ready_fd, "r", 1) != 1)
		exit(101);
	for (;;)
		pause();
}

static void storm(int n, const char *out)
{
	FILE *f = fopen(out, "w");
	int fds[2];

	if (!f || pipe(fds)) {
		perror("storm");
		exit(102);
	}
	srand((unsigned)getpid());
	for (int i = 0; i < n; i++) {
		int threads = 2 + rand() % 3, status;
		char c;
		pid_t pid = fork();

		if (pid == 0) {
			close(fds[0]);
			mode = "wait";
			run_threads(threads, fds[1]);
		}
		if (pid < 0 || read(fds[0], &c, 1) != 1) {
			perror("storm child");
			exit(103);
		}
		kill(pid, SIGKILL);
		if (waitpid(pid, &status, 0) != pid) {
			perror("waitpid");
			exit(104);
		}
		fprintf(f, "%d %d\n", pid, status);
	}
	fclose(f);
}

static double touch_secs;
static long touch_mib;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *toucher(void *arg)
{
	double deadline = now_s() + touch_secs;
	char name[16];

	snprintf(name, sizeof(name), "wrk%ld", (long)arg);
	pthread_setname_np(pthread_self(), name);
	pthread_barrier_wait(&started);
	for (long kib = 0; kib < touch_mib * 1024 && now_s() < deadline; kib += 256) {
		char *p = mmap(NULL, 256 << 10, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (p == MAP_FAILED)
			break;
		memset(p, 1, 256 << 10);
	}
	return NULL;
}

static void touch(int n)
{
	pthread_t t[1024];

	if (n > 1024)
		n = 1024;
	pthread_barrier_init(&started, NULL, (unsigned)n);
	for (long i = 0; i < n; i++)
		if (pthread_create(&t[i], NULL, toucher, (void *)(i + 1))) {
			perror("pthread_create");
			exit(100);
		}
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: mtwork MODE THREADS|N [CODE|OUT]\n");
		return 2;
	}
	mode = argv[1];
	if (!strcmp(mode, "storm")) {
		if (argc < 4)
			return 2;
		spin = argc > 4 && !strcmp(argv[4], "spin");
		storm(atoi(argv[2]), argv[3]);
		return 0;
	}
	if (!strcmp(mode, "touch")) {
		if (argc < 5)
			return 2;
		touch_secs = atof(argv[3]);
		touch_mib = atol(argv[4]);
		touch(atoi(argv[2]));
		return 0;
	}
	if (argc > 3)
		code = atoi(argv[3]);
	if (getenv("MT_DIR")) {
		struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};

		if (chdir(getenv("MT_DIR")) || setrlimit(RLIMIT_CORE, &unlimited))
			perror("MT_DIR");
	}
	run_threads(atoi(argv[2]) < 2 ? 2 : atoi(argv[2]), 1);
	return 0;
}
