"""libbpf (>= 1.0) through ctypes: the only module that calls into it.

Which libbpf: the one bundled in the wheel (``_bundled/libbpf.so.1`` beside this module, put
there by scripts/build from Debian's libbpf source, its own libraries grafted by auditwheel), so
that a host whose distribution ships none, or one older than 1.0 (Ubuntu 22.04 has 0.5), needs
nothing; else the system's (a checkout: ``apt-get install libbpf1``). ``lib().origin`` and
``lib().path`` say which one was loaded; ``doctor`` prints them.

Why ctypes and not bcc: bcc compiles BPF at run time and needs kernel headers and LLVM on every
host. whyrestart ships a CO-RE object compiled once; libbpf relocates it against the running
kernel's BTF at load time.

Every failing call raises ``BpfError`` naming the step ("attaching tp_btf/sched_process_exit")
and the errno, with a fix where one is known. libbpf's own log lines are captured (not printed)
so that a failed load can show the verifier's reason.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from tracer.errors import BpfError, KernelUnsupported

_LIBBPF_NAMES = ("libbpf.so.1", "libbpf.so")
BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bundled", "libbpf.so.1")

c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p
c_int = ctypes.c_int
c_size_t = ctypes.c_size_t

PRINT_FN = ctypes.CFUNCTYPE(c_int, c_int, c_char_p, c_void_p)
SAMPLE_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t)

LIBBPF_WARN, LIBBPF_INFO, LIBBPF_DEBUG = 0, 1, 2
BPF_ANY = 0
# a map's key and value types
K = TypeVar("K", bound="ctypes.Structure | ctypes._SimpleCData[Any]")
V = TypeVar("V", bound="ctypes.Structure | ctypes._SimpleCData[Any]")
ENOTSUPP = 524  # the kernel-internal "operation not supported" some BPF commands return


def _fix_for(step: str, err: int) -> str | None:
    if err == errno.EPERM:
        if "fentry" in step or "fexit" in step:
            return (
                "this kernel refuses BPF trampolines (lockdown or a missing feature); "
                "whyrestart falls back to the next rung"
            )
        return "run as root (or with CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE)"
    if err == errno.ENOENT and "tracepoint" in step:
        return "mount tracefs: mount -t tracefs tracefs /sys/kernel/tracing"
    if err in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOENT) and "kprobe" in step:
        return "this kernel has no kprobes (CONFIG_KPROBES); the next rung is used"
    if err == errno.ESRCH:
        return "the kernel has no such function or tracepoint on this version"
    return None


# The libbpf functions we call, with their result and argument types (declared once, at load).
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "libbpf_major_version": (ctypes.c_uint32, []),
    "libbpf_minor_version": (ctypes.c_uint32, []),
    "libbpf_set_print": (c_void_p, [PRINT_FN]),
    "libbpf_num_possible_cpus": (c_int, []),
    "bpf_object__open_file": (c_void_p, [c_char_p, c_void_p]),
    "bpf_object__load": (c_int, [c_void_p]),
    "bpf_object__close": (None, [c_void_p]),
    "bpf_object__next_program": (c_void_p, [c_void_p, c_void_p]),
    "bpf_object__find_program_by_name": (c_void_p, [c_void_p, c_char_p]),
    "bpf_object__find_map_by_name": (c_void_p, [c_void_p, c_char_p]),
    "bpf_program__name": (c_char_p, [c_void_p]),
    "bpf_program__section_name": (c_char_p, [c_void_p]),
    "bpf_program__set_autoload": (c_int, [c_void_p, ctypes.c_bool]),
    "bpf_program__autoload": (ctypes.c_bool, [c_void_p]),
    "bpf_program__attach": (c_void_p, [c_void_p]),
    "bpf_program__attach_kprobe": (c_void_p, [c_void_p, ctypes.c_bool, c_char_p]),
    # (prog, retprobe, pid, binary_path, func_offset): offset in the file, pid -1 for
    # every process that maps the binary
    "bpf_program__attach_uprobe": (
        c_void_p,
        [c_void_p, ctypes.c_bool, c_int, c_char_p, c_size_t],
    ),
    "bpf_program__set_attach_target": (c_int, [c_void_p, c_int, c_char_p]),
    "bpf_program__attach_perf_event": (c_void_p, [c_void_p, c_int]),
    "bpf_link__destroy": (c_int, [c_void_p]),
    "bpf_map__fd": (c_int, [c_void_p]),
    "bpf_object__next_map": (c_void_p, [c_void_p, c_void_p]),
    "bpf_map__name": (c_char_p, [c_void_p]),
    "bpf_map__type": (c_int, [c_void_p]),
    "bpf_map__max_entries": (ctypes.c_uint32, [c_void_p]),
    "bpf_map__set_max_entries": (c_int, [c_void_p, ctypes.c_uint32]),
    "bpf_map__pin_path": (c_char_p, [c_void_p]),
    "bpf_map__reuse_fd": (c_int, [c_void_p, c_int]),
    "bpf_map__set_pin_path": (c_int, [c_void_p, c_char_p]),
    "bpf_map__initial_value": (c_void_p, [c_void_p, ctypes.POINTER(c_size_t)]),
    "bpf_map__update_elem": (
        c_int,
        [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, ctypes.c_uint64],
    ),
    "bpf_map__lookup_elem": (
        c_int,
        [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, ctypes.c_uint64],
    ),
    "bpf_map__delete_elem": (c_int, [c_void_p, c_void_p, c_size_t, ctypes.c_uint64]),
    "bpf_map__get_next_key": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t]),
    "bpf_map__lookup_and_delete_elem": (
        c_int,
        [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, ctypes.c_uint64],
    ),
    # (fd, in_batch, out_batch, keys, values, count in/out, opts): Linux 5.6
    "bpf_map_lookup_batch": (
        c_int,
        [c_int, c_void_p, c_void_p, c_void_p, c_void_p, ctypes.POINTER(ctypes.c_uint32), c_void_p],
    ),
    "ring_buffer__new": (c_void_p, [c_int, SAMPLE_FN, c_void_p, c_void_p]),
    "ring_buffer__poll": (c_int, [c_void_p, c_int]),
    "ring_buffer__consume": (c_int, [c_void_p]),
    "ring_buffer__free": (None, [c_void_p]),
}


class _Lib:
    """The loaded shared library with argument and result types declared once."""

    def __init__(self, bundled: str = BUNDLED) -> None:
        self.origin = "system"  # or "bundled"
        if os.path.exists(bundled):
            # By its path: the bundled copy must win over any libbpf.so.1 on the search path.
            # A bundled copy that does not load is an error, not a reason to take another.
            try:
                self.dll = ctypes.CDLL(bundled, use_errno=True)
            except OSError as exc:
                raise KernelUnsupported(
                    f"the bundled libbpf does not load: {exc}",
                    "reinstall the whyrestart wheel (its libbpf and the libraries it needs "
                    "are inside it)",
                ) from exc
            self.origin, self.path = "bundled", bundled
        else:
            self.dll, self.path = self._system()
        d = self.dll
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(d, name)
            fn.restype = res
            fn.argtypes = args
        major, minor = d.libbpf_major_version(), d.libbpf_minor_version()
        if major < 1:
            raise KernelUnsupported(
                f"libbpf {major}.{minor} is too old: whyrestart needs libbpf >= 1.0",
                "install libbpf1 >= 1.0 (Debian 12 / Ubuntu 22.10 and newer ship it)",
            )
        self.version = f"{major}.{minor}"
        d.libbpf_set_print(_PRINT_CB)

    @staticmethod
    def _system() -> tuple[ctypes.CDLL, str]:
        for name in _LIBBPF_NAMES:
            try:
                return ctypes.CDLL(name, use_errno=True), name
            except OSError:
                continue
        from ctypes.util import find_library  # (imports tempfile & co.: only when needed)

        found = find_library("bpf")
        if found is None:
            raise KernelUnsupported(
                "libbpf is not installed (libbpf.so.1 not found)",
                "apt-get install libbpf1 (scripts/setup does this), or install the whyrestart "
                "wheel, which bundles it",
            )
        return ctypes.CDLL(found, use_errno=True), found

    def describe(self) -> str:
        """ "1.1, bundled (PATH)" or "1.1, system (libbpf.so.1)": what doctor shows."""
        return f"{self.version}, {self.origin} ({self.path})"

    def take_log(self) -> list[str]:
        """libbpf's warnings and info lines since the last call (the print hook is the
        process's: every libbpf loaded in it writes to the one log)."""
        global _log
        with _log_lock:
            out, _log = _log, []
        return out


