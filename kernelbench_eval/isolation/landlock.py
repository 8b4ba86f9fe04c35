"""Landlock through ctypes: a process restricts itself (and all it starts) to writing where it is told.

Why Landlock: it needs no privilege, no helper binary and no extra process, and a forked worker applies it
to itself in microseconds before any candidate code runs. What it gives, by ABI version (probed, never
assumed): writes only beneath the allowed folders (1; refer and truncate from 2 and 3), ptrace and
/proc/<pid>/mem of processes outside its domain refused (1), TCP bind and connect refused (4), signals
and abstract unix sockets to processes outside its domain refused (6), and every thread restricted at
once (8; before that only the calling thread and the threads it starts afterwards).

Reads and execution are not restricted (a candidate needs Python, torch, compilers and its own build),
nor are device ioctls (CUDA needs them: IOCTL_DEV is left unhandled).
"""

from __future__ import annotations

import ctypes
import os
import stat
from dataclasses import dataclass
from pathlib import Path

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same number on every architecture
_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_TSYNC = 1 << 3  # landlock_restrict_self flag, ABI 8

WRITE_FILE, REMOVE_DIR, REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = (1 << n for n in range(6, 13))
REFER, TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

_WRITES = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO
           | MAKE_BLOCK | MAKE_SYM)
_FILE_RIGHTS = WRITE_FILE | TRUNCATE  # all a rule on a file (not a folder) may grant of the above


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args: object) -> int:
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is absent or disabled."""
    try:
        return _syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION))
    except OSError:
        return 0


@dataclass
class Restricted:
    """What a `restrict` call put in force."""

    abi: int
    fs: bool = False  # writes confined to the allowed paths
    net: bool = False  # TCP bind and connect refused
    scopes: bool = False  # signals and abstract unix sockets confined to the domain
    all_threads: bool = False  # applied to every thread of the process (else: this one and its future ones)


def restrict(writable: list[Path], device_files: list[Path], threads: int = 1) -> Restricted:
    """Confine this thread (every thread at ABI 8) to writing beneath `writable` and into `device_files`.

    Needs no_new_privs (or CAP_SYS_ADMIN). Raises OSError when the kernel refuses; paths that do not
    exist are skipped (a rule needs an open file). `threads` > 1 asks for every thread (ABI 8).
    """
    version = abi()
    if version < 1:
        raise OSError("Landlock is not available (kernel without it, or disabled at boot)")
    fs = _WRITES | (REFER if version >= 2 else 0) | (TRUNCATE if version >= 3 else 0)
    attr = _RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP if version >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL if version >= 6 else 0)
    size = ctypes.sizeof(attr) if version >= 6 else (16 if version >= 4 else 8)  # older kernels refuse more
    ruleset = _syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        for path in writable:
            _allow(ruleset, path, fs)
        for path in device_files:
            _allow(ruleset, path, fs & _FILE_RIGHTS)
        flags = _TSYNC if threads > 1 and version >= 8 else 0
        _syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(flags))
    finally:
        os.close(ruleset)
    return Restricted(version, fs=True, net=version >= 4, scopes=version >= 6, all_threads=threads == 1 or flags != 0)


def _allow(ruleset: int, path: Path, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS  # a rule on a file may only grant file rights
        rule = _PathBeneath(rights, fd)
        _syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                 ctypes.c_uint32(0))
    finally:
        os.close(fd)
