/*
 * A CUDA program as users write them, for the hold tests: linked against libcuda.so.1 (found at
 * start through LD_LIBRARY_PATH by the dynamic loader, not dlopened by a known path), it calls
 * the driver at once and ends within milliseconds, waiting for nothing:
 *
 *   fail     cuInit, then one 2 MiB cuMemAlloc_v2 over the budget fails: exit 2
 *   recover  the 2 MiB allocation fails, a 512 KiB one succeeds and is freed: exit 0
 *   noinit   cuInit fails (the stand-in's FAKE_CUDA_INIT_RESULT, e.g. 100): exit 3
 *   storm N  start N copies of itself in "fail" mode at once, wait for them all: exit 0 when
 *            every one exited 2, else 1
 *
 * The budget is the stand-in's (FAKE_CUDA_BUDGET_BYTES, 1 MiB in the tests).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

CUresult cuInit(unsigned int flags);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);

#define KiB 1024ULL
#define MiB (1024ULL * 1024ULL)

static int storm(const char *self, int n)
{
	int bad = 0;

	for (int i = 0; i < n; i++) {
		pid_t pid = fork();

		if (pid == 0) {
			execl(self, self, "fail", (char *)NULL);
			_exit(127);
		}
		if (pid < 0)
			bad++;
	}
	for (;;) {
		int status;
		pid_t pid = wait(&status);

		if (pid < 0)
			break;
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 2)
			bad++;
	}
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	CUdeviceptr p;

	if (argc < 2) {
		fprintf(stderr, "usage: fast fail|recover|noinit|storm N\n");
		return 96;
	}
	if (strcmp(argv[1], "storm") == 0)
		return storm("/proc/self/exe", argc > 2 ? atoi(argv[2]) : 50);
	if (cuInit(0) != 0)
		return 3;
	if (strcmp(argv[1], "noinit") == 0)
		return 4; /* cuInit should have failed */
	if (cuMemAlloc_v2(&p, 2 * MiB) != 2)
		return 5; /* the budget should have refused it */
	if (strcmp(argv[1], "fail") == 0)
		return 2;
	if (cuMemAlloc_v2(&p, 512 * KiB) != 0 || cuMemFree_v2(p) != 0)
		return 6;
	return 0;
}
