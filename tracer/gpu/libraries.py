"""The driver library files a recording has probed: each real file once (``libcuda.file_key``),
however many containers' overlays show it and whichever way it was found (a process's mapping,
a held opener's descriptor, the host's own libcuda)."""

from __future__ import annotations

import contextlib
import os

from tracer.bpf.gpuhooks import AttachedLibrary, GpuHooks
from tracer.errors import WhyrestartError
from tracer.gpu import libcuda
from tracer.parse import cuda


class Libraries:
    def __init__(self, hooks: GpuHooks | None, hooks_error: str | None, proc: str) -> None:
        self.hooks = hooks  # None: uprobes unavailable (``hooks_error`` says why)
        self.hooks_error = hooks_error
        self.proc = proc
        # each real file (libcuda.file_key) -> what probing it gave
        self.probed: dict[tuple[int, int, int], AttachedLibrary] = {}

    def for_mapping(self, pid: int, m: libcuda.Mapping) -> AttachedLibrary:
        """Probe the library a process maps (through its /proc view of the file)."""
        if self.hooks is None:
            return AttachedLibrary(m.path, errors=[f"uprobes unavailable: {self.hooks_error}"])
        path = libcuda.attach_path(pid, m, self.proc)
        if path is None:
            # gone before we looked: the next process mapping this file tries again
            return AttachedLibrary(m.path, errors=["the process exited before probing"])
        # the same key as a hold's (``once``): a file probed on either path is probed once
        return self.once(path, m.path)

    def once(self, path: str, shown_as: str) -> AttachedLibrary:
        """Probe a library file by path, once per real file (``libcuda.file_key``)."""
        try:
            st = os.stat(path)
        except OSError as exc:
            return AttachedLibrary(shown_as, errors=[f"{shown_as}: {exc.strerror}"], opened=False)
        key = libcuda.file_key(st)
        res = self.probed.get(key)
        if res is None:
            assert self.hooks is not None
            res = self.hooks.attach_library(path, shown_as)
            if not res.probed and res.errors and not os.path.exists(path):
                # the process (a /proc link) went away half-way: not this file's fault, so it
                # is neither remembered nor marked probed, and the next opener tries again
                res.opened = False
                return res
            self.probed[key] = res
        return res

    def host(self, path: str) -> str:
        """Probe one of the host's own library files, once; a one-line summary. A file probed
        here is marked probed for the kernel too: loading it holds nobody."""
        try:
            os.stat(path)
        except OSError as exc:
            return f"not probed: {exc.strerror}"
        res = self.once(path, path)
        if res.probed and self.hooks is not None:
            with contextlib.suppress(OSError, WhyrestartError):
                st = os.stat(path)
                # the kernel's dev_t encoding (MAJOR << 20 | MINOR), as a hold names the file
                kdev = (os.major(st.st_dev) << 20) | os.minor(st.st_dev)
                self.hooks.mark_probed(kdev, st.st_ino)
        if res.errors and not res.probed:
            return "not probed: " + "; ".join(res.errors)
        return f"{res.allocations_probed}/{len(cuda.ALLOC_FUNCTIONS)} allocation entry points"