# libbpf keeps the print hook in a global of the library and calls it from any later call, so
# the hook is the process's, not a _Lib's: a callback owned by an instance would be freed with
# it and the next libbpf call would jump into freed memory (a second _Lib over the same file,
# as the libbpf-choice tests make, used to segfault every later bpf_object__open_file).
_libc = ctypes.CDLL(None)
_libc.vsnprintf.argtypes = [c_char_p, c_size_t, c_char_p, c_void_p]
_libc.vsnprintf.restype = c_int
_log: list[str] = []
_log_lock = threading.Lock()


def _on_print(level: int, fmt: bytes | None, va_list: int | None) -> int:
    # va_list is an array type on x86-64 and arm64, so it arrives as a pointer and vsnprintf
    # can format it.
    if level > LIBBPF_INFO:
        return 0  # debug lines: thousands per load, 20 ms of start-up to format them
    buf = ctypes.create_string_buffer(2048)
    _libc.vsnprintf(buf, len(buf), fmt, va_list)
    with _log_lock:
        _log.append(buf.value.decode(errors="replace").rstrip())
        del _log[:-400]
    return 0


_PRINT_CB = PRINT_FN(_on_print)


_lib: _Lib | None = None


def lib() -> _Lib:
    global _lib
    if _lib is None:
        _lib = _Lib()
    return _lib


def version() -> str | None:
    try:
        return lib().version
    except Exception:
        return None


def status() -> tuple[bool, str]:
    """(loaded, what to show): "1.1, bundled (PATH)" / "1.1, system (libbpf.so.1)", or why it
    could not be loaded (not installed, too old, a bundled copy that does not load)."""
    try:
        return True, lib().describe()
    except Exception as exc:
        return False, getattr(exc, "message", None) or str(exc)


def _err() -> int:
    return ctypes.get_errno() or errno.EINVAL


class Program:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr
        self.name = (lib().dll.bpf_program__name(ptr) or b"").decode()
        self.section = (lib().dll.bpf_program__section_name(ptr) or b"").decode()

    def set_autoload(self, on: bool) -> None:
        rc = lib().dll.bpf_program__set_autoload(self.ptr, on)
        if rc < 0:
            raise BpfError(f"setting autoload of {self.section}", -rc)

    def set_attach_target(self, function: str) -> None:
        """Point an fentry/fexit program at another kernel function (before load)."""
        rc = lib().dll.bpf_program__set_attach_target(self.ptr, 0, function.encode())
        if rc < 0:
            raise BpfError(f"retargeting {self.section} to {function}", -rc)

    def attach(self, kprobe_function: str | None = None) -> Link:
        """Attach as the section says; ``kprobe_function`` names the target of a bare
        SEC("kprobe")/SEC("kretprobe") program."""
        if kprobe_function is not None:
            retprobe = self.section.startswith("kretprobe")
            link = lib().dll.bpf_program__attach_kprobe(
                self.ptr, retprobe, kprobe_function.encode()
            )
            where = f"{self.section}/{kprobe_function}"
        else:
            link = lib().dll.bpf_program__attach(self.ptr)
            where = self.section
        if not link:
            err = _err()
            step = f"attaching {where}"
            raise BpfError(step, err, _fix_for(step, err))
        return Link(link)

    def attach_uprobe(self, binary: str, offset: int, *, retprobe: bool, pid: int = -1) -> Link:
        """Attach a SEC("uprobe")/SEC("uretprobe") program at a file offset of ``binary``
        (uprobes are keyed by inode: every process mapping that file triggers it when ``pid``
        is -1)."""
        link = lib().dll.bpf_program__attach_uprobe(
            self.ptr, retprobe, pid, binary.encode(), offset
        )
        if not link:
            err = _err()
            kind = "uretprobe" if retprobe else "uprobe"
            raise BpfError(f"attaching {kind} {self.name} to {binary}+{offset:#x}", err)
        return Link(link)


