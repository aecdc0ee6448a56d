"""The first-call hold: processes the kernel stopped as they mapped, to run it, a libcuda file
nobody had probed (``LD_LIBRARY_PATH``, a conda environment, a container's compat directory)
are resumed once that file is probed, so their first driver call is caught however soon it
comes.

``Holds`` starts the guard process (``tracer.gpu.holdguard``: it resumes what is held if the
recorder dies, and ends holds that last longer than its bound) before the kernel may hold
anyone, beats the heartbeat without which gpu.bpf.c takes no hold, resumes what a dead
recorder's holds left stopped, and counts what holding cost."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from typing import Any

from tracer.bpf.gpuhooks import AttachedLibrary, GpuHooks
from tracer.clock import boottime_ns
from tracer.errors import WhyrestartError
from tracer.gpu import holdguard
from tracer.gpu.libraries import Libraries
from tracer.gpu.nvml import Clock
from tracer.sources import system

# How often the loop tells the kernel it still resumes holds (gpu.bpf.c takes none once the
# heartbeat is 2 s old): a bpf(2) call per 250 ms, not one per loop.
HEARTBEAT_NS = 250_000_000
# The guard starts in ~30 ms (python -I -S, the standard library only); a loaded host may take
# much longer, and a recorder without holds still records.
GUARD_READY_S = 5.0
NOT_HELD = "processes that load libcuda from an unprobed path are not held"


class Holds:
    """See the module docstring. ``start`` arms holding; ``close`` disarms it, resumes what is
    left and keeps the summary (``final``)."""

    def __init__(
        self,
        hooks: GpuHooks,
        libraries: Libraries,
        proc: str,
        clock: Clock,
        warnings: list[str],
    ) -> None:
        self.hooks = hooks
        self.libraries = libraries
        self.proc = proc
        self.clock = clock
        self.warnings = warnings  # (the GPU side's: they go into the trace header)
        self.error: str | None = None
        self.resumed = 0
        self.max_ns = 0
        self.total_ns = 0
        self.leftovers_resumed = 0  # processes a dead recorder's holds left stopped
        self.final: dict[str, Any] | None = None  # summary() at close
        self._guard: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None
        self._beat_ns = 0
        self._pid_ns_problem = system.pid_namespace_problem()

    @property
    def armed(self) -> bool:
        """Whether the kernel may hold processes for this recorder (the guard is up)."""
        return self._pipe is not None

    def sweep(self) -> None:
        """Resume what the holds of a recorder that died with its guard left stopped (at start,
        then every second: a recorder restarted at once finds them younger than the bound)."""
        if not self.hooks.peers_shared or self._pid_ns_problem:
            return
        self.leftovers_resumed += len(self.hooks.sweep_leftovers(boottime_ns(), self.proc))

    def start(self) -> None:
        """Start the guard, then let the kernel hold: never a hold nobody can end."""
        if self._pid_ns_problem:
            # our SIGCONT would name another process: a hold here would be for good
            self.error = f"{self._pid_ns_problem} (fix: {system.PID_NS_FIX})"
            self.warnings.append(f"{NOT_HELD}: {self.error}")
            return
        hooks = self.hooks
        map_fd, peers_fd = hooks.held_map.fd, hooks.peers.fd
        r, w = os.pipe()  # both ends close on exec: only the guard gets the read end
        ready_r, ready_w = os.pipe()  # the guard writes a byte once it is ready
        try:
            self._guard = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    holdguard.__file__,
                    str(map_fd),
                    str(r),
                    str(peers_fd),
                    str(hooks.config.holder),
                ],
                pass_fds=(map_fd, r, peers_fd, ready_w),
                env={**os.environ, holdguard.READY_FD_ENV: str(ready_w)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(w)
            os.close(ready_r)
            self.error = f"starting the hold guard: {exc.strerror}"
            self.warnings.append(
                f"{NOT_HELD}: {self.error}; their first driver calls may be missed"
            )
            return
        finally:
            os.close(r)
            os.close(ready_w)
        self._pipe = w
        # no hold before the guard outlives what a unit stop or an OOM group kill sends
        ready, _, _ = select.select([ready_r], [], [], GUARD_READY_S)
        started = bool(ready) and os.read(ready_r, 1) == b"1"
        os.close(ready_r)
        if not started:
            self._fail(f"the hold guard did not start within {GUARD_READY_S:g} s")
            return
        if not system.has_capability(system.CAP_SYS_RESOURCE):
            # the guard cannot set oom_score_adj -1000 (tracer/gpu/holdguard.py)
            self.warnings.append(
                "the hold guard is not spared by OOM kills (no CAP_SYS_RESOURCE): an OOM of "
                "this recorder's cgroup under memory.oom.group kills it too, and what it held "
                "is resumed only by the next recorder, about 5 s later "
                "(fix: grant CAP_SYS_RESOURCE)"
            )
        errors = hooks.enable_holds()
        if errors and len(errors) == 3:
            self._fail("; ".join(errors))

    def _fail(self, error: str) -> None:
        self.error = error
        self.stop()
        self.warnings.append(f"{NOT_HELD} ({error}): their first driver calls may be missed")

    def resume(self) -> list[tuple[int, str, AttachedLibrary]]:
        """Probe the file each held process opened, then resume it (SIGCONT, then forget the
        hold: the guard resumes whatever is left if we die in between). Returns (pid, the file
        as it opened it, what probing it gave) per process resumed."""
        if self._guard is not None and self._guard.poll() is not None:
            self._guard = None  # the guard's parent exited (it forks the guard): reaped
        if self._pipe is None:
            return []
        hooks = self.hooks
        out: list[tuple[int, str, AttachedLibrary]] = []
        beat = boottime_ns()
        if beat - self._beat_ns >= HEARTBEAT_NS:
            with contextlib.suppress(WhyrestartError):
                hooks.heartbeat()
                self._beat_ns = beat
        try:
            held = hooks.held()
        except WhyrestartError:
            return out
        for pid, h in held:
            fd_path = f"{self.proc}/{pid}/fd/{h.fd}"
            try:
                shown = os.readlink(fd_path)
            except OSError:
                shown = fd_path
            res = self.libraries.once(fd_path, shown)
            if res.opened:
                # no more holds for this file (not when it could not even be looked at: the
                # process was gone, and the next one to open it must be held again)
                with contextlib.suppress(WhyrestartError):
                    hooks.mark_probed(h.file.dev, h.file.ino)
            hooks.resume(pid, self.clock())
            took = max(0, self.clock() - h.ts_ns)
            self.resumed += 1
            self.total_ns += took
            self.max_ns = max(self.max_ns, took)
            out.append((pid, shown, res))
        return out

    def summary(self) -> dict[str, Any]:
        """What holding cost and missed, for the trace footer."""
        taken = refused = stale = traced = 0
        with contextlib.suppress(WhyrestartError):
            taken, refused, stale, traced = self.hooks.hold_counts_now()
        return {
            "taken": taken,
            "not_taken": refused,
            # loaders not held: this recorder's loop had not beaten for 2 s; or ptraced
            "spared_stale": stale,
            "spared_traced": traced,
            "leftovers_resumed": self.leftovers_resumed,
            "resumed_by_recorder": self.resumed,
            "max_ms": round(self.max_ns / 1e6, 3),
            "mean_ms": round(self.total_ns / 1e6 / self.resumed, 3) if self.resumed else 0.0,
        }

    def close(self) -> list[tuple[int, str, AttachedLibrary]]:
        """Take no more holds, resume what is held, keep the summary; stop the guard. Returns
        what ``resume`` did last."""
        last: list[tuple[int, str, AttachedLibrary]] = []
        if self._pipe is not None:
            with contextlib.suppress(WhyrestartError):
                self.hooks.disable_holds()
                last = self.resume()
            summary = self.final = self.summary()
            if summary["not_taken"]:
                self.warnings.append(
                    f"{summary['not_taken']} processes loaded an unprobed libcuda when they "
                    "could not be held: their first driver calls may have been missed"
                )
        self.stop()
        return last

    def stop(self) -> None:
        if self._pipe is not None:
            os.close(self._pipe)  # end of file: the guard resumes what is left, exits
            self._pipe = None
        if self._guard is not None:
            # the process started is the guard's parent, which exited as soon as it forked the
            # guard; the guard itself looks again for a second (a hold racing the close) and
            # nobody needs to wait for that
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._guard.wait(timeout=5)
            self._guard = None
