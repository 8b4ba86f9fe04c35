"""The Linux process controls the harness leans on: die with your parent, keep your memory to yourself.

One place for `prctl`, since the harness, its fork server and every worker each set some of these; on a
system without it (not Linux) each call is a no-op that says so by returning False.
"""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4


def prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> bool:
    """Have the kernel send `sig` when the thread that started this process exits, even by SIGKILL."""
    return prctl(PR_SET_PDEATHSIG, int(sig))


def keep_memory_private(private: bool = True) -> bool:
    """Non-dumpable: other processes of the same non-root user, candidates included, can no longer read or
    write this process's memory through /proc/<pid>/mem or map_files (where expected outputs live)."""
    return prctl(PR_SET_DUMPABLE, 0 if private else 1)
