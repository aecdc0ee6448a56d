"""GPU evidence: CUDA allocation failures caught at the driver library (uprobes on the
libcuda.so.1 each watched process maps), NVML device and per-process memory, Xid errors and
lost GPUs (NVML events and the driver's kernel-log lines).

Modules: ``xid`` (pure kernel-log parsing and the Xid catalogue), ``libcuda`` (finding the
driver library a process maps and the entry points' file offsets; pure parsers plus /proc
readers), ``nvml`` (the NVML sampler behind a small interface), ``side`` (the recorder's one
object for all of it). The BPF loader is ``tracer.bpf.gpuhooks``.
"""
