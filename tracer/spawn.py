"""Start the recorded command so that none of its life escapes the recorder.

The child is forked, then waits on a pipe until the recorder has put its pid in the kernel's
watched map; only then does it exec. (subprocess.Popen cannot do this: it returns only after
the exec, so a preexec_fn that waits for the parent would deadlock.)
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable

from tracer.errors import UsageError


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
        gate_r, self._gate_w = os.pipe()
        self._err_r, err_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # child: wait for the gate, then become the command
            try:
                os.close(self._gate_w)
                os.close(self._err_r)
                os.read(gate_r, 1)
                os.close(gate_r)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
                    signal.signal(sig, signal.SIG_DFL)
                if before_exec is not None:
                    before_exec()
                os.execv(exe, argv)
            except OSError as exc:
                os.write(err_w, str(exc.errno).encode())
            finally:
                os._exit(127)
        os.close(gate_r)
        os.close(err_w)
        self.pid = pid

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
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode
