"""A worker's two pipes as the harness reads them: its replies, one whole line at a time under a deadline, and its
output, copied to its log up to a cap.

Apart from `process` (which decides what to ask a worker and what its silence means) because reading a pipe is
the same whatever was asked: buffering partial lines, polling before sleeping, and never letting a chatty
candidate fill the disk.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from pathlib import Path

from kernelbench_eval.isolation import linux

LOG_CAP_BYTES = int(os.environ.get("KBEVAL_LOG_CAP", 1 << 20))  # of one worker's output; the rest is dropped


class ReplyPipe:
    """The read end of a worker's reply pipe: lines as the worker wrote them, whatever the pipe's chunks."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""

    def line(self, timeout: float, poll: float, waiting: Callable[[], None]) -> bytes | None:
        """The next line (without its newline), or None once `timeout` s passed without one. `poll`: seconds to
        wait by polling before sleeping (a timed call, where waking up is part of its wall); `waiting` runs at
        least once a second while none has come. EOFError when the worker closed its end first."""
        deadline = time.monotonic() + timeout
        if poll and b"\n" not in self._buffer:
            linux.poll_readable(self.fd, min(poll, timeout))
        while b"\n" not in self._buffer:
            waiting()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def copy_capped(stream: object, log_path: Path) -> None:
    """Copy the worker's output to its log, up to LOG_CAP_BYTES; drain (and drop) the rest."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(log_path, "ab") as log:
        for chunk in iter(lambda: stream.read1(1 << 16), b""):  # type: ignore[attr-defined]
            if written < LOG_CAP_BYTES:
                part = chunk[: LOG_CAP_BYTES - written]
                log.write(part)
                log.flush()
                written += len(part)
                if written >= LOG_CAP_BYTES:
                    log.write(f"\n[kbeval: log capped at {LOG_CAP_BYTES} bytes; the rest was dropped]\n".encode())
                    log.flush()
