/*
 * A CUDA runtime program: linked against the real libcudart.so.12 (PyPI's
 * nvidia-cuda-runtime-cu12), which dlopens libcuda.so.1 and fetches the driver's entry points
 * with cuGetProcAddress. It allocates with cudaMalloc, cudaMallocAsync and cudaMallocManaged,
 * prints the errors and exits 2 when the first failed.
 *
 * The runtime's own declarations, not its header: the wheel ships cuda_runtime_api.h without
 * crt/host_defines.h (that comes with the compiler package), and these are plain C types.
 */
#include <stddef.h>
#include <stdio.h>

typedef int cudaError_t;
typedef void *cudaStream_t;

cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
const char *cudaGetErrorName(cudaError_t error);

#define MiB (1024ULL * 1024ULL)
#define cudaMemAttachGlobal 1

int main(void)
{
	void *p;
	cudaError_t a = cudaMalloc(&p, 1 * MiB);
	cudaError_t b = cudaMallocAsync(&p, 2 * MiB, NULL);
	cudaError_t c = cudaMallocManaged(&p, 3 * MiB, cudaMemAttachGlobal);

	printf("cudaMalloc %d %s\n", a, cudaGetErrorName(a));
	printf("cudaMallocAsync %d %s\n", b, cudaGetErrorName(b));
	printf("cudaMallocManaged %d %s\n", c, cudaGetErrorName(c));
	return a != 0 ? 2 : 0;
}
