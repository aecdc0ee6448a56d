"""Kernel log parsing: ``/dev/kmsg`` records and the OOM killer's report.

This module owns two pure steps, with no file, device or clock access:

* ``parse_record`` turns one raw ``/dev/kmsg`` record (what one ``read(2)`` returns) into a
  ``KmsgRecord``;
* ``OomAssembler`` follows the record stream and, when the kernel has printed an OOM kill,
  emits one ``tracer.events.KmsgOom`` per victim.

The OOM report (``mm/oom_kill.c``, ``mm/memcontrol.c``) has changed shape many times, so every
line is parsed defensively: a field the kernel did not print becomes ``None`` / ``""``, an
unknown line is ignored, and nothing here raises on odd input. The shapes handled::

    <comm> invoked oom-killer: gfp_mask=..., order=0, oom_score_adj=0      (report start)
    Task in /a/b killed as a result of limit of /a                          (<= 4.18, memcg)
    memory: usage 65536kB, limit 65536kB, failcnt 12                        (memcg)
    oom-kill:constraint=...,oom_memcg=/a,task_memcg=/a/b,task=x,pid=1,uid=0 (>= 4.19)
    Memory cgroup out of memory: Kill process 1 (x) score 999 or sacrifice child  (< 5.x)
    Memory cgroup out of memory: Killed process 1 (x) total-vm:..kB, ...   (>= 5.x)
    Killed process 1 (x) total-vm:..kB, anon-rss:..kB, file-rss:..kB       (< 5.x, no prefix)
    Tasks in /a/b are going to be killed due to memory.oom.group set       (>= 4.19)
    <prefix>: OOM victim 1 (x) is already exiting. Skip killing the task

The header lines (``invoked oom-killer`` through ``oom-kill:``) are rate limited by the kernel
and the ``Killed process`` lines are not, so a burst of OOMs can print bare ``Killed process``
lines; the assembler therefore only pairs a ``Killed process`` line with header facts that are
still unclaimed (see ``OomAssembler``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tracer.events import KmsgOom
from tracer.parse.memory import normalize_stat

__all__ = [
    "KilledProcess",
    "KmsgRecord",
    "OomAssembler",
    "parse_killed_process_line",
    "parse_oom_kill_line",
    "parse_record",
]

# ---------------------------------------------------------------------------------------------
# /dev/kmsg records


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One kernel log record as ``/dev/kmsg`` presents it.

    ``ts_us`` is the kernel's ``local_clock()`` time in microseconds (roughly CLOCK_MONOTONIC),
    not CLOCK_BOOTTIME: the caller converts. ``message`` is the text after ``;``, still carrying
    the kernel's ``\\xNN`` escapes for non-printable bytes; the ``KEY=VALUE`` dictionary lines
    that may follow a record are not kept.
    """

    level: int  # 0 (emerg) .. 7 (debug)
    facility: int  # 0 = kernel; userspace writes to /dev/kmsg can carry others
    seq: int  # the record's sequence number: a gap means records were lost
    ts_us: int
    message: str


# "<prio>,<seq>,<ts_usec>,<flags>[,more...]" before the first ';'. The flags field is a single
# character today ('-', 'c', '+') and "more" holds e.g. ",caller=T123" (CONFIG_PRINTK_CALLER);
# both are tolerated and dropped. Digits are bounded so int() never meets an absurd string.
_HEADER_RE = re.compile(rb"(\d{1,10}),(\d{1,20}),(\d{1,20}),[^,;\n]*(?:,[^;\n]*)?")


def parse_record(raw: bytes) -> KmsgRecord | None:
    """Parse one raw ``/dev/kmsg`` record; ``None`` when it is not one.

    The format is ``"<prio>,<seq>,<ts_usec>,<flags>[,more];<message>\\n"``, optionally followed
    by dictionary lines that start with a space (``" SUBSYSTEM=acpi\\n"``). The message is
    decoded as UTF-8 with replacement characters for invalid bytes.
    """
    try:
        data = bytes(raw)
    except (TypeError, ValueError):
        return None
    semi = data.find(b";")
    if semi < 0:
        return None
    header = _HEADER_RE.fullmatch(data, 0, semi)
    if header is None:
        return None
    prio, seq, ts_us = (int(g) for g in header.groups())
    # The message ends at the first newline; what follows are dictionary lines, which the OOM
    # parsing does not need.
    end = data.find(b"\n", semi + 1)
    body = data[semi + 1 :] if end < 0 else data[semi + 1 : end]
    return KmsgRecord(
        level=prio & 7,
        facility=prio >> 3,
        seq=seq,
        ts_us=ts_us,
        message=body.decode("utf-8", errors="replace"),
    )


