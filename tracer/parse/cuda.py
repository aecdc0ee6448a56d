"""The CUDA driver API as whyrestart knows it: the entry points it probes and the CUresult codes
by name, with what to do when CUDA cannot start. Pure.

The numbers are cuda.h's (checked against the header of ``nvidia-cuda-runtime-cu12`` by
tests/test_gpu_parse.py when it is installed). Only the codes a failing ``cuInit``, context
creation or allocation returns in practice are named; any other is shown as its number.
"""

from __future__ import annotations

__all__ = ["ALLOC_FUNCTIONS", "FREE_FUNCTIONS", "INIT_FUNCTIONS", "NAMES", "advice", "name"]

# The allocation entry points whose failures are caught (the BPF program names are in
# tracer.bpf.gpuhooks), and the frees that keep the per-process held bytes right.
ALLOC_FUNCTIONS = (
    "cuMemAlloc_v2",
    "cuMemAllocManaged",
    "cuMemAllocPitch_v2",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemCreate",
)
FREE_FUNCTIONS = ("cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemRelease")
# CUDA starting: their failures (no device, driver/runtime mismatch) say why a program that
# never allocated could not use the GPU. cuDevicePrimaryCtxRetain is the CUDA runtime's context.
INIT_FUNCTIONS = (
    "cuInit",
    "cuDevicePrimaryCtxRetain",
    "cuCtxCreate_v2",
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
)


NAMES: dict[int, str] = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    800: "CUDA_ERROR_NOT_PERMITTED",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    805: "CUDA_ERROR_MPS_CONNECTION_FAILED",
    999: "CUDA_ERROR_UNKNOWN",
}

_ADVICE: dict[int, str] = {
    2: "the GPU had no memory left even for a CUDA context: other processes hold it (see "
    "nvidia-smi); give it a GPU of its own or free the others' memory",
    3: "the driver was called before cuInit succeeded: the earlier failure is the cause",
    34: "the libcuda it loaded is the CUDA toolkit's stub (lib64/stubs), which never runs: "
    "remove the stubs directory from LD_LIBRARY_PATH",
    46: "the GPU is busy in exclusive-process mode or unavailable: check its compute mode "
    "(nvidia-smi -q -d COMPUTE) and who holds it",
    100: "no GPU is visible to the process: check CUDA_VISIBLE_DEVICES / "
    "NVIDIA_VISIBLE_DEVICES, that the container was given the GPU (--gpus, the NVIDIA "
    "runtime, the device plugin's limits) and that the host driver sees it (nvidia-smi)",
    101: "the device it asked for does not exist: check CUDA_VISIBLE_DEVICES and the device "
    "index the program uses",
    304: "an OS call inside the driver failed (often /dev/nvidia* not accessible): check the "
    "device nodes' permissions and the container's device cgroup",
    802: "the system is not ready (fabric manager not running on NVSwitch systems): start "
    "nvidia-fabricmanager",
    803: "the libcuda loaded does not match the kernel driver: a container shipping its own "
    "libcuda, or a driver upgraded without a reboot; use the host's libcuda (NVIDIA container "
    "toolkit) or reboot after the upgrade",
    804: "CUDA forward compatibility (cuda-compat) is not supported on this GPU: remove "
    "/usr/local/cuda/compat from LD_LIBRARY_PATH, or upgrade the host driver to the CUDA "
    "version the image needs",
    805: "the MPS server could not be reached: start nvidia-cuda-mps-control, or unset "
    "CUDA_MPS_PIPE_DIRECTORY",
    999: "the driver failed to start (often: the nvidia-uvm module not loaded, /dev/nvidia-uvm "
    "missing, or a GPU in a bad state): check the kernel log and nvidia-smi",
}


def name(code: int) -> str:
    """cuda.h's name of a CUresult, or "CUresult N" for one not named here."""
    return NAMES.get(code, f"CUresult {code}")


def advice(code: int) -> str:
    """What to check when CUDA could not start with ``code``."""
    return _ADVICE.get(
        code,
        "CUDA could not start on this host: check the driver (nvidia-smi), the GPU given to the "
        "process and the libcuda it loads",
    )
