/*
 * A stand-in libcuda.so.1 for machines without a GPU, built by the tests (tests/gpu_build.py).
 *
 * It exports the real driver entry points with their real signatures (cuda.h: CUresult is an
 * int enum, CUdeviceptr an unsigned long long) so that whyrestart's uprobes attach to it exactly
 * as to the real library. Allocations succeed until the bytes held would pass a budget, read
 * from FAKE_CUDA_BUDGET_BYTES, then return CUDA_ERROR_OUT_OF_MEMORY (2); frees give bytes back.
 *
 * Built with -fno-ipa-icf: identical bodies (cuMemAllocAsync and its _ptsz twin) must stay
 * separate functions at separate addresses, as in the real library.
 *
 * Variants for the probe tests: -DFAKE_CUDA_ALIASES makes the _ptsz entry points aliases of
 * their twins (one address, two names); -DFAKE_CUDA_OLD_DRIVER leaves out what drivers before
 * CUDA 10.2 lack (virtual memory management: cuMemCreate/cuMemRelease; and the stream-ordered
 * allocator of 11.2).
 */
#include <stddef.h>
#include <stdlib.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUmemAllocationProp_st CUmemAllocationProp;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2

#define MAX_LIVE 4096

static struct {
	CUdeviceptr ptr;
	size_t size;
} live[MAX_LIVE];
static size_t held;
static CUdeviceptr next_ptr = 0x7f0000000000ULL;

static size_t budget(void)
{
	const char *s = getenv("FAKE_CUDA_BUDGET_BYTES");

	return s ? strtoull(s, NULL, 10) : (size_t)1 << 30;
}

static CUresult fake_alloc(CUdeviceptr *out, size_t size)
{
	if (!out || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (held + size > budget())
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (int i = 0; i < MAX_LIVE; i++) {
		if (live[i].ptr == 0) {
			live[i].ptr = next_ptr;
			live[i].size = size;
			*out = next_ptr;
			next_ptr += (size + 0xfffff) & ~0xfffffULL;
			held += size;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_free(CUdeviceptr ptr)
{
	for (int i = 0; i < MAX_LIVE; i++) {
		if (live[i].ptr == ptr && ptr != 0) {
			held -= live[i].size;
			live[i].ptr = 0;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_VALUE;
}

/* FAKE_CUDA_INIT_RESULT: what cuInit and context creation return (default 0; a real driver on
 * a machine without a device returns 100, CUDA_ERROR_NO_DEVICE) */
static CUresult init_result(void)
{
	const char *s = getenv("FAKE_CUDA_INIT_RESULT");

	return s ? (CUresult)strtol(s, NULL, 10) : CUDA_SUCCESS;
}

CUresult cuInit(unsigned int flags)
{
	(void)flags;
	return init_result();
}

typedef struct CUctx_st *CUcontext;
typedef int CUdevice;

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	(void)dev;
	*pctx = NULL;
	return init_result();
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	(void)flags;
	(void)dev;
	*pctx = NULL;
	return init_result();
}

#ifndef FAKE_CUDA_OLD_DRIVER
CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int n, unsigned int flags, CUdevice dev)
{
	(void)params;
	(void)n;
	(void)flags;
	(void)dev;
	*pctx = NULL;
	return init_result();
}

CUresult cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags, CUdevice dev)
{
	(void)params;
	(void)flags;
	(void)dev;
	*pctx = NULL;
	return init_result();
}
#endif

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	return fake_alloc(dptr, bytesize);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	(void)flags;
	return fake_alloc(dptr, bytesize);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
			    size_t Height, unsigned int ElementSizeBytes)
{
	/* rows padded to 512 bytes, as a real device pads them */
	size_t pitch = (WidthInBytes + 511) & ~(size_t)511;
	CUresult rc;

	(void)ElementSizeBytes;
	rc = fake_alloc(dptr, pitch * Height);
	if (rc == CUDA_SUCCESS && pPitch)
		*pPitch = pitch;
	return rc;
}

#ifndef FAKE_CUDA_OLD_DRIVER
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	(void)hStream;
	return fake_alloc(dptr, bytesize);
}

#ifdef FAKE_CUDA_ALIASES
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
	__attribute__((alias("cuMemAllocAsync")));
#else
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	(void)hStream;
	return fake_alloc(dptr, bytesize);
}
#endif

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				 CUstream hStream)
{
	(void)pool;
	(void)hStream;
	return fake_alloc(dptr, bytesize);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				      CUstream hStream)
{
	(void)pool;
	(void)hStream;
	return fake_alloc(dptr, bytesize);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags)
{
	(void)prop;
	(void)flags;
	return fake_alloc(handle, size);
}
#endif /* FAKE_CUDA_OLD_DRIVER */

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	return fake_free(dptr);
}

#ifndef FAKE_CUDA_OLD_DRIVER
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	(void)hStream;
	return fake_free(dptr);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	(void)hStream;
	return fake_free(dptr);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	return fake_free(handle);
}
#endif
