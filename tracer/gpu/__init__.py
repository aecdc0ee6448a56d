"""GPU evidence: CUDA allocation failures caught at the driver library (uprobes on the
libcuda.so.1 each watched process maps), NVML device and per-process memory, Xid errors and
lost GPUs (NVML events and the driver's kernel-log lines).

Modules: ``libcuda`` (finding the driver library a process maps and the entry points' file
offsets: /proc readers over the pure parsers of ``tracer.parse.libcuda``), ``nvml`` (the NVML
sampler behind a small interface), ``holdguard`` (the process that resumes held programs if the
recorder dies), ``side`` (the recorder's one object for all of it). Pure facts live in
``tracer.parse``: ``cuda`` (the entry points probed, CUresult names) and ``xid`` (kernel-log
parsing and the Xid catalogue). The BPF loader is ``tracer.bpf.gpuhooks``.
"""
