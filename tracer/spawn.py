"""Start the recorded command so that none of its life escapes the recorder, and end it by one
policy when the recording ends first.

The child is forked, then waits on a pipe until the recorder has put its pid in the kernel's
watched map; only then does it exec. (subprocess.Popen cannot do this: it returns only after
the exec, so a preexec_fn that waits for the parent would deadlock.)

The lifecycle policy (record, tail and repro alike; README "Commands the tool starts"):

* The command runs in its own process group. When the recorder owns the terminal, the command's
  group is made the terminal's foreground group, as a shell does: Ctrl-C reaches the command
  once (not the command and the recorder both, which would deliver it twice), and the recording
  ends when the command does.
* When the recording ends before the command (``--duration``, or SIGINT/SIGTERM/SIGHUP sent to
  the recorder), the command's process group gets that signal (SIGTERM for ``--duration``),
  then `STOP_GRACE_S` for the command to exit; after that, or at a second signal to the
  recorder, SIGKILL to the group. The
  recording goes on meanwhile, so the command's end is in the trace.
* If the recorder itself dies (even by SIGKILL), the kernel sends the command SIGKILL
  (PR_SET_PDEATHSIG).
* The tool exits with the command's status as a shell reports it (128+N when signal N ended
  it); without a command, 128+N when signal N stopped the recording, else 0.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
from collections.abc import Callable

from tracer.errors import UsageError

STOP_GRACE_S = 5.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def shell_status(returncode: int) -> int:
    """A `waitstatus_to_exitcode` value (negative: killed by that signal) as a shell reports
    it: the exit code, or 128+N for signal N."""
    return returncode if returncode >= 0 else 128 - returncode


def _terminal_fd() -> int | None:
    """stdin when it is the terminal whose foreground process group is ours, else None."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _set_foreground(fd: int, pgrp: int) -> None:
    # tcsetpgrp from a background group raises SIGTTOU; ignored for the call, as shells do
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, pgrp)
    finally:
        signal.signal(signal.SIGTTOU, old)


def _die_with_parent(parent: int) -> None:
    """In the child: SIGKILL when the recorder dies (PR_SET_PDEATHSIG), so that not even a
    recorder killed with SIGKILL leaves the command running unwatched. (The signal comes when
    the forking thread ends; the recorder ends the command before its run returns.)"""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the prctl
        os._exit(128 + signal.SIGKILL)


class GatedChild:
    def __init__(self, argv: list[str], before_exec: Callable[[], None] | None = None) -> None:
        if not argv:
            raise UsageError("empty command")
        exe = argv[0] if "/" in argv[0] else shutil.which(argv[0])
        if exe is None or not os.access(exe, os.X_OK):
            raise UsageError(
                f"cannot run {argv[0]}: command not found or not executable",
                "check the command and its PATH",
            )
        self.argv = argv
        self.returncode: int | None = None
        self.stop_signal: int | None = None  # what the recorder sent it to end it
        self.killed = False  # SIGKILL sent after the grace period
        self._kill_at: float | None = None
        self._tty = _terminal_fd()
        parent = os.getpid()
        gate_r, self._gate_w = os.pipe()
        self._err_r, err_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # child: wait for the gate, then become the command
            try:
                os.close(self._gate_w)
                os.close(self._err_r)
                os.setpgid(0, 0)
                os.read(gate_r, 1)
                os.close(gate_r)
                _die_with_parent(parent)
                for sig in (*STOP_SIGNALS, signal.SIGPIPE, signal.SIGTTOU):
                    signal.signal(sig, signal.SIG_DFL)
                if before_exec is not None:
                    before_exec()
                os.execv(exe, argv)
            except OSError as exc:
                os.write(err_w, str(exc.errno).encode())
            finally:
                os._exit(127)
        # both sides set the group, so it is set whichever runs first
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        os.close(gate_r)
        os.close(err_w)
        self.pid = pid
        if self._tty is not None:
            _set_foreground(self._tty, pid)

    def release(self) -> None:
        """Let the child exec; raise UsageError if the exec failed."""
        os.write(self._gate_w, b"x")
        os.close(self._gate_w)
        err = os.read(self._err_r, 32)  # EOF (b"") once exec succeeded: the pipe is CLOEXEC
        os.close(self._err_r)
        if err:
            self.wait()
            code = int(err)
            raise UsageError(
                f"cannot run {self.argv[0]}: {os.strerror(code)}",
                "check the command and its permissions",
            )

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._reaped(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self._reaped(status)
        assert self.returncode is not None
        return self.returncode

    def _reaped(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)
        self.give_back_terminal()

    def give_back_terminal(self) -> None:
        if self._tty is not None:
            _set_foreground(self._tty, os.getpgrp())
            self._tty = None

    def end(self, sig: int, now: float, *, at_once: bool = False) -> bool:
        """Apply the stop policy at monotonic time ``now``; True while the command still runs.

        The first call sends ``sig``; once `STOP_GRACE_S` has passed (or with ``at_once``: a
        second signal to the recorder), SIGKILL."""
        if self.poll() is not None:
            return False
        if self.stop_signal is None:
            self.stop_signal = sig
            self._kill_at = now + STOP_GRACE_S
            self._send(sig)
        if not self.killed and (at_once or (self._kill_at is not None and now >= self._kill_at)):
            self.killed = True
            self._send(signal.SIGKILL)
        return self.poll() is None

    def _send(self, sig: int) -> None:
        # to its process group, as a terminal sends Ctrl-C: helpers it started end with it
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:  # the group is not (only) ours any more: the command alone
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    @property
    def status(self) -> int | None:
        """The command's exit status as a shell reports it, once it has ended."""
        return None if self.returncode is None else shell_status(self.returncode)