class Link:
    def __init__(self, ptr: int, on_destroy: Callable[[], None] | None = None) -> None:
        self.ptr: int | None = ptr
        self._on_destroy = on_destroy

    def destroy(self) -> None:
        if self.ptr:
            lib().dll.bpf_link__destroy(self.ptr)
            self.ptr = None
            if self._on_destroy is not None:
                self._on_destroy()


# -- kretprobes with room for many sleeping callers -------------------------------------------

# A kretprobe can follow this many calls in flight at once (the kernel's ceiling for a tracefs
# kprobe event, KRETPROBE_MAXACTIVE_MAX). The default, max(10, 2 x CPUs), is what perf-event
# kprobes (libbpf's attach) get, and it cannot be raised there: threads asleep in the
# memory.high penalty or in reclaim beyond it lose their return (nmissed), and their stall is
# never closed. A tracefs kprobe event takes "r<maxactive>:".
KRETPROBE_MAXACTIVE = 4096
_KPROBE_GROUP = "whyrestart_"  # + the recorder's pid: events of a dead recorder can be told
_PERF_TYPE_TRACEPOINT = 2
_PERF_FLAG_FD_CLOEXEC = 8
_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}


class _PerfEventAttr(ctypes.Structure):
    # the fields up to config, then the rest of PERF_ATTR_SIZE_VER0 (64 bytes) as zeros
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("rest", ctypes.c_uint8 * 40),
    ]


