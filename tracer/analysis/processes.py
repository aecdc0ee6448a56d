"""The process and unit table: which processes exist, which unit (container, service, program
under a supervisor, recorded command) each belongs to, which is a unit's main process, and the
restarts that follow from main processes ending and starting, and the recent deaths in each
unit that a main process's exit may pass on. Pure: kept up to date from fork, exec and exit
events (``fork``, ``exec``, ``exit``: called by the analyzer's loop for most of any trace, so
they are written for speed) and from the runtimes' ``UnitInfo``.

A unit's *main process* is the first program started in a container's cgroup, else the first
process in the unit whose parent is outside it; when the main process exits and a new one
starts in the same unit, that is a restart.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable

import msgspec

from tracer.analysis import units
from tracer.analysis.evidence import MAX_PIDS, Evidence
from tracer.analysis.findings import Restart, Verdict
from tracer.analysis.senders import (
    IS_PLUMBING,
    PM2_TITLE,
    SELF_EXE,
    process_supervisor,
)
from tracer.analysis.units import CONTAINER_KINDS, UNSET, UnitName, unit_of_cgroup
from tracer.analysis.wording import carried_memory
from tracer.events import Exec, Exit, Fork

SECOND = 1_000_000_000
HELPER_NS = 2 * SECOND  # a systemd unit's main process this short-lived and clean is a helper
# the causes of main-process exits kept for the restarts that will name them: bounded, the
# oldest go first (an always-on agent sees a unit's main process end many thousands of times)
MAX_CAUSES = 65536
MAX_UNIT_DEATHS = 4096  # units whose recent deaths are remembered (cleared when full)
CARRIED_MIN = 16 << 20  # memory a cgroup holds with no process in it worth saying at a restart
RELATED_DEATHS_KEPT = 8  # deaths remembered per unit (the first of a cascade is the cause)


# an exit waiting to be judged: its time and pid (the order exits are judged in), the exit, its
# unit and whether it was the unit's main process (decided at the exit, before a successor ran)
Pending = tuple[int, int, Exit, UnitName | None, bool]


class Proc(msgspec.Struct, gc=False):
    """What the analysis knows of one process. A msgspec Struct (mutable, no GC tracking): one
    is made per fork, and its C constructor costs a sixth of a slots dataclass's."""

    pid: int
    comm: str = ""
    ppid: int = 0
    cgroup_id: int = 0
    start_ts: int = 0
    filename: str = ""
    # the unit it belongs to, once worked out (UNSET again at exec: a process becomes what it
    # runs); it lives and is evicted with the process
    unit: UnitName | None = UNSET