# ---------------------------------------------------------------------------------------------
# Single-line OOM report parsers

# All numeric groups use re.ASCII so Unicode digits never reach int(); _int() still guards
# against the interpreter's limit on very long digit strings.
_OOM_KILL_RE = re.compile(r"\s*oom-kill:\s*(?P<body>.*)", re.ASCII | re.DOTALL)
# The fixed tail of the summary: comm may contain commas, pid and uid are numbers, so anchor the
# three fields at the end rather than splitting on commas.
_OOM_KILL_TAIL_RE = re.compile(
    r",\s*task=(?P<task>.*),\s*pid=(?P<pid>-?\d+),\s*uid=(?P<uid>-?\d+)\s*$",
    re.ASCII | re.DOTALL,
)
# Split the head on commas that start a "key=" or the bare "global_oom" flag. A plain comma split
# would break mems_allowed= / nodemask= values, which are node lists such as "0,2-3".
_OOM_KILL_SPLIT_RE = re.compile(r",\s*(?=[a-z_]+=|global_oom\s*(?:,|$))", re.ASCII)

_KILLED_RE = re.compile(
    r"(?:(?P<prefix>.*?): )?Killed process (?P<pid>\d+)"
    # RHEL 6 era kernels printed "Killed process 1234, UID 679, (java) ..."
    r"(?:, UID (?P<uid>\d+),)?"
    # comm may itself contain ')' or spaces; the fields after it never contain ')'
    r" \((?P<comm>.*)\)(?P<rest>.*)",
    re.ASCII | re.DOTALL,
)
_KILLED_FIELD_RE = re.compile(r"(?P<key>[A-Za-z][A-Za-z_-]*):\s*(?P<val>-?\d+)(?:kB)?", re.ASCII)

# Before 5.x the chosen task was announced first, then a child could be killed in its place.
_KILL_CHOICE_RE = re.compile(
    r"(?:(?P<prefix>.*?): )?Kill process (?P<pid>\d+) \((?P<comm>.*)\)", re.ASCII | re.DOTALL
)
_SKIP_RE = re.compile(
    r"(?:(?P<prefix>.*?): )?OOM victim (?P<pid>\d+) \((?P<comm>.*)\) is already exiting",
    re.ASCII | re.DOTALL,
)
_INVOKED_RE = re.compile(r"(?P<comm>.*?) invoked oom-killer:", re.DOTALL)
_USAGE_RE = re.compile(
    r"memory: usage (?P<usage>\d+)kB, limit (?P<limit>\d+)kB, failcnt (?P<failcnt>\d+)",
    re.ASCII,
)
# mem_cgroup_print_oom_meminfo()'s other usage lines: v1's kernel memory, v2's swap.
_KMEM_RE = re.compile(r"kmem: usage (?P<usage>\d+)kB", re.ASCII)
_SWAP_RE = re.compile(r"swap: usage (?P<usage>\d+)kB", re.ASCII)
# The memory.stat dump that follows "Memory cgroup stats for <path>:", one "key value" per
# record (seq_buf_do_printk prints each line as its own record).
_STATS_FOR = "Memory cgroup stats for "
_STAT_LINE_RE = re.compile(r"(?P<key>[a-z_]+) (?P<value>\d+)", re.ASCII)
_LEGACY_STATS_RE = re.compile(
    r"(?P<path>.*?): (?P<pairs>[a-z_]+:\d+KB(?: [a-z_]+:\d+KB)*)", re.ASCII
)
_LEGACY_PAIR_RE = re.compile(r"([a-z_]+):(\d+)KB", re.ASCII)
_GROUP_RE = re.compile(
    r"Tasks in (?P<path>.*) are going to be killed due to memory\.oom\.group set", re.DOTALL
)
_TASK_IN_RE = re.compile(
    r"Task in (?P<task>.*) killed as a result of limit of (?P<limit>.*)", re.DOTALL
)

# The message prefix the kernel uses for kills inside a memory cgroup ("Out of memory" and
# "Out of memory (oom_kill_allocating_task)" are the global ones).
_MEMCG_PREFIX = "Memory cgroup out of memory"