def _kprobe_events(tracefs: str, line: str) -> None:
    # one write(2) with O_APPEND (O_TRUNC would clear every kprobe event); not open(..., "a"),
    # whose seek to the end tracefs refuses with EINVAL
    fd = os.open(os.path.join(tracefs, "kprobe_events"), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def remove_stale_kprobe_events(tracefs: str) -> None:
    """Remove kprobe events left by recorders that died without cleaning up."""
    try:
        with open(os.path.join(tracefs, "kprobe_events")) as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for ln in lines:
        # r4096:whyrestart_1234/high_kretprobe __mem_cgroup_handle_over_high
        name = ln.split(" ", 1)[0].partition(":")[2]
        group = name.partition("/")[0]
        if group.startswith(_KPROBE_GROUP):
            pid = group[len(_KPROBE_GROUP) :]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                with contextlib.suppress(OSError):
                    _kprobe_events(tracefs, f"-:{name}")


def attach_kretprobe_maxactive(prog: Program, function: str, tracefs: str) -> Link:
    """Attach a kretprobe program to ``function`` through a tracefs kprobe event with room for
    KRETPROBE_MAXACTIVE calls in flight; the event is removed with the link."""
    nr = _NR_PERF_EVENT_OPEN.get(os.uname().machine)
    if nr is None:
        raise BpfError(f"attaching {prog.section} with maxactive", errno.ENOTSUP)
    group = f"{_KPROBE_GROUP}{os.getpid()}"
    name = f"{group}/{prog.name}"
    step = f"adding kprobe event r{KRETPROBE_MAXACTIVE}:{name} {function}"
    try:
        _kprobe_events(tracefs, f"r{KRETPROBE_MAXACTIVE}:{name} {function}")
    except OSError as exc:
        raise BpfError(step, exc.errno or errno.EINVAL) from exc

    def remove() -> None:
        with contextlib.suppress(OSError):
            _kprobe_events(tracefs, f"-:{name}")

    try:
        with open(os.path.join(tracefs, "events", group, prog.name, "id")) as f:
            event_id = int(f.read())
        attr = _PerfEventAttr(
            type=_PERF_TYPE_TRACEPOINT,
            size=ctypes.sizeof(_PerfEventAttr),
            config=event_id,
            sample_period=1,
        )
        libc = ctypes.CDLL(None, use_errno=True)
        # pid -1, cpu 0: a BPF program on a trace event runs for every CPU
        pfd = libc.syscall(nr, ctypes.byref(attr), -1, 0, -1, _PERF_FLAG_FD_CLOEXEC)
        if pfd < 0:
            raise BpfError(f"opening perf event for {name}", ctypes.get_errno())
        link = lib().dll.bpf_program__attach_perf_event(prog.ptr, pfd)
        if not link:
            err = _err()
            os.close(pfd)
            raise BpfError(f"attaching {prog.section} to {name}", err)
    except (OSError, ValueError) as exc:
        remove()
        raise BpfError(step, getattr(exc, "errno", None) or errno.EINVAL) from exc
    except BpfError:
        remove()
        raise
    return Link(link, on_destroy=remove)


# include/uapi/linux/bpf.h enum bpf_map_type
BPF_MAP_TYPE_LRU_HASH = 9
# A common LRU hands each CPU its free nodes in batches of LOCAL_FREE_TARGET (128,
# kernel/bpf/bpf_lru_list.c): with fewer than that per possible CPU, a CPU that finds the
# global free list short shrinks it by evicting *live* entries, long before the map is full
# (kernel-side review §12: on a 128-CPU host every map of ours was that small). Upstream's
# "bpf: adjust free target to avoid global starvation of LRU map" (2025) helps newer kernels
# only; twice the batch per CPU keeps a map from starving on every kernel.
LRU_ENTRIES_PER_CPU = 256


def lru_entries(declared: int, possible_cpus: int) -> int:
    """The size an LRU map is created with: what the object declares, or enough for every
    possible CPU's batches where that is more."""
    return max(declared, LRU_ENTRIES_PER_CPU * possible_cpus)


class Map:
    def __init__(self, ptr: int, name: str) -> None:
        self.ptr = ptr
        self.name = name
        self._batch: bool | None = None  # BPF_MAP_LOOKUP_BATCH works here (None: not tried)
        self._buffers: dict[tuple[type, type], tuple[ctypes.Array[Any], ctypes.Array[Any]]] = {}

    @property
    def max_entries(self) -> int:
        return int(lib().dll.bpf_map__max_entries(self.ptr))

    @property
    def fd(self) -> int:
        return int(lib().dll.bpf_map__fd(self.ptr))

    def reuse_fd(self, fd: int) -> None:
        """Before load: use the already created map ``fd`` (another object's) instead of
        creating one; libbpf refuses a map of another type, size or key/value size."""
        rc = lib().dll.bpf_map__reuse_fd(self.ptr, fd)
        if rc < 0:
            raise BpfError(f"sharing map {self.name}", -rc)

    def set_pin_path(self, path: str | None) -> None:
        """Before load: pin the map at ``path`` (reusing one pinned there), or not at all."""
        rc = lib().dll.bpf_map__set_pin_path(self.ptr, path.encode() if path else None)
        if rc < 0:
            raise BpfError(f"setting the pin path of map {self.name}", -rc)

    def initial_value(self) -> ctypes.Array[ctypes.c_char]:
        """The writable, pre-load contents of a global-data map (.rodata, .bss, .data)."""
        size = c_size_t(0)
        ptr = lib().dll.bpf_map__initial_value(self.ptr, ctypes.byref(size))
        if not ptr:
            raise BpfError(f"reading initial value of map {self.name}", _err())
        return (ctypes.c_char * size.value).from_address(ptr)

    def _key_value(self, op: str, key: ctypes._CData, value: ctypes._CData, flags: int = 0) -> int:
        """libbpf's bpf_map__<op>(map, key, key_size, value, value_size, flags): its rc."""
        fn = getattr(lib().dll, f"bpf_map__{op}")
        return int(
            fn(
                self.ptr,
                ctypes.byref(key),
                ctypes.sizeof(key),
                ctypes.byref(value),
                ctypes.sizeof(value),
                flags,
            )
        )

    def update(self, key: ctypes._CData, value: ctypes._CData, flags: int = BPF_ANY) -> None:
        rc = self._key_value("update_elem", key, value, flags)
        if rc < 0:
            raise BpfError(f"updating map {self.name}", -rc)

    def lookup(self, key: ctypes._CData, value: ctypes._CData) -> bool:
        rc = self._key_value("lookup_elem", key, value)
        if rc == -errno.ENOENT:
            return False
        if rc < 0:
            raise BpfError(f"reading map {self.name}", -rc)
        return True

    def delete(self, key: ctypes._CData) -> None:
        rc = lib().dll.bpf_map__delete_elem(self.ptr, ctypes.byref(key), ctypes.sizeof(key), 0)
        if rc < 0 and rc != -errno.ENOENT:
            raise BpfError(f"deleting from map {self.name}", -rc)

    def keys(self, key_type: type[ctypes.Structure]) -> list[ctypes.Structure]:
        """Every key, read with get_next_key (a snapshot: the kernel may add keys meanwhile)."""
        out: list[ctypes.Structure] = []
        prev: ctypes.Structure | None = None
        size = ctypes.sizeof(key_type)
        while len(out) < 1 << 20:
            nxt = key_type()
            rc = lib().dll.bpf_map__get_next_key(
                self.ptr,
                ctypes.byref(prev) if prev is not None else None,
                ctypes.byref(nxt),
                size,
            )
            if rc == -errno.ENOENT:
                break
            if rc < 0:
                raise BpfError(f"listing map {self.name}", -rc)
            out.append(nxt)
            prev = nxt
        return out

    def items(self, key_type: type[K], value_type: type[V]) -> list[tuple[K, V]]:
        """Every (key, value), copied out. One BPF_MAP_LOOKUP_BATCH syscall for the whole map
        (hash and LRU hash maps, Linux 5.6): listing keys and looking each up costs two
        syscalls an entry, and a drain each second of a table holding a hundred cgroups' was
        most of what the agent did beside a busy host. Other map types, or a kernel without
        batch lookups, take that per-key path (a snapshot that an insert racing it can miss)."""
        if self._batch is not False:
            got = self._items_batch(key_type, value_type)
            if got is not None:
                self._batch = True
                return got
            self._batch = False
        out: list[tuple[K, V]] = []
        for key in self.keys(key_type):  # type: ignore[arg-type]
            value = value_type()
            if self.lookup(key, value):
                out.append((key, value))  # type: ignore[arg-type]
        return out

    def _items_batch(self, key_type: type[K], value_type: type[V]) -> list[tuple[K, V]] | None:
        n = self.max_entries
        bufs = self._buffers.get((key_type, value_type))
        if bufs is None:  # (allocated once: a drain a second must not zero 200 kB each time)
            bufs = (key_type * n)(), (value_type * n)()
            self._buffers[(key_type, value_type)] = bufs
        keys, values = bufs
        out: list[tuple[K, V]] = []
        # the batch token: a bucket index (u32) for hash maps; room for a u64
        token_in, token_out = ctypes.c_uint64(0), ctypes.c_uint64(0)
        first = True
        while True:
            count = ctypes.c_uint32(n)
            rc = lib().dll.bpf_map_lookup_batch(
                self.fd,
                None if first else ctypes.byref(token_in),
                ctypes.byref(token_out),
                keys,
                values,
                ctypes.byref(count),
                None,
            )
            if rc < 0 and rc != -errno.ENOENT:
                if first and -rc in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP):
                    return None  # no batch ops for this map or kernel
                raise BpfError(f"reading map {self.name}", -rc)
            ks, vs = ctypes.sizeof(key_type), ctypes.sizeof(value_type)
            for i in range(count.value):
                # (by offset: an array of a simple type hands out ints, not its elements)
                key = cast(K, key_type.from_buffer_copy(keys, i * ks))
                out.append((key, cast(V, value_type.from_buffer_copy(values, i * vs))))
            if rc == -errno.ENOENT or count.value == 0:
                return out  # (ENOENT: the last bucket was read)
            token_in.value, first = token_out.value, False

    def pop(self, key: ctypes._CData, value: ctypes._CData) -> bool:
        """Atomically read and delete one entry (hash maps, kernel 5.14+)."""
        rc = self._key_value("lookup_and_delete_elem", key, value)
        if rc == -errno.ENOENT:
            return False
        if rc == -ENOTSUPP:
            # Hash maps gained lookup-and-delete in 5.14; before, read then delete (an update
            # landing in between is lost: acceptable for summaries, and only on old kernels).
            if not self.lookup(key, value):
                return False
            self.delete(key)
            return True
        if rc < 0:
            raise BpfError(f"draining map {self.name}", -rc)
        return True

    def percpu_sum_u64(self, index: int = 0) -> int:
        """Sum one u64 slot of a per-CPU array over every possible CPU."""
        ncpu = lib().dll.libbpf_num_possible_cpus()
        if ncpu <= 0:
            raise BpfError("counting possible CPUs", -ncpu or errno.EINVAL)
        values = (ctypes.c_uint64 * ncpu)()
        key = ctypes.c_uint32(index)
        if not self.lookup(key, values):
            return 0
        return sum(values)


