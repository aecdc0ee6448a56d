"""tracer.sources.system.mount_fs: one mount(2) declaration for tracefs and bpffs. The agent in
the container image mounts both (neither is mounted there) and died with ctypes' TypeError when
the second caller re-declared the function differently. A target that does not exist makes the
call fail in the kernel (ENOENT as root, EPERM without), so this runs anywhere."""

from __future__ import annotations

import errno

from tracer.sources import system


def test_tracefs_then_bpffs_reach_the_kernel_and_return_its_errno() -> None:
    missing = "/nonexistent/whyrestart-mount-test"
    for fstype in ("tracefs", "bpf", "tracefs"):
        assert system.mount_fs(fstype, missing) in (errno.ENOENT, errno.EPERM)
