"""What the harness asks of Linux itself: `prctl` (die with your parent, keep your memory to yourself),
every read of `/proc` (a process's CPU time, its environment, its open files), and waiting on a pipe by polling.

One place for both, since the harness, its fork server and every worker each use some of them, and
`/proc/<pid>/stat` is easy to misparse (the command name may hold spaces and parentheses). On a system
without `prctl` (not Linux) each call is a no-op that says so by returning False.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import time
from collections.abc import Iterator
from pathlib import Path

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


# Indices into `stat_fields` (proc(5) numbers fields from 1; the list starts at field 3, after the name).
_UTIME, _STIME = 11, 12  # fields 14 and 15: CPU time in user and in kernel mode, in clock ticks
_ENV_START, _ENV_END = 47, 48  # fields 50 and 51: where the environment block lies in the process's memory


def stat_fields(pid: int | str = "self") -> list[str]:
    """`/proc/<pid>/stat` from its third field on: cut at the last ')', so no command name can shift them."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_time_ms(pid: int) -> float:
    """User plus system CPU time of a process (all its threads), as the kernel accounts it; 0.0 when gone."""
    try:
        fields = stat_fields(pid)
        return (int(fields[_UTIME]) + int(fields[_STIME])) * 1000 / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def system_busy_ms() -> float | None:
    """CPU time every CPU of the machine spent on any work (not idle, not waiting on I/O) since boot, from
    `/proc/stat`'s first line; None when unreadable. Guest time is already inside user time."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) * 1000 / os.sysconf("SC_CLK_TCK")


def environment_block() -> tuple[int, int]:
    """Start and end address of this process's environment as exec'd (what `/proc/<pid>/environ` shows)."""
    fields = stat_fields()
    return int(fields[_ENV_START]), int(fields[_ENV_END])


def open_fds() -> list[int]:
    """This process's open file descriptors."""
    return [int(name) for name in os.listdir("/proc/self/fd")]


def environments() -> Iterator[tuple[int, bytes]]:
    """(pid, raw environment) of every other process this user may read."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:  # gone, or another user's
            continue
        yield int(entry.name), environ


def threads(pid: int | str = "self") -> list[int]:
    """The thread ids of `pid` (this process by default); empty when it is gone."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def exists(pid: int) -> bool:
    """Whether a process with this pid exists (any user's; a reused pid counts)."""
    return Path(f"/proc/{pid}").exists()


def poll_readable(fd: int, seconds: float) -> bool:
    """Whether `fd` became readable within `seconds`, found by polling (a core kept busy meanwhile): a process
    sleeping on a pipe takes tens of microseconds to wake, which lands inside a timed call's wall clock."""
    end = time.monotonic() + seconds
    while not select.select([fd], [], [], 0)[0]:
        if time.monotonic() >= end:
            return False
        os.sched_yield()  # a timed process waiting for this core gets it at once
    return True