class BpfObject:
    """An opened (and later loaded) BPF object file."""

    def __init__(self, path: str) -> None:
        self.path = path
        ptr = lib().dll.bpf_object__open_file(path.encode(), None)
        if not ptr:
            err = _err()
            fix = "build it: make -C bpf (scripts/setup does this)" if err == errno.ENOENT else None
            raise BpfError(f"opening BPF object {path}", err, fix)
        self.ptr: int | None = ptr

    def programs(self) -> Iterator[Program]:
        prog = None
        while True:
            prog = lib().dll.bpf_object__next_program(self.ptr, prog)
            if not prog:
                return
            yield Program(prog)

    def program(self, name: str) -> Program:
        ptr = lib().dll.bpf_object__find_program_by_name(self.ptr, name.encode())
        if not ptr:
            raise BpfError(f"finding program {name} in {self.path}", errno.ENOENT)
        return Program(ptr)

    def map(self, name: str) -> Map:
        ptr = lib().dll.bpf_object__find_map_by_name(self.ptr, name.encode())
        if not ptr:
            raise BpfError(f"finding map {name} in {self.path}", errno.ENOENT)
        return Map(ptr, name)

    def maps(self) -> Iterator[Map]:
        d = lib().dll
        ptr = None
        while True:
            ptr = d.bpf_object__next_map(self.ptr, ptr)
            if not ptr:
                return
            yield Map(ptr, (d.bpf_map__name(ptr) or b"").decode())

    def size_lru_maps(self) -> dict[str, int]:
        """Before load: grow each LRU map to ``lru_entries`` for this host's possible CPUs. A
        pinned map is left as declared: it is shared with other recorders, and libbpf reuses a
        pinned map only where the sizes match. The maps grown, with their new sizes."""
        d = lib().dll
        ncpu = d.libbpf_num_possible_cpus()
        if ncpu <= 0:
            raise BpfError("counting possible CPUs", -ncpu or errno.EINVAL)
        grown: dict[str, int] = {}
        for m in self.maps():
            if d.bpf_map__type(m.ptr) != BPF_MAP_TYPE_LRU_HASH or d.bpf_map__pin_path(m.ptr):
                continue
            declared = int(d.bpf_map__max_entries(m.ptr))
            want = lru_entries(declared, ncpu)
            if want != declared:
                rc = d.bpf_map__set_max_entries(m.ptr, want)
                if rc < 0:
                    raise BpfError(f"sizing map {m.name}", -rc)
                grown[m.name] = want
        return grown

    def load(self) -> None:
        """Load the object, its LRU maps sized for this host first (``size_lru_maps``)."""
        self.size_lru_maps()
        lib().take_log()
        rc = lib().dll.bpf_object__load(self.ptr)
        if rc < 0:
            step = f"loading {self.path}"
            raise BpfError(step, -rc, _fix_for(step, -rc))

    def close(self) -> None:
        if self.ptr:
            lib().dll.bpf_object__close(self.ptr)
            self.ptr = None


