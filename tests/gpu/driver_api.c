/*
 * A driver-API program for the real libcuda.so.1 (Debian's libcuda1, found through
 * LD_LIBRARY_PATH): on a machine without a GPU every call fails, and each failure is one the
 * probes must catch with its code. Calls, in order:
 *
 *   cuInit                                   -> 100 CUDA_ERROR_NO_DEVICE
 *   cuDevicePrimaryCtxRetain, cuCtxCreate_v2 -> 3 CUDA_ERROR_NOT_INITIALIZED
 *   cuMemAlloc_v2 (1 MiB)                    -> 3
 *   cuMemAlloc (2 MiB) and cuMemAllocAsync (3 MiB) through pointers from cuGetProcAddress_v2,
 *   as the CUDA runtime reaches the driver                -> 3
 *
 * It prints the codes and exits 2 when cuInit failed (0 when a GPU is there).
 */
#include <stddef.h>
#include <stdio.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef void *CUstream;

CUresult cuInit(unsigned int flags);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, int dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, int dev);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
			     unsigned long long flags, int *symbolStatus);

#define MiB (1024ULL * 1024ULL)

int main(void)
{
	CUresult (*alloc)(CUdeviceptr *, size_t) = NULL;
	CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) = NULL;
	CUcontext ctx;
	CUdeviceptr p;
	int status = 0;
	CUresult init = cuInit(0);

	printf("cuInit %d\n", init);
	printf("cuDevicePrimaryCtxRetain %d\n", cuDevicePrimaryCtxRetain(&ctx, 0));
	printf("cuCtxCreate_v2 %d\n", cuCtxCreate_v2(&ctx, 0, 0));
	printf("cuMemAlloc_v2 %d\n", cuMemAlloc_v2(&p, 1 * MiB));
	if (cuGetProcAddress_v2("cuMemAlloc", (void **)&alloc, 12000, 0, &status) != 0 || !alloc)
		return 90;
	if (cuGetProcAddress_v2("cuMemAllocAsync", (void **)&alloc_async, 12000, 0, &status) != 0 ||
	    !alloc_async)
		return 91;
	printf("cuMemAlloc (cuGetProcAddress) %d\n", alloc(&p, 2 * MiB));
	printf("cuMemAllocAsync (cuGetProcAddress) %d\n", alloc_async(&p, 3 * MiB, NULL));
	return init != 0 ? 2 : 0;
}