class ProcessTable:
    """Processes by pid (bounded: the least recently seen go first, counted in ``evicted``),
    their units, the units' main processes and the restarts linked between them."""

    def __init__(self, ev: Evidence) -> None:
        self.ev = ev  # (cgroup paths and the runtimes' names, to name units)
        self.procs: OrderedDict[int, Proc] = OrderedDict()
        self.evicted = 0
        self.first: dict[int, int] = {}  # container cgroup id -> its main process
        self.ended: dict[str, tuple[int, int]] = {}  # unit key -> (main pid, exit ts)
        # unit key -> (main pid, exit ts) of its last main process to end (kept past a
        # restart: the processes its end took down are judged after)
        self.main_exits: dict[str, tuple[int, int]] = {}
        # ts, unit, old pid, old exit ts, new pid, the unit's key, the new main's cgroup id
        self.links: list[tuple[int, str, int, int, int, str, int]] = []
        # (pid, exit ts) -> the cause of that exit's verdict: a restart names it (by pid
        # alone, a later process reusing the pid would relabel it)
        self.cause: OrderedDict[tuple[int, int], str] = OrderedDict()
        # the units a main process was seen in, (kind, key) -> its newest label: a recorded
        # command's label is its comm, which an exec changes ("sh (pid 7)" execs the server:
        # "llama-server (pid 7)"), and it is still the one unit
        self.mains: dict[tuple[str, str], str] = {}
        self.checks: set[int] = set()  # pids of exec health checks (ProbeSample.pid)
        self.cgroup_units: dict[int, UnitName | None] = {}  # cgroup id -> unit_of_cgroup
        # the cgroups among those that name their unit themselves (a container, a systemd
        # unit): every process in one belongs to it, which the analyzer's loop looks up inline
        self.named: dict[int, UnitName] = {}
        # unit key -> the last death by a signal of a process there that is not its main
        # process (its init may pass the death on as its own exit code: rules.exits.init_exit)
        self.deaths: dict[str, Verdict] = {}
        # unit key -> the last few such deaths, with each one's parent pid (a main process's
        # non-zero exit soon after may be their consequence: rules.exits.related_exit)
        self.related: dict[str, deque[tuple[Verdict, int]]] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def fork(self, ev: Fork) -> None:
        """A new process, even where its pid was used before; its parent was seen now."""
        procs = self.procs
        ppid = ev.parent_pid
        parent = procs.get(ppid)
        if parent is None:
            self.new_proc(Proc(ppid, ev.comm, 0, ev.cgroup_id))
        else:
            procs.move_to_end(ppid)
            if not parent.comm:
                parent.comm, parent.cgroup_id = ev.comm, ev.cgroup_id
            elif ev.comm != parent.comm and ev.comm.startswith(PM2_TITLE):
                # renamed since its exec (pm2's daemon sets its title after it starts): the
                # name its children are started under
                parent.comm = ev.comm
        child = ev.child_pid
        procs.pop(child, None)
        procs[child] = Proc(child, ev.comm, ppid, ev.cgroup_id, ev.ts)
        if len(procs) > MAX_PIDS:  # (new_proc, inlined)
            procs.popitem(last=False)
            self.evicted += 1

    def exec(self, ev: Exec) -> None:
        """A process starts being what it is (and which unit it belongs to) at exec."""
        procs = self.procs
        pid = ev.pid
        proc = procs.get(pid)
        if proc is None:
            proc = self.new_proc(Proc(pid, ev.comm, 0, ev.cgroup_id, ev.ts, ev.filename))
        else:
            procs.move_to_end(pid)
            proc.comm, proc.cgroup_id, proc.filename = ev.comm, ev.cgroup_id, ev.filename
            proc.unit = UNSET
            if not proc.start_ts:
                proc.start_ts = ev.ts
        if not IS_PLUMBING[ev.comm] and ev.filename != SELF_EXE:
            self.first.setdefault(ev.cgroup_id, pid)
            unit = proc.unit = (
                self.supervised(proc) or self.named.get(proc.cgroup_id) or self._by_cgroup(proc)
            )
            if unit is not None and self.is_main(pid, proc, unit):
                self.new_main(ev, unit)

    def exit(self, ev: Exit) -> Pending | None:
        """A process ended: the exit to judge, with its unit and whether it was the unit's
        main process, decided now, before a successor runs; None for a container runtime's own
        set-up process ending normally (not judged)."""
        pid = ev.pid
        proc = self.procs.get(pid)
        if proc is None:
            proc = self.new_proc(Proc(pid, ev.comm, ev.ppid, ev.cgroup_id, ev.start_ns))
        else:  # (not moved up the table: an ended process goes before the live ones)
            proc.comm, proc.cgroup_id = ev.comm, ev.cgroup_id
            # (the parent it was forked by: a reparented process's exit names its new parent,
            # systemd or a subreaper, and must not look like a main)
            if not proc.ppid:
                proc.ppid = ev.ppid
            if not proc.start_ts:
                proc.start_ts = ev.start_ns
        plumbing = IS_PLUMBING[ev.comm]
        if ev.status == 0 and plumbing:
            return None
        # (a cgroup that names its unit decides, even when the runtime named it after this
        # process started; but a program run by a supervisor stays its own unit inside it)
        unit = proc.unit
        if unit is None or unit.kind != "supervised":
            unit = self.named.get(proc.cgroup_id) or unit
        if unit is UNSET:
            unit = proc.unit = self.find_unit(proc)
        # (a runtime's setup process is never a unit's main process: a `docker exec` health
        # check caught in runc init when the container's init dies is killed with it, after
        # the main process, and is no run of the container)
        main = not plumbing and self.is_main(pid, proc, unit)
        # (a command tree is not restarted by anyone: no need to remember its end)
        if main and unit is not None and unit.kind != "command":
            self.main_exit(pid, ev.ts, proc.start_ts, ev.status, unit)
            if self.first.get(proc.cgroup_id) == pid:
                del self.first[proc.cgroup_id]  # the next program there is the new main
        return (ev.ts, pid, ev, unit, main)

    def note_death(self, key: str, v: Verdict, ppid: int) -> None:
        """A process of a unit, not its main process, died of a signal (``deaths``,
        ``related``): bounded by clearing, a unit that stays busy fills its entry again."""
        deaths, related = self.deaths, self.related
        if len(deaths) >= MAX_UNIT_DEATHS:
            deaths.clear()
        deaths[key] = v
        if len(related) >= MAX_UNIT_DEATHS:
            related.clear()
        related.setdefault(key, deque(maxlen=RELATED_DEATHS_KEPT)).append((v, ppid))

    def new_proc(self, p: Proc) -> Proc:
        """Add a process; when full, the least recently seen goes (a long-lived server that
        keeps forking must not be pushed out by its own short-lived children: the analyzer
        moves a process it sees again to the end)."""
        procs = self.procs
        procs[p.pid] = p
        if len(procs) > MAX_PIDS:
            procs.popitem(last=False)
            self.evicted += 1
        return p

    def ancestors(self, pid: int, ppid: int) -> frozenset[int]:
        """The process's parent and its ancestors in the recorded tree (by who forked whom, so
        a process reparented to a subreaper still names the one that started it), short of
        pid 1; at most 64."""
        proc = self.procs.get(pid)
        parent = proc.ppid if proc is not None and proc.ppid else ppid
        out: set[int] = set()
        while parent > 1 and parent not in out and len(out) < 64:
            out.add(parent)
            up = self.procs.get(parent)
            if up is None:
                break
            parent = up.ppid
        return frozenset(out)

    def exe_of(self, pid: int) -> str:
        """A process's executable as its exec event named it ("" when not seen)."""
        proc = self.procs.get(pid)
        return proc.filename if proc is not None else ""

    # -- units -------------------------------------------------------------------------------

    def unit(self, proc: Proc, depth: int = 0) -> UnitName | None:
        """``find_unit``, kept on the process until it execs."""
        unit = proc.unit
        if unit is UNSET:
            unit = proc.unit = self.find_unit(proc, depth)
        return unit

    def supervised(self, proc: Proc) -> UnitName | None:
        """The unit of a program run by a process supervisor (supervisord & co.), wherever it
        runs: restarted by the supervisor, it is its own unit, even inside a container whose
        PID 1 the supervisor is (s6-overlay, supervisord, runit, pm2 images: the program shares
        the container's cgroup)."""
        parent = self.procs.get(proc.ppid)  # (at every exec: a lookup and a set lookup)
        if parent is None or not proc.filename:
            return None
        name = process_supervisor(parent.comm)
        return None if name is None else units.supervised(name, parent.pid, proc.filename)

    def find_unit(self, proc: Proc, depth: int = 0) -> UnitName | None:
        """A program under a process supervisor; else a container or systemd unit by cgroup;
        else whatever its parent belongs to; at the top, the recorded command itself."""
        return self.supervised(proc) or self._by_cgroup(proc, depth)

    def _by_cgroup(self, proc: Proc, depth: int = 0) -> UnitName | None:
        """``find_unit`` past the supervisor: the cgroup's unit, else the parent's."""
        unit = self.cgroup_units.get(proc.cgroup_id, UNSET)
        if unit is UNSET:
            info = self.ev.units.get(proc.cgroup_id)
            unit = self.cgroup_units[proc.cgroup_id] = (
                units.from_info(info.kind, info.unit_id, info.name, info.pod)
                if info
                else unit_of_cgroup(self.ev.path(proc.cgroup_id))
            )
            if unit is not None and unit.kind != "cgroup":
                self.named[proc.cgroup_id] = unit
        if unit is None or unit.kind == "cgroup":
            parent = self.procs.get(proc.ppid)
            if parent is not None and parent.pid != proc.pid and depth < 64:
                unit = self.unit(parent, depth + 1)
            else:
                pid = proc.pid
                unit = UnitName("command", str(pid), f"{proc.comm or '?'} (pid {pid})")
        return unit

    def cgroup_unit(self, cgroup_id: int, path: str | None = None) -> UnitName | None:
        """What a cgroup itself names: its runtime's unit, a container or a service by its
        path, else the path (kind "cgroup"); ``path`` when the cgroup was never described."""
        unit = self.cgroup_units.get(cgroup_id, UNSET)
        if unit is UNSET:
            info = self.ev.units.get(cgroup_id)
            if info is not None:
                return units.from_info(info.kind, info.unit_id, info.name, info.pod)
            return unit_of_cgroup(self.ev.path(cgroup_id) or path)
        return unit

    def named_by(self, cgroup_id: int) -> None:
        """A cgroup's path or runtime name was learnt or changed: name its unit again, now
        (the processes already in it, named before, belong to it from here on)."""
        self.cgroup_units.pop(cgroup_id, None)
        self.named.pop(cgroup_id, None)
        info = self.ev.units.get(cgroup_id)
        unit = (
            units.from_info(info.kind, info.unit_id, info.name, info.pod)
            if info
            else unit_of_cgroup(self.ev.path(cgroup_id))
        )
        self.cgroup_units[cgroup_id] = unit
        if unit is not None and unit.kind != "cgroup":
            self.named[cgroup_id] = unit

    def forget_cgroups(self, ids: Iterable[int]) -> None:
        """Drop the units worked out for cgroups that are gone (``Evidence.forget_cgroups``)."""
        for cid in ids:
            self.cgroup_units.pop(cid, None)
            self.named.pop(cid, None)
            self.first.pop(cid, None)

    def is_main(self, pid: int, proc: Proc, unit: UnitName | None) -> bool:
        if unit is None:
            return True
        if unit.kind in CONTAINER_KINDS and proc.cgroup_id in self.first:
            # a container's main process is the first program started in its cgroup; later
            # ones came in through `exec` (health checks, debugging shells)
            return self.first[proc.cgroup_id] == pid
        procs = self.procs
        parent = procs.get(proc.ppid)
        if parent is None or parent is proc:  # (pid 0: a pid no runtime kept, post-mortem)
            return True
        if IS_PLUMBING[parent.comm]:
            # look through the runtime's setup processes to whoever started the container
            seen = {pid}
            while parent is not None and IS_PLUMBING[parent.comm] and (parent.pid not in seen):
                seen.add(parent.pid)
                parent = procs.get(parent.ppid)
            if parent is None:
                return True
        theirs = parent.unit  # (unit(), inlined: hot)
        if theirs is unit:
            return False
        if theirs is UNSET:
            theirs = parent.unit = self.find_unit(parent)
        return theirs != unit

    # -- restarts ----------------------------------------------------------------------------

    def new_main(self, ev: Exec, unit: UnitName) -> None:
        """A unit's new main process started: a restart, when the last one ended."""
        pid = ev.pid
        self.mains[unit.kind, unit.key] = unit.label
        ended = self.ended.pop(unit.key, None)
        if ended is not None and ended[0] != pid:
            old_pid, old_ts = ended
            self.links.append((ev.ts, unit.label, old_pid, old_ts, pid, unit.key, ev.cgroup_id))

    def main_exit(self, pid: int, ts: int, start: int, status: int, unit: UnitName) -> None:
        """A unit's main process ended (its next main process will be a restart).

        systemd runs ExecStartPre/ExecStartPost/ExecStopPost helpers in the service's cgroup
        as children of systemd, like the main process: one that ends cleanly within
        ``HELPER_NS`` of its start was a helper, not a run of the service. A link to it is
        taken back and the unit's last real main process stays the one a restart follows."""
        self.mains[unit.kind, unit.key] = unit.label
        if unit.kind == "systemd" and status == 0 and ts - start < HELPER_NS:
            links = self.links
            if links and links[-1][4] == pid and links[-1][5] == unit.key:
                _, _, old_pid, old_ts, _, _, _ = links.pop()
                self.ended[unit.key] = (old_pid, old_ts)
            return
        self.ended[unit.key] = self.main_exits[unit.key] = (pid, ts)

    def sole_unit(self) -> str | None:
        """The one unit a main process was seen in, when there is exactly one."""
        if len(self.mains) == 1:
            return next(iter(self.mains.values()))
        return None

    def restarts(self) -> list[Restart]:
        """Main-process exits followed by a new main process in the same unit."""
        return [self._restart(link, "pending") for link in self.links]

    def take_restarts(self, unjudged_before: int | None) -> list[Restart]:
        """For an always-on consumer: the restarts linked so far whose old main process's exit
        has been judged, in order, taken out of the table (each is handed on once, with its
        cause, and none is kept). A link waits for its exit's verdict (judged SETTLE_NS after
        the exit, and the new main process often starts before that); one whose exit, older
        than ``unjudged_before``, has still not been judged never will be, and goes as
        "unknown". ``None``: take every link (the stream has ended, every exit is judged)."""
        links, cause = self.links, self.cause
        n = 0
        for link in links:
            judged = (link[2], link[3]) in cause
            if not judged and unjudged_before is not None and link[3] >= unjudged_before:
                break
            n += 1
        out = [self._restart(link, "unknown") for link in links[:n]]
        del links[:n]
        return out

    def note_cause(self, pid: int, ts: int, cause: str) -> None:
        """The verdict of a restartable exit, for the restart that will name it."""
        causes = self.cause
        causes[(pid, ts)] = cause
        if len(causes) > MAX_CAUSES:
            causes.popitem(last=False)

    def _restart(self, link: tuple[int, str, int, int, int, str, int], unjudged: str) -> Restart:
        ts, unit, old, old_ts, new, _, cgroup_id = link
        carried = self._carried(cgroup_id, old_ts, ts)
        return Restart(
            ts=ts,
            unit=unit,
            old_pid=old,
            new_pid=new,
            downtime_ns=ts - old_ts,
            cause=self.cause.get((old, old_ts), unjudged),
            carried_bytes=carried[0] if carried else None,
            carried=carried[1] if carried else "",
        )

    def _carried(self, cgroup_id: int, ended: int, started: int) -> tuple[int, str] | None:
        """What the unit's cgroup still held between the old run's end and the new run's
        start: the last sample taken in between (none: nothing is said; a sample after the
        start would count the new run's own memory). Said when it is CARRIED_MIN or more, with
        its tmpfs and page-cache parts (wording.carried_memory)."""
        samples = self.ev.samples_between(cgroup_id, ended + 1, started)
        last = samples[-1] if samples else None
        if last is None or last.usage_bytes is None or last.usage_bytes < CARRIED_MIN:
            return None
        st = last.stat
        shmem = st.get("shmem")
        cache = max(0, st.get("file", 0) - (shmem or 0)) if "file" in st else None
        return last.usage_bytes, carried_memory(last.path, last.usage_bytes, shmem, cache)

    def restart_counts(self) -> list[tuple[str, int, int | None, str]]:
        """Per unit: (unit, restarts whyrestart linked, restarts the supervisor counted over
        the same recording, its name). A mismatch is worth a look: a restart we could not see,
        or one the supervisor does not count."""
        restarts = self.restarts()
        ours: dict[str, int] = {}
        for r in restarts:
            ours[r.unit] = ours.get(r.unit, 0) + 1
        runtime = self.ev.runtime
        out = []
        for unit in sorted(set(ours) | set(runtime)):
            samples = [x for x in runtime.get(unit, []) if x.restart_count is not None]
            theirs = None
            source = ""
            if samples:
                first, lastx = samples[0], samples[-1]
                assert first.restart_count is not None and lastx.restart_count is not None
                source = lastx.source
                # the supervisor's count is known from its first reading on; restarts we
                # linked before that reading it may or may not have counted: unknown then
                before = sum(1 for r in restarts if r.unit == unit and r.ts <= first.ts)
                if not before:
                    theirs = lastx.restart_count - first.restart_count
            out.append((unit, ours.get(unit, 0), theirs, source))
        return out
