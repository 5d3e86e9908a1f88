"""One run at a time in a run dir: an exclusive ``flock`` on ``<run dir>/.lock``, held while the run trains.

Two runs started on one dir would both write its checkpoint, metrics and config (one's results lost, or
a ``config.yaml`` of one seed next to the other's checkpoint), so the second stops at once, naming the
holder. ``flock`` rather than a lock file's mere existence: the kernel releases it when the holder's process
ends however it ends (SIGKILL; a SLURM requeue starts a new process), so a stale ``.lock`` never blocks the
resume; the file then only holds the last holder's pid. The lock belongs to an open file
description, not to a process, so two jobs of one sweep running as threads of one process exclude each
other too.
"""

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = ".lock"


class RunDirBusy(RuntimeError):
    """Another run holds the run dir's lock; the message names the dir and the holder's pid and host."""


@contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock within the ``with`` block (``run_dir`` must exist).

    Raises:
        RunDirBusy: another run holds it (a living process: a dead one's lock is gone).
        OSError: the lock file cannot be created (the message names it: a read-only dir).
    """
    path = run_dir / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown pid (it is starting)"
            raise RunDirBusy(
                f"run dir {run_dir} is in use by another run ({holder}); wait for it to end, "
                "or give this run another hydra.run.dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