# Records handed over per drain at most, and the callback's "stop here" (any negative number
# libbpf passes back; one that no syscall of the ring buffer returns).
BATCH_MAX = 4096
_BATCH_FULL = -errno.E2BIG


class RingBuffer:
    """A libbpf ring-buffer consumer that collects raw records in batches.

    The per-record callback only copies bytes into a list; decoding happens later, in bulk, in
    pure Python (tracer.bpf.decode). ``drain`` waits up to ``timeout_ms`` for a wake-up, then
    consumes everything pending, including records submitted with BPF_RB_NO_WAKEUP, which
    never make the epoll fd ready on their own.
    """

    def __init__(self, events_map: Map, batch_max: int = BATCH_MAX) -> None:
        self._batch: list[bytes] = []
        self.full = False
        batch = self._batch
        append = batch.append
        string_at = ctypes.string_at

        def on_sample(_ctx: int | None, data: int | None, size: int) -> int:
            if data is not None:
                append(string_at(data, size))
            # A negative return makes libbpf stop after this record (it stays consumed): when
            # the producer outruns us, one drain would otherwise never end and hold the whole
            # flood in memory (190 MB under a 150k signals/s storm); what cannot fit in the
            # ring meanwhile is counted as lost by the kernel side.
            return _BATCH_FULL if len(batch) >= batch_max else 0

        self._cb: Callable[..., int] = SAMPLE_FN(on_sample)
        ptr = lib().dll.ring_buffer__new(events_map.fd, self._cb, None, None)
        if not ptr:
            raise BpfError("creating the ring-buffer consumer", _err())
        self.ptr: int | None = ptr

    def drain(self, timeout_ms: int) -> list[bytes]:
        """Up to ``batch_max`` records: what a wake-up (or the timeout) brought, then whatever
        else is pending."""
        d = lib().dll
        rc = d.ring_buffer__poll(self.ptr, timeout_ms)
        if rc < 0 and rc not in (-errno.EINTR, _BATCH_FULL):
            raise BpfError("polling the ring buffer", -rc)
        if rc != _BATCH_FULL:
            rc = d.ring_buffer__consume(self.ptr)
            if rc < 0 and rc not in (-errno.EINTR, _BATCH_FULL):
                raise BpfError("consuming the ring buffer", -rc)
        self.full = rc == _BATCH_FULL  # more is waiting: the consumer is behind
        out = self._batch[:]
        self._batch.clear()
        return out

    def free(self) -> None:
        if self.ptr:
            lib().dll.ring_buffer__free(self.ptr)
            self.ptr = None