def _int(text: str | None) -> int | None:
    """``int(text)``, or ``None`` for a missing or unparsable value."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:  # e.g. more digits than sys.get_int_max_str_digits() allows
        return None


def parse_oom_kill_line(message: str) -> dict[str, str] | None:
    """Fields of the one-line OOM summary (kernel >= 4.19); ``None`` for any other line.

    ``"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,
    oom_memcg=/a,task_memcg=/a/b,task=python3,pid=1234,uid=0"`` gives
    ``{"constraint": "CONSTRAINT_MEMCG", ..., "pid": "1234", "uid": "0"}``. A bare flag such
    as ``global_oom`` (printed instead of ``oom_memcg=`` for a global OOM) maps to ``""``. A
    truncated line yields the fields that are present.
    """
    m = _OOM_KILL_RE.match(message)
    if m is None:
        return None
    body = m.group("body").rstrip()
    fields: dict[str, str] = {}
    tail = _OOM_KILL_TAIL_RE.search(body)
    if tail is not None:
        body = body[: tail.start()]
    for token in _OOM_KILL_SPLIT_RE.split(body):
        key, sep, value = token.partition("=")
        key = key.strip()
        if key:
            fields[key] = value if sep else ""
    if tail is not None:
        fields["task"] = tail.group("task")
        fields["pid"] = tail.group("pid")
        fields["uid"] = tail.group("uid")
    return fields


@dataclass(frozen=True, slots=True)
class KilledProcess:
    """The ``Killed process ...`` line: what the OOM killer killed and how big it was."""

    prefix: str  # "Memory cgroup out of memory", "Out of memory", ... ("" on old kernels)
    pid: int
    comm: str
    total_vm_kb: int | None = None
    anon_rss_kb: int | None = None
    file_rss_kb: int | None = None
    shmem_rss_kb: int | None = None  # kernel >= 4.5
    uid: int | None = None  # kernel >= 5.x (or ", UID n," on RHEL 6 era kernels)
    pgtables_kb: int | None = None
    oom_score_adj: int | None = None


_KILLED_KEYS = {
    "total-vm": "total_vm_kb",
    "anon-rss": "anon_rss_kb",
    "file-rss": "file_rss_kb",
    "shmem-rss": "shmem_rss_kb",
    "UID": "uid",
    "pgtables": "pgtables_kb",
    "oom_score_adj": "oom_score_adj",
}


def parse_killed_process_line(message: str) -> KilledProcess | None:
    """Parse ``"[<prefix>: ]Killed process <pid> (<comm>) total-vm:..kB, ..."``.

    Returns ``None`` for any other line, including the older ``"Kill process ... score ..."``
    announcement, which names the chosen task but is not the kill itself.
    """
    m = _KILLED_RE.fullmatch(message.rstrip())
    if m is None:
        return None
    pid = _int(m.group("pid"))
    if pid is None:
        return None
    values: dict[str, int | None] = {"uid": _int(m.group("uid"))}
    for f in _KILLED_FIELD_RE.finditer(m.group("rest")):
        name = _KILLED_KEYS.get(f.group("key"))
        if name is not None and values.get(name) is None:
            values[name] = _int(f.group("val"))
    return KilledProcess(
        prefix=m.group("prefix") or "",
        pid=pid,
        comm=m.group("comm"),
        total_vm_kb=values.get("total_vm_kb"),
        anon_rss_kb=values.get("anon_rss_kb"),
        file_rss_kb=values.get("file_rss_kb"),
        shmem_rss_kb=values.get("shmem_rss_kb"),
        uid=values.get("uid"),
        pgtables_kb=values.get("pgtables_kb"),
        oom_score_adj=values.get("oom_score_adj"),
    )


# ---------------------------------------------------------------------------------------------
# Report assembly


@dataclass(frozen=True, slots=True)
class _KillContext:
    """Report-wide facts one kill was attributed to (shared with its oom.group members)."""

    constraint: str
    oom_memcg: str
    memcg: bool
    prefix: str  # the Killed line's own prefix, which group members repeat
    stat: dict[str, int] = field(default_factory=dict)  # the report's memcg stat dump
    stat_path: str = ""


@dataclass(slots=True)
class _Group:
    """A memory.oom.group kill in progress: the members follow the ``Tasks in`` line."""

    path: str
    ctx: _KillContext | None
    last_ts_us: int
    killed: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _TaskIn:
    """The pre-4.19 ``Task in X killed as a result of limit of Y`` line, until claimed."""

    task_memcg: str
    oom_memcg: str
    choice_pid: int | None = None  # the "Kill process" line that followed it
    bound: bool = False


class OomAssembler:
    """Turns the kernel log record stream into ``KmsgOom`` events, one per OOM victim.

    Feed it every record, in order (``feed``); a gap in sequence numbers (records the kernel
    overwrote before they were read) drops the partial report, so facts from one OOM are never
    glued to another. An event is emitted on each ``Killed process`` line and combines:

    * the ``oom-kill:`` summary line (constraint, oom_memcg, task_memcg) if one was printed
      since the previous kill. Its ``task_memcg`` is used only when the summary's ``pid``
      matches the victim; constraint and oom_memcg describe the whole OOM and are used either
      way (older kernels may kill a child of the task the summary names);
    * on kernels before 4.19, the ``Task in ... killed as a result of limit of ...`` line and the
      ``Kill process`` line's prefix in the same way;
    * for ``memory.oom.group`` members (the ``Killed process`` lines after ``Tasks in ... are
      going to be killed``), the first victim's constraint and oom_memcg; their own cgroup is
      not printed, so ``task_memcg`` is ``""`` (``last_oom_group`` holds the group's path). The
      first victim, which the kernel may print again among the members, is reported once.

    Without any header (rate limited, or reading began mid-report) the event has constraint
    ``""`` and ``memcg`` decided by the line's prefix.
    """

    # Group members are printed in one loop right after the "Tasks in" line; a same-prefix
    # "Killed process" line further than this from the previous member belongs to a later OOM
    # (slow serial consoles can stretch the loop, hence a generous bound).
    GROUP_GAP_US = 2_000_000

    # The partial report, which ``reset`` forgets:
    _summary: dict[str, str] | None  # unclaimed oom-kill: fields
    _summary_text: str | None  # its raw body while pr_cont pieces may follow
    _task_in: _TaskIn | None
    _choice_prefix: str | None  # prefix of the latest "Kill process" line
    _last_kill: tuple[_KillContext, int] | None  # (context, victim pid)
    _group: _Group | None
    _stat: dict[str, int]  # the memcg stat dump, raw keys (v1 or v2 names)
    _stat_path: str
    _in_stat: bool  # the records now arriving are the dump's lines
    _kmem: int | None
    _swap: int | None

    def __init__(self) -> None:
        # "memory: usage X kB, limit Y kB, failcnt Z" of the current report (memcg OOMs only).
        self.last_memcg_usage: tuple[int, int, int] | None = None
        # The task whose allocation failed ("<comm> invoked oom-killer"), current report.
        self.last_trigger_comm: str | None = None
        # Path of the latest memory.oom.group kill ("Tasks in <path> are going to be killed").
        self.last_oom_group: str | None = None
        self._last_seq: int | None = None
        self.reset()

    def reset(self) -> None:
        """Forget any partial report (the ``last_*`` attributes are kept)."""
        self._summary = None
        self._summary_text = None
        self._task_in = None
        self._choice_prefix = None
        self._last_kill = None
        self._group = None
        self._stat = {}
        self._stat_path = ""
        self._in_stat = False
        self._kmem = None
        self._swap = None

    def feed(self, rec: KmsgRecord, ts_ns: int) -> list[KmsgOom]:
        """Consume one record; return the OOM victims it completes (usually none).

        ``ts_ns`` is the record's time on CLOCK_BOOTTIME, stamped on any event emitted.
        """
        if self._last_seq is not None and rec.seq != self._last_seq + 1:
            self.reset()
        self._last_seq = rec.seq
        msg = rec.message

        if self._in_stat:
            line = _STAT_LINE_RE.fullmatch(msg.rstrip())
            if line is not None:
                self._stat.setdefault(line.group("key"), int(line.group("value")))
                return []
            self._in_stat = False
        # Cheap substring tests first: almost every kernel message is unrelated to OOM.
        if "Killed process" in msg:
            killed = parse_killed_process_line(msg)
            if killed is not None:
                return self._on_killed(killed, rec, ts_ns)
        if msg.startswith(",") and self._summary_text is not None:
            # The summary is printed with pr_cont(); if another CPU printed in between, its
            # pieces become records of their own, each starting with ','.
            self._set_summary(self._summary_text + msg)
        elif "oom-kill:" in msg:
            summary = _OOM_KILL_RE.match(msg)
            if summary is not None:
                self._group = None  # a new summary starts a new kill
                self._set_summary(summary.group("body"))
        elif " invoked oom-killer:" in msg:
            invoked = _INVOKED_RE.match(msg)
            if invoked is not None:
                self.reset()
                self.last_trigger_comm = invoked.group("comm")
                self.last_memcg_usage = None
        elif msg.startswith("memory: usage "):
            self._on_usage(msg)
        elif msg.startswith(_STATS_FOR):
            self._on_stats_for(msg[len(_STATS_FOR) :].rstrip())
        elif msg.startswith("kmem: usage "):
            kmem = _KMEM_RE.match(msg)
            self._kmem = int(kmem.group("usage")) * 1024 if kmem else None
        elif msg.startswith("swap: usage "):
            swap = _SWAP_RE.match(msg)
            self._swap = int(swap.group("usage")) * 1024 if swap else None
        elif msg.startswith("Tasks in "):
            group = _GROUP_RE.fullmatch(msg.rstrip())
            if group is not None:
                self._on_group(group.group("path"), rec.ts_us)
        elif msg.startswith("Task in "):
            task_in = _TASK_IN_RE.fullmatch(msg.rstrip())
            if task_in is not None:
                self._task_in = _TaskIn(task_in.group("task"), task_in.group("limit"))
        elif "Kill process" in msg:
            choice = _KILL_CHOICE_RE.match(msg)
            if choice is not None:
                self._on_choice(choice.group("prefix") or "", _int(choice.group("pid")))
        elif "OOM victim" in msg:
            skip = _SKIP_RE.match(msg)
            if skip is not None:
                self._on_skip(skip.group("prefix") or "", _int(skip.group("pid")), rec.ts_us)
        return []

    # -- line handlers -------------------------------------------------------------------------

    def _set_summary(self, body: str) -> None:
        fields = parse_oom_kill_line("oom-kill:" + body) or {}
        self._summary = fields
        # Until the tail (",task=..,pid=..,uid=..") has arrived, later ','-records may extend it.
        self._summary_text = None if "pid" in fields else body

    def _on_usage(self, msg: str) -> None:
        m = _USAGE_RE.match(msg)
        if m is None:
            return
        usage, limit, failcnt = (_int(g) for g in m.group("usage", "limit", "failcnt"))
        if usage is not None and limit is not None and failcnt is not None:
            self.last_memcg_usage = (usage, limit, failcnt)

    def _on_stats_for(self, rest: str) -> None:
        # 6.x: "<path>:" then one record per "key value" line; before 4.19 (v1) the values
        # follow on the same line as "key:NKB" pairs.
        self._stat = {}
        legacy = _LEGACY_STATS_RE.fullmatch(rest)
        if legacy is not None:
            self._stat_path = legacy.group("path")
            for key, kb in _LEGACY_PAIR_RE.findall(legacy.group("pairs")):
                self._stat.setdefault(key, int(kb) * 1024)
            return
        self._stat_path = rest.removesuffix(":")
        self._in_stat = True

    def _on_choice(self, prefix: str, pid: int | None) -> None:
        # "Kill process" opens the kill of one OOM: any group kill before it is over, and a
        # "Task in" line that already belonged to an earlier choice is stale.
        self._group = None
        self._choice_prefix = prefix
        if self._task_in is not None:
            if self._task_in.bound:
                self._task_in = None
            else:
                self._task_in.bound = True
                self._task_in.choice_pid = pid

    def _on_group(self, path: str, ts_us: int) -> None:
        self.last_oom_group = path
        group = _Group(path=path, ctx=None, last_ts_us=ts_us)
        if self._last_kill is not None:
            group.ctx, first_pid = self._last_kill
            group.killed.add(first_pid)
        self._group = group

    def _on_skip(self, prefix: str, pid: int | None, ts_us: int) -> None:
        # The victim was already exiting, so nothing was killed.
        group = self._group
        if group is not None and self._is_member(group, prefix, ts_us):
            group.last_ts_us = ts_us  # a group member that was exiting anyway
            return
        # The header facts belong to this OOM and must not be given to the next bare
        # "Killed process" line; an oom.group kill that follows still belongs to it.
        ctx, _ = self._claim(prefix, pid)
        self._group = None
        self._last_kill = (ctx, -1)

    def _is_member(self, group: _Group, prefix: str, ts_us: int) -> bool:
        if ts_us - group.last_ts_us > self.GROUP_GAP_US:
            return False
        return group.ctx is None or prefix == group.ctx.prefix

    def _on_killed(self, killed: KilledProcess, rec: KmsgRecord, ts_ns: int) -> list[KmsgOom]:
        group = self._group
        if group is not None and self._is_member(group, killed.prefix, rec.ts_us):
            group.last_ts_us = rec.ts_us
            if killed.pid in group.killed:
                return []  # the first victim, printed again by the group loop
            group.killed.add(killed.pid)
            ctx = group.ctx or self._context(killed.prefix, "", "", False)
            return [self._event(killed, ctx, "", ts_ns)]
        self._group = None
        ctx, task_memcg = self._claim(killed.prefix, killed.pid)
        self._last_kill = (ctx, killed.pid)
        return [self._event(killed, ctx, task_memcg, ts_ns)]

    def _claim(self, prefix: str, pid: int | None) -> tuple[_KillContext, str]:
        """Take the unclaimed header facts for the kill of ``pid``; returns (context, task_memcg).

        Header facts are used by one kill only: a later bare ``Killed process`` line (header
        rate limited) must not inherit them.
        """
        constraint = oom_memcg = task_memcg = ""
        memcg_hint = False
        summary, task_in = self._summary, self._task_in
        self._summary = self._summary_text = None
        self._task_in = None
        stat, stat_path = self._memcg_stat(), self._stat_path
        self._stat, self._stat_path, self._kmem, self._swap = {}, "", None, None
        if summary is not None:
            constraint = summary.get("constraint", "")
            oom_memcg = summary.get("oom_memcg", "")
            summary_pid = _int(summary.get("pid"))
            if summary_pid is None or summary_pid == pid:
                task_memcg = summary.get("task_memcg", "")
        elif task_in is not None:
            # "Task in" is printed for memory cgroup OOMs only.
            memcg_hint = True
            oom_memcg = task_in.oom_memcg
            if task_in.choice_pid is None or task_in.choice_pid == pid:
                task_memcg = task_in.task_memcg
        ctx = self._context(prefix, constraint, oom_memcg, memcg_hint, stat, stat_path)
        return ctx, task_memcg

    def _memcg_stat(self) -> dict[str, int]:
        """The report's stat dump in v2 names: v1's dump has ``cache``/``rss`` and their
        ``total_`` twins, v2's has ``anon``/``file``."""
        if not self._stat:
            return {}
        v1 = "rss" in self._stat or "cache" in self._stat
        out = normalize_stat(self._stat, 1 if v1 else 2)
        if v1 and self._kmem is not None:
            out["kernel"] = self._kmem
        if not v1 and self._swap is not None:
            out["swap"] = self._swap
        return out

    def _context(
        self,
        prefix: str,
        constraint: str,
        oom_memcg: str,
        memcg_hint: bool,
        stat: dict[str, int] | None = None,
        stat_path: str = "",
    ) -> _KillContext:
        # Kernels before 5.x print the prefix on the "Kill process" line only.
        effective_prefix = prefix or self._choice_prefix or ""
        memcg = (
            memcg_hint
            or constraint == "CONSTRAINT_MEMCG"
            or bool(oom_memcg)  # oom_memcg= is printed only when a memcg was at its limit
            or effective_prefix.startswith(_MEMCG_PREFIX)
        )
        return _KillContext(
            constraint=constraint,
            oom_memcg=oom_memcg,
            memcg=memcg,
            prefix=prefix,
            stat=stat or {},
            stat_path=stat_path,
        )

    @staticmethod
    def _event(killed: KilledProcess, ctx: _KillContext, task_memcg: str, ts_ns: int) -> KmsgOom:
        return KmsgOom(
            ts=ts_ns,
            victim_pid=killed.pid,
            victim_comm=killed.comm,
            constraint=ctx.constraint,
            oom_memcg=ctx.oom_memcg,
            task_memcg=task_memcg,
            total_vm_kb=killed.total_vm_kb,
            anon_rss_kb=killed.anon_rss_kb,
            file_rss_kb=killed.file_rss_kb,
            shmem_rss_kb=killed.shmem_rss_kb,
            oom_score_adj=killed.oom_score_adj,
            memcg=ctx.memcg,
            memcg_stat=dict(ctx.stat),
            memcg_stat_path=ctx.stat_path,
        )
