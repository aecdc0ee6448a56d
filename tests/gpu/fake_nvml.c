/*
 * A stand-in libnvidia-ml.so.1 for machines without a GPU, built by the tests and loaded by the
 * real nvidia-ml-py (pynvml dlopens "libnvidia-ml.so.1", so LD_LIBRARY_PATH finds this one).
 *
 * It exports only what whyrestart's sampler calls, with NVML's signatures and struct layouts
 * (nvml.h), and behaves as environment variables say:
 *
 *   FAKE_NVML_INIT_RESULT   what nvmlInit returns (default 0; 9 = driver not loaded)
 *   FAKE_NVML_DEVICES       device count (default 1)
 *   FAKE_NVML_TOTAL_BYTES   per device (default 80 GiB); FAKE_NVML_USED_BYTES (default 60 GiB);
 *                           512 MiB reserved; free = total - used - reserved
 *   FAKE_NVML_NO_V2         1: nvmlDeviceGetMemoryInfo_v2 refuses the version (old driver)
 *   FAKE_NVML_PROCS         compute processes of device 0: "pid:bytes,pid:bytes"
 *   FAKE_NVML_GRAPHICS_PROCS  the same for graphics processes
 *   FAKE_NVML_XID           an Xid delivered once through nvmlEventSetWait_v2 on device 0 ...
 *   FAKE_NVML_TRIGGER       ... once this file exists (immediately if unset);
 *   FAKE_NVML_ACK           a file created when it was delivered
 *   FAKE_NVML_LOST_AFTER_XID  1: from then on device queries return NVML_ERROR_GPU_IS_LOST
 *   FAKE_NVML_LOST_ACK      a file created the first time a query answered "GPU is lost"
 *
 * The process queries follow NVML's two-call protocol: called with too small a count they
 * return NVML_ERROR_INSUFFICIENT_SIZE and the count needed.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

#define MAX_DEVICES 8
#define MAX_PROCS 64
#define GiB (1024ULL * 1024ULL * 1024ULL)
#define MiB (1024ULL * 1024ULL)
#define XID_CRITICAL_ERROR 0x8ULL

struct nvmlDevice_st {
	unsigned int index;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

struct nvmlEventSet_st {
	unsigned long long types[MAX_DEVICES];
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
	unsigned int version;
	unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
	nvmlDevice_t device;
	unsigned long long eventType;
	unsigned long long eventData;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlEventData_t;

static struct nvmlDevice_st devices[MAX_DEVICES];
static struct nvmlEventSet_st the_set;
static int initialized;
static int xid_delivered;

static unsigned long long env_ull(const char *name, unsigned long long dflt)
{
	const char *s = getenv(name);

	return s && *s ? strtoull(s, NULL, 10) : dflt;
}

static unsigned int device_count(void)
{
	unsigned long long n = env_ull("FAKE_NVML_DEVICES", 1);

	return n > MAX_DEVICES ? MAX_DEVICES : (unsigned int)n;
}

static nvmlReturn_t check(nvmlDevice_t d)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (!d || d < devices || d >= devices + device_count())
		return NVML_ERROR_INVALID_ARGUMENT;
	if (xid_delivered && env_ull("FAKE_NVML_LOST_AFTER_XID", 0)) {
		const char *ack = getenv("FAKE_NVML_LOST_ACK");

		if (ack)
			close(open(ack, O_WRONLY | O_CREAT, 0644));
		return NVML_ERROR_GPU_IS_LOST;
	}
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	nvmlReturn_t rc = (nvmlReturn_t)env_ull("FAKE_NVML_INIT_RESULT", 0);

	(void)flags;
	if (rc == NVML_SUCCESS) {
		initialized = 1;
		for (unsigned int i = 0; i < MAX_DEVICES; i++)
			devices[i].index = i;
	}
	return rc;
}

nvmlReturn_t nvmlInit_v2(void)
{
	return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlShutdown(void)
{
	initialized = 0;
	return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
	switch (result) {
	case NVML_SUCCESS:
		return "Success";
	case NVML_ERROR_GPU_IS_LOST:
		return "GPU is lost";
	case NVML_ERROR_TIMEOUT:
		return "Timeout";
	default:
		return "Fake NVML error";
	}
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	*count = device_count();
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (index >= device_count())
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &devices[index];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
	nvmlReturn_t rc = check(device);

	if (rc == NVML_SUCCESS)
		snprintf(name, length, "Fake GPU %u", device->index);
	return rc;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	nvmlReturn_t rc = check(device);

	if (rc == NVML_SUCCESS)
		snprintf(uuid, length, "GPU-fake-%04u", device->index);
	return rc;
}

static void memory(unsigned long long *total, unsigned long long *reserved,
		   unsigned long long *used, unsigned long long *free_)
{
	*total = env_ull("FAKE_NVML_TOTAL_BYTES", 80 * GiB);
	*used = env_ull("FAKE_NVML_USED_BYTES", 60 * GiB);
	*reserved = 512 * MiB;
	*free_ = *total - *used - *reserved;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *mem)
{
	nvmlReturn_t rc = check(device);
	unsigned long long reserved;

	if (rc == NVML_SUCCESS)
		memory(&mem->total, &reserved, &mem->used, &mem->free);
	return rc;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *mem)
{
	nvmlReturn_t rc = check(device);

	if (rc != NVML_SUCCESS)
		return rc;
	/* nvml.h: nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2) = sizeof | 2 << 24 */
	if (env_ull("FAKE_NVML_NO_V2", 0) || mem->version != (sizeof(*mem) | (2U << 24)))
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	memory(&mem->total, &mem->reserved, &mem->used, &mem->free);
	return NVML_SUCCESS;
}

