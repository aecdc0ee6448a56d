/*
 * GPU workloads for the root tests: they dlopen the stand-in libcuda.so.1 (tests/gpu/fake_cuda.c)
 * by the absolute path in WR_LIBCUDA, as a CUDA application loads the driver library, then
 * wait until the file WR_GO_FILE exists (the test creates it once whyrestart reports the
 * library probed), then run one scenario:
 *
 *   abort    1 MiB cuMemAlloc_v2 calls until one fails, then abort()
 *   recover  1 MiB calls until one fails, free two, retry (succeeds), exit 0
 *   exit1    one allocation larger than the budget fails, exit 1
 *   every    one success per allocation entry point, each freed by its matching free, then
 *            hold 2 MiB and call every entry point for 15 MiB (all fail), exit 3
 *   lost     create FAKE_NVML_TRIGGER (the stand-in NVML then reports Xid 79 and the GPU lost),
 *            wait for FAKE_NVML_LOST_ACK (NVML has said "GPU is lost"), exit 1
 *
 * The budget is the stand-in's (FAKE_CUDA_BUDGET_BYTES); the tests pick it per scenario.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUstream;
typedef void *CUmemoryPool;

#define MiB (1024ULL * 1024ULL)

static void *lib;

static void *sym(const char *name)
{
	void *p = dlsym(lib, name);

	if (!p) {
		fprintf(stderr, "workload: %s missing: %s\n", name, dlerror());
		exit(98);
	}
	return p;
}

static void wait_for(const char *path)
{
	struct timespec ten_ms = { 0, 10 * 1000 * 1000 };

	if (!path)
		return;
	/* bounded: a test that never says go fails on the exit code, it does not hang */
	for (int i = 0; i < 6000; i++) {
		if (access(path, F_OK) == 0)
			return;
		nanosleep(&ten_ms, NULL);
	}
	fprintf(stderr, "workload: %s never appeared\n", path);
	exit(97);
}

int main(int argc, char **argv)
{
	const char *path = getenv("WR_LIBCUDA");
	CUresult (*alloc)(CUdeviceptr *, size_t);
	CUresult (*mfree)(CUdeviceptr);

	if (argc < 2 || !path) {
		fprintf(stderr, "usage: WR_LIBCUDA=/path/libcuda.so.1 workload MODE\n");
		return 96;
	}
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "workload: %s\n", dlerror());
		return 95;
	}
	alloc = (CUresult(*)(CUdeviceptr *, size_t))sym("cuMemAlloc_v2");
	mfree = (CUresult(*)(CUdeviceptr))sym("cuMemFree_v2");
	wait_for(getenv("WR_GO_FILE"));

	if (strcmp(argv[1], "abort") == 0) {
		CUdeviceptr p;

		while (alloc(&p, MiB) == 0)
			;
		abort();
	}
	if (strcmp(argv[1], "recover") == 0) {
		CUdeviceptr p[64];
		int n = 0;

		while (n < 64 && alloc(&p[n], MiB) == 0)
			n++;
		if (n < 2)
			return 90;
		mfree(p[0]);
		mfree(p[1]);
		return alloc(&p[0], MiB) == 0 ? 0 : 91;
	}
	if (strcmp(argv[1], "exit1") == 0) {
		CUdeviceptr p;

		if (alloc(&p, 2 * MiB) == 2)
			return 1;
		return 92;
	}
	if (strcmp(argv[1], "every") == 0) {
		CUresult (*managed)(CUdeviceptr *, size_t, unsigned int) = sym("cuMemAllocManaged");
		CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int) =
			sym("cuMemAllocPitch_v2");
		CUresult (*async)(CUdeviceptr *, size_t, CUstream) = sym("cuMemAllocAsync");
		CUresult (*async_ptsz)(CUdeviceptr *, size_t, CUstream) = sym("cuMemAllocAsync_ptsz");
		CUresult (*pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) =
			sym("cuMemAllocFromPoolAsync");
		CUresult (*pool_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) =
			sym("cuMemAllocFromPoolAsync_ptsz");
		CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const void *,
				   unsigned long long) = sym("cuMemCreate");
		CUresult (*free_async)(CUdeviceptr, CUstream) = sym("cuMemFreeAsync");
		CUresult (*free_async_ptsz)(CUdeviceptr, CUstream) = sym("cuMemFreeAsync_ptsz");
		CUresult (*release)(CUmemGenericAllocationHandle) = sym("cuMemRelease");
		CUdeviceptr d[8], keep;
		size_t pitch_bytes = 0;
		int bad = 0;

		/* 8 x 1 MiB held at once: the high-water mark is 8 MiB (pitch: 1000 B rows padded
		 * to 1024, 1024 rows) */
		bad |= alloc(&d[0], MiB);
		bad |= managed(&d[1], MiB, 1);
		bad |= pitch(&d[2], &pitch_bytes, 1000, 1024, 4);
		bad |= async(&d[3], MiB, NULL);
		bad |= async_ptsz(&d[4], MiB, NULL);
		bad |= pool(&d[5], MiB, NULL, NULL);
		bad |= pool_ptsz(&d[6], MiB, NULL, NULL);
		bad |= create(&d[7], MiB, NULL, 0);
		if (bad || pitch_bytes != 1024)
			return 93;
		bad |= mfree(d[0]);
		bad |= mfree(d[1]);
		bad |= mfree(d[2]);
		bad |= free_async(d[3], NULL);
		bad |= free_async_ptsz(d[4], NULL);
		bad |= free_async(d[5], NULL);
		bad |= free_async_ptsz(d[6], NULL);
		bad |= release(d[7]);
		bad |= alloc(&keep, 2 * MiB);
		if (bad)
			return 94;
		/* every entry point refused 15 MiB with 2 MiB held under a 16 MiB budget */
		bad |= alloc(&d[0], 15 * MiB) != 2;
		bad |= managed(&d[0], 15 * MiB, 1) != 2;
		bad |= pitch(&d[0], &pitch_bytes, 15 * 1024, 1024, 4) != 2;
		bad |= async(&d[0], 15 * MiB, NULL) != 2;
		bad |= async_ptsz(&d[0], 15 * MiB, NULL) != 2;
		bad |= pool(&d[0], 15 * MiB, NULL, NULL) != 2;
		bad |= pool_ptsz(&d[0], 15 * MiB, NULL, NULL) != 2;
		bad |= create(&d[0], 15 * MiB, NULL, 0) != 2;
		return bad ? 89 : 3;
	}
	if (strcmp(argv[1], "lost") == 0) {
		const char *trigger = getenv("FAKE_NVML_TRIGGER");
		FILE *f = trigger ? fopen(trigger, "w") : NULL;

		if (!f)
			return 88;
		fclose(f);
		wait_for(getenv("FAKE_NVML_LOST_ACK"));
		return 1;
	}
	fprintf(stderr, "workload: unknown mode %s\n", argv[1]);
	return 96;
}
