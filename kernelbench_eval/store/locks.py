"""The one way the harness takes a file lock: bounded, in a place it owns, never fatal to the run.

Every flock (a build directory, a baseline being measured, the baselines file) goes through `hold`.
Why: a lock file sits where a candidate, as the same user, can reach it. A squatter holding a lock
forever, or a folder put where the lock file should be, must cost at most a bounded wait and a
`LockError` the caller turns into one candidate's verdict, never a hung or dead run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

WAIT_SECONDS = float(os.environ.get("KBEVAL_LOCK_WAIT", 120))
POLL_SECONDS = 0.05


class LockError(OSError):
    """The lock could not be had within the bounded wait, or its file could not be opened."""


@contextlib.contextmanager
def hold(path: Path, wait: float | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `path`, waiting at most `wait` seconds (default WAIT_SECONDS)."""
    fd = _open(path)
    wait = WAIT_SECONDS if wait is None else wait
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockError(errno.ETIMEDOUT, f"{path}: lock still held after {wait:.0f} s") from None
                time.sleep(POLL_SECONDS)
        yield
    finally:
        os.close(fd)


def _open(path: Path) -> int:
    """The lock file's fd; a folder, link or other non-file in its place is moved aside once, then retried."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(2):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if attempt == 0 and exc.errno in (errno.EISDIR, errno.ELOOP, errno.ENXIO, errno.EACCES):
                _move_aside(path)
                continue
            raise LockError(exc.errno or errno.EIO, f"{path}: cannot open lock file ({exc.strerror})") from exc
        if os.fstat(fd).st_nlink == 1:
            return fd
        os.close(fd)  # hard-linked to some other file: locking it would lock that file too
        _move_aside(path)
    raise LockError(errno.EIO, f"{path}: lock file keeps being replaced")


def _move_aside(path: Path) -> None:
    aside = path.with_name(f".{path.name}.moved-{secrets.token_hex(4)}")
    with contextlib.suppress(OSError):
        os.replace(path, aside)
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.unlink(missing_ok=True)
