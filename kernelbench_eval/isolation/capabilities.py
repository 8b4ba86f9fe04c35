"""Dropping every capability for good: root without capabilities is an ordinary user to the kernel.

Why: a candidate runs as root on our machines, and root's capabilities would let it read any process's
memory (CAP_SYS_PTRACE: the checker's expected outputs, whatever `PR_SET_DUMPABLE` says), change any
process's scheduling (CAP_SYS_NICE), or make namespaces and mounts. Without them, it cannot read or
re-schedule a process that holds more capabilities than it does (the checker, the harness, the fork
server), nor a non-dumpable one. The bounding set is emptied and the securebits locked so that no later
`execve` (of a setuid binary, or of anything as uid 0) gives any back.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

_PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
_SECUREBITS_LOCKED_DOWN = 0xEF  # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS off, NO_CAP_AMBIENT_RAISE, each locked
_CAP_V3 = 0x20080522
_libc = ctypes.CDLL(None, use_errno=True)


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def held() -> bool:
    """Whether this thread has any capability it could use or regain (root's, typically)."""
    return bool(_field("CapPrm") or _field("CapBnd"))


def drop_all() -> None:
    """Every capability gone from every set of this thread (and what it starts); OSError if any is left."""
    if held():
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        _check(_prctl(_PR_SET_SECUREBITS, _SECUREBITS_LOCKED_DOWN), "securebits")
        for cap in range(last + 1):
            _check(_prctl(_PR_CAPBSET_DROP, cap), "capbset_drop")
        _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)  # absent before Linux 4.3: nothing to clear then
        _check(_libc.capset(ctypes.byref(_Header(_CAP_V3, 0)), (_Data * 2)()), "capset")
    left = [name for name in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb") if _field(name)]
    if left:
        raise OSError(f"capabilities left: {', '.join(left)}")


def _field(name: str) -> int:
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1], 16)
    return 0


def _prctl(option: int, arg2: int) -> int:
    return _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0))


def _check(result: int, what: str) -> None:
    if result != 0:
        import os

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
