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
 *   mtwork gpu-late THREADS        the main thread's device allocation is refused (caught),
 *                                  then the threads start, then the main thread calls exit(1)
 *   mtwork gpu-exit THREADS        the last worker's device allocation is refused: exit(1)
 *   mtwork gpu-abort THREADS       the last worker's device allocation is refused: abort()
 *   mtwork serve PORT HANG         an HTTP server on 127.0.0.1:PORT, one thread per connection
 *                                  (wrk1, wrk2, ...), answering "ok" until the file HANG
 *                                  exists: then its threads stop answering (a stalled server)
 *
 * The gpu modes load the driver library by name, as PyTorch does (dlopen "libcuda.so.1", found
 * through LD_LIBRARY_PATH: the stand-in of tests/gpu), call cuInit and ask for 2 MiB, more than
 * the stand-in's budget (FAKE_CUDA_BUDGET_BYTES, 1 MiB in the tests).
 *
 * Every mode but serve writes "r" to stdout (storm: to a pipe) once all threads run. All but
 * storm chdir to $MT_DIR (if set) with an unlimited core size first: a crash dumps core there
 * (status 0x80).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *mode;
static int code;
static int spin; /* storm: workers spin (on a CPU when the SIGKILL lands) instead of sleeping */
static pthread_barrier_t started;

/* One device allocation refused by the driver library: the program catches it (CUresult 2,
 * CUDA_ERROR_OUT_OF_MEMORY) and goes on. */
static void gpu_oom(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	int (*init)(unsigned int);
	int (*alloc)(unsigned long long *, size_t);
	unsigned long long p;

	if (!lib) {
		fprintf(stderr, "mtwork: %s\n", dlerror());
		exit(105);
	}
	init = (int (*)(unsigned int))dlsym(lib, "cuInit");
	alloc = (int (*)(unsigned long long *, size_t))dlsym(lib, "cuMemAlloc_v2");
	if (!init || !alloc || init(0) != 0)
		exit(106);
	if (alloc(&p, 2 << 20) != 2)
		exit(107); /* the budget should have refused it */
}

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
	} else if (!strcmp(mode, "gpu-exit") || !strcmp(mode, "gpu-abort")) {
		gpu_oom();
		if (!strcmp(mode, "gpu-abort"))
			abort();
		exit(1);
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
	if (!strcmp(mode, "gpu-late"))
		exit(1); /* the failure came before any of these threads existed */
	for (;;)
		pause();
}

static const char *hang_file;
static int served;

static void *answer(void *arg)
{
	static const char ok[] = "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok";
	int fd = (int)(long)arg;
	char name[16], buf[1024] = "";
	size_t n = 0;
	ssize_t got;

	snprintf(name, sizeof(name), "wrk%d", __atomic_add_fetch(&served, 1, __ATOMIC_RELAXED));
	pthread_setname_np(pthread_self(), name);
	/* the whole request (its headers), so that closing leaves nothing unread (no reset) */
	while (!strstr(buf, "\r\n\r\n") && n < sizeof(buf) - 1 &&
	       (got = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0) {
		n += (size_t)got;
		buf[n] = 0;
	}
	if (strstr(buf, "\r\n\r\n")) {
		if (access(hang_file, F_OK) == 0)
			for (;;)
				pause();
		if (write(fd, ok, sizeof(ok) - 1) < 0)
			perror("answer");
	}
	close(fd);
	return NULL;
}

static void serve(int port)
{
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (s < 0 || bind(s, (struct sockaddr *)&addr, sizeof(addr)) || listen(s, 64)) {
		perror("serve");
		exit(108);
	}
	for (;;) {
		int c = accept(s, NULL, NULL);
		pthread_t t;

		if (c < 0)
			continue;
		if (pthread_create(&t, NULL, answer, (void *)(long)c)) {
			close(c);
			continue;
		}
		pthread_detach(t);
	}
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
	if (!strcmp(mode, "serve")) {
		if (argc < 4)
			return 2;
		hang_file = argv[3];
		serve(atoi(argv[2]));
	}
	if (argc > 3)
		code = atoi(argv[3]);
	if (getenv("MT_DIR")) {
		struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};

		if (chdir(getenv("MT_DIR")) || setrlimit(RLIMIT_CORE, &unlimited))
			perror("MT_DIR");
	}
	if (!strcmp(mode, "gpu-late"))
		gpu_oom();
	run_threads(atoi(argv[2]) < 2 ? 2 : atoi(argv[2]), 1);
	return 0;
}