static unsigned int parse_procs(const char *var, nvmlProcessInfo_t *out)
{
	const char *s = getenv(var);
	unsigned int n = 0;

	while (s && *s && n < MAX_PROCS) {
		char *end;

		out[n].pid = (unsigned int)strtoul(s, &end, 10);
		if (*end != ':')
			break;
		out[n].usedGpuMemory = strtoull(end + 1, &end, 10);
		out[n].gpuInstanceId = 0xFFFFFFFF;
		out[n].computeInstanceId = 0xFFFFFFFF;
		n++;
		s = *end == ',' ? end + 1 : NULL;
	}
	return n;
}

static nvmlReturn_t processes(const char *var, nvmlDevice_t device, unsigned int *count,
			      nvmlProcessInfo_t *infos)
{
	nvmlProcessInfo_t procs[MAX_PROCS];
	nvmlReturn_t rc = check(device);
	unsigned int n;

	if (rc != NVML_SUCCESS)
		return rc;
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	n = device->index == 0 ? parse_procs(var, procs) : 0;
	if (*count < n || (n && !infos)) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	memcpy(infos, procs, n * sizeof(*infos));
	*count = n;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
						     nvmlProcessInfo_t *infos)
{
	return processes("FAKE_NVML_PROCS", device, count, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
						      nvmlProcessInfo_t *infos)
{
	return processes("FAKE_NVML_GRAPHICS_PROCS", device, count, infos);
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	memset(&the_set, 0, sizeof(the_set));
	*set = &the_set;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
				      nvmlEventSet_t set)
{
	nvmlReturn_t rc = check(device);

	if (rc == NVML_SUCCESS)
		set->types[device->index] |= types;
	return rc;
}

static int xid_due(void)
{
	const char *trigger = getenv("FAKE_NVML_TRIGGER");

	if (xid_delivered || env_ull("FAKE_NVML_XID", 0) == 0)
		return 0;
	return !trigger || access(trigger, F_OK) == 0;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
	struct timespec five_ms = { 0, 5 * 1000 * 1000 };
	const char *ack = getenv("FAKE_NVML_ACK");

	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	for (unsigned int waited = 0;; waited += 5) {
		if (xid_due() && (set->types[0] & XID_CRITICAL_ERROR)) {
			memset(data, 0, sizeof(*data));
			data->device = &devices[0];
			data->eventType = XID_CRITICAL_ERROR;
			data->eventData = env_ull("FAKE_NVML_XID", 0);
			data->gpuInstanceId = 0xFFFFFFFF;
			data->computeInstanceId = 0xFFFFFFFF;
			xid_delivered = 1;
			if (ack)
				close(open(ack, O_WRONLY | O_CREAT, 0644));
			return NVML_SUCCESS;
		}
		if (waited >= timeoutms)
			return NVML_ERROR_TIMEOUT;
		nanosleep(&five_ms, NULL);
	}
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
	(void)set;
	return NVML_SUCCESS;
}
