"""The command line's value types: every option value is checked when it is parsed, by the
same parser the rest of the tool uses, so that a bad value is refused before anything runs,
with exit code 2 and a message that names the option (click's "Invalid value for '--x'").

This module owns the rules for option values: durations (`DURATION`), health probes
(`PROBE`), repro's value lists (`SettingList`), memory cgroup paths (`CGROUP`), output files
(`OUTPUT_FILE`) and output directories (`OUTPUT_DIR`). A path is checked for what can be known
before writing (its directory exists and is a directory, it is not a directory, a device, a
FIFO or a socket); what only the write can tell (a file system that makes no files, like /proc)
is an `OutputError` (exit 7) naming the path when the write fails.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any, TypeVar

import click

from tracer.errors import UsageError
from tracer.parse import cgpath, values

_KINDS = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


T = TypeVar("T")


def _parsed(
    param_type: click.ParamType[Any], parse: Callable[[str], T], value: Any, param: Any, ctx: Any
) -> T:
    """``parse(value)``; its `UsageError` becomes click's usage error naming the option."""
    try:
        return parse(str(value))
    except UsageError as exc:
        param_type.fail(str(exc), param, ctx)


class _Duration(click.ParamType[float]):
    """Seconds: ``0.5``, ``500ms``, ``2s`` (tracer.parse.values.parse_duration); finite and
    above zero."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            return value
        return _parsed(self, values.parse_duration, value, param, ctx)


class _Probe(click.ParamType[Any]):
    name = "probe"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        from tracer.sources.probes import ProbeSpec, parse_probe

        if isinstance(value, ProbeSpec):
            return value
        return _parsed(self, parse_probe, value, param, ctx)


class Checked(click.ParamType[str]):
    """A value checked by one of the tool's parsers (which raises `UsageError`) and passed on
    as written, for code that parses it again itself."""

    def __init__(self, name: str, parser: Callable[[str], object]) -> None:
        self.name = name
        self.parser = parser

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        _parsed(self, self.parser, value, param, ctx)
        return str(value)


class SettingList(Checked):
    """A repro value list (``32M,256M``; one value for a setting held fixed) of sizes, or of
    durations with ``durations``; the text is passed on as written."""

    def __init__(self, option: str, durations: bool = False) -> None:
        one: Callable[[str], object] = values.parse_duration if durations else values.parse_size
        super().__init__("values", lambda text: values.parse_list(option, text, one))


def normalise_cgroup(text: str, memory_root: str | None) -> str:
    """A memory cgroup as given on the command line → its path below the memory root.

    ``/sys/fs/cgroup/memory/x`` (the root's own prefix) becomes ``/x``; ``.`` and ``..`` are
    resolved, and a path that climbs above the root is refused, as is an empty one."""
    if not text.strip():
        raise UsageError("an empty cgroup path", "give a path such as /system.slice/x.service")
    path = text if text.startswith("/") else "/" + text
    root = (memory_root or "").rstrip("/")
    if root and cgpath.is_within(path, root):
        path = path[len(root) :] or "/"
    depth = 0
    for part in path.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                raise UsageError(
                    f"cgroup path {text!r} climbs above the root of the memory hierarchy",
                    "give a path below the root, such as /system.slice/x.service",
                )
        elif part not in ("", "."):
            depth += 1
    return cgpath.canonical(path)


class _Cgroup(click.ParamType[str]):
    name = "cgroup"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from tracer.sources.cgroupfs import CgroupLayout

        memory_root = CgroupLayout.from_system().memory_root
        return _parsed(self, lambda text: normalise_cgroup(text, memory_root), value, param, ctx)


def check_output_file(path: str, *, overwrite: bool = True, force_option: str = "") -> None:
    """What can be known about an output file before writing it; a `UsageError` otherwise.

    ``overwrite``: whether an existing regular file may be replaced (record replaces one only
    with ``force_option`` given)."""
    if not path:
        raise UsageError("an empty path", "name a file")
    where = os.path.dirname(os.path.abspath(path))
    try:
        st_dir = os.stat(where)
    except FileNotFoundError:
        raise UsageError(
            f"{path}: directory {where} does not exist", f"create it (mkdir -p {where}) first"
        ) from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot look at {where}: {exc.strerror}") from None
    if not stat.S_ISDIR(st_dir.st_mode):
        raise UsageError(f"{path}: {where} is not a directory", "choose a path in a directory")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(
            f"{path} is a symbolic link: whyrestart never writes through one",
            "remove the link or choose another path",
        )
    kind = _KINDS.get(stat.S_IFMT(st.st_mode))
    if kind is not None:
        fix = "name a file inside it" if kind == "a directory" else "choose a regular file path"
        raise UsageError(
            f"{path} is {kind}: whyrestart writes only regular files"
            + (f" (and {force_option} replaces only those)" if force_option else ""),
            fix,
        )
    if not overwrite:
        raise UsageError(
            f"{path} exists", f"choose another path, or replace it with {force_option}"
        )


def check_not_input(output: str, trace: str) -> None:
    """An output that is the trace being read would destroy it: a `UsageError`."""
    try:
        same = os.path.samefile(output, trace)
    except OSError:  # one of them does not exist (or cannot be looked at): not the same file
        return
    if same:
        raise UsageError(
            f"{output} is the trace being read: writing it would destroy the trace",
            "choose another output path",
        )


def check_output_dir(path: str) -> None:
    """A directory to create (or reuse): its parent must exist; an existing path must be a
    directory (its contents are checked by the command that fills it)."""
    if not path:
        raise UsageError("an empty path", "name a directory")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise UsageError(
                f"{path} exists and is not a directory", "choose a new or existing directory"
            )
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(
            f"{path}: directory {parent} does not exist", f"create it (mkdir -p {parent}) first"
        )


DURATION = _Duration()
PROBE = _Probe()
CGROUP = _Cgroup()
# A file to write: its directory must exist; an existing path must be a regular file.
OUTPUT_FILE = Checked("file", check_output_file)
# A directory to create or reuse: its parent must exist; an existing path is a directory.
OUTPUT_DIR = Checked("directory", check_output_dir)


class _Trace(click.ParamType[str]):
    """A trace file, or the id of an incident the agent kept (``20261201T031502Z-4242``),
    looked up in $WHYRESTART_STATE_DIR (default /var/lib/whyrestart)."""

    name = "trace"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        path = str(value)
        if os.path.exists(path) or os.sep in path:
            return path
        from tracer.agent.state import StateDir, default_state_dir

        found = StateDir(default_state_dir()).incident_path(path)
        return found if found is not None else path


TRACE = _Trace()
