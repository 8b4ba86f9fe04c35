"""A seccomp filter, assembled here as classic BPF: the syscalls a candidate could turn on other processes.

Why its own filter and not libseccomp: no library to find on every machine, and the rules are few. What
it refuses (EPERM), whatever the process's privileges:

- reaching into another process: ptrace, process_vm_readv/writev, kcmp, pidfd_open/getfd/send_signal,
  process_madvise/mrelease;
- changing another process's scheduling, affinity, priority, I/O priority, limits or memory placement
  (sched_setaffinity, sched_setparam/setscheduler/setattr, setpriority, ioprio_set, prlimit64,
  migrate_pages, move_pages): allowed only on pid 0 or the worker itself (OpenMP pinning its own threads
  by thread id is refused too, and OpenMP carries on unpinned);
- leaving its namespaces or remounting: unshare, setns, clone with a CLONE_NEW* flag, mount and the new
  mount API, pivot_root, chroot (clone3 answers ENOSYS, since its flags cannot be inspected: the C
  library then falls back to clone);
- io_uring (its operations are not seen by seccomp), and prctl(PR_SET_DUMPABLE, non-zero);
- with `signals` (only where Landlock cannot scope signals): kill and friends to any process but itself.

Syscalls of another ABI (i386, x32) are refused altogether. Installed on every thread (TSYNC).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

# x86_64 and the generic table (aarch64)
_NUMBERS = {
    "x86_64": dict(
        ptrace=101, process_vm_readv=310, process_vm_writev=311, kcmp=312, pidfd_open=434, pidfd_getfd=438,
        pidfd_send_signal=424, process_madvise=440, process_mrelease=448, sched_setaffinity=203,
        sched_setparam=142, sched_setscheduler=144, sched_setattr=314, setpriority=141, ioprio_set=251,
        prlimit64=302, migrate_pages=256, move_pages=279, unshare=272, setns=308, mount=165, umount2=166,
        pivot_root=155, chroot=161, open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432,
        fspick=433, mount_setattr=442, prctl=157, clone=56, clone3=435, io_uring_setup=425, io_uring_enter=426,
        io_uring_register=427, kill=62, tkill=200, tgkill=234, rt_sigqueueinfo=129, rt_tgsigqueueinfo=297,
        seccomp=317),
    "aarch64": dict(
        ptrace=117, process_vm_readv=270, process_vm_writev=271, kcmp=272, pidfd_open=434, pidfd_getfd=438,
        pidfd_send_signal=424, process_madvise=440, process_mrelease=448, sched_setaffinity=122,
        sched_setparam=118, sched_setscheduler=119, sched_setattr=274, setpriority=140, ioprio_set=30,
        prlimit64=261, migrate_pages=238, move_pages=239, unshare=97, setns=268, mount=40, umount2=39,
        pivot_root=41, chroot=51, open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432,
        fspick=433, mount_setattr=442, prctl=167, clone=220, clone3=435, io_uring_setup=425, io_uring_enter=426,
        io_uring_register=427, kill=129, tkill=130, tgkill=131, rt_sigqueueinfo=138, rt_tgsigqueueinfo=240,
        seccomp=277),
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_BIT = 0x40000000

DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd",
          "pidfd_send_signal", "process_madvise", "process_mrelease", "unshare", "setns", "mount", "umount2",
          "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
          "mount_setattr", "io_uring_setup", "io_uring_enter", "io_uring_register")
SELF_ONLY = ("sched_setaffinity", "sched_setparam", "sched_setscheduler", "sched_setattr", "prlimit64",
             "migrate_pages", "move_pages")  # first argument: a pid
_CLONE_NEW = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_PR_SET_DUMPABLE = 4

_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _DENY = 0x7FFF0000, 0x00050000, 0x00050000 | errno.EPERM
_NR, _ARCH = 0, 4


def _arg(index: int, high: bool = False) -> int:
    return 16 + 8 * index + (4 if high else 0)  # little-endian: the low word first


class _Program:
    """Classic BPF with named labels; every jump goes forward, as BPF requires."""

    def __init__(self) -> None:
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def load(self, offset: int) -> None:
        self.code.append((_LD_ABS, 0, 0, offset))

    def jump(self, op: int, k: int, true: str | int = 0, false: str | int = 0) -> None:
        self.code.append((op, true, false, k))

    def ret(self, value: int) -> None:
        self.code.append((_RET, 0, 0, value))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = b""
        for at, (op, true, false, k) in enumerate(self.code):
            jt, jf = (self._offset(at, t) for t in (true, false))
            out += struct.pack("=HBBI", op, jt, jf, k & 0xFFFFFFFF)
        return out

    def _offset(self, at: int, target: str | int) -> int:
        if isinstance(target, int):
            return target
        offset = self.labels[target] - at - 1
        if not 0 <= offset < 256:
            raise ValueError(f"seccomp jump to {target} out of range")
        return offset


def build(pid: int, signals: bool, machine: str | None = None) -> bytes:
    """The filter for worker `pid`, as `struct sock_filter` bytes."""
    machine = machine or platform.machine()
    if machine not in _NUMBERS:
        raise OSError(f"seccomp filter: unsupported architecture {machine}")
    nr, p = _NUMBERS[machine], _Program()
    p.load(_ARCH)
    p.jump(_JEQ, _AUDIT_ARCH[machine], 1, 0)
    p.ret(_DENY)  # a syscall of another ABI (int 0x80)
    p.load(_NR)
    if machine == "x86_64":
        p.jump(_JGE, _X32_BIT, "deny", 0)
    for name in DENIED + (("tkill",) if signals else ()):
        p.jump(_JEQ, nr[name], "deny", 0)
    p.jump(_JEQ, nr["clone3"], "nosys", 0)
    p.jump(_JEQ, nr["clone"], "clone", 0)
    p.jump(_JEQ, nr["prctl"], "prctl", 0)
    p.jump(_JEQ, nr["setpriority"], "priority", 0)
    p.jump(_JEQ, nr["ioprio_set"], "ioprio", 0)
    for name in SELF_ONLY:
        p.jump(_JEQ, nr[name], "pid0", 0)
    if signals:
        for name in ("kill", "rt_sigqueueinfo"):
            p.jump(_JEQ, nr[name], "signal", 0)
        for name in ("tgkill", "rt_tgsigqueueinfo"):
            p.jump(_JEQ, nr[name], "self0", 0)
    p.ret(_ALLOW)
    p.label("clone")
    p.load(_arg(0))
    p.jump(_JSET, _CLONE_NEW, "deny", "allow")
    p.label("prctl")
    p.load(_arg(0))
    p.jump(_JEQ, _PR_SET_DUMPABLE, 0, "allow")
    p.load(_arg(1))
    p.jump(_JEQ, 0, 0, "deny")
    p.load(_arg(1, high=True))
    p.jump(_JEQ, 0, "allow", "deny")
    p.label("priority")  # setpriority(which, who): PRIO_PROCESS or PRIO_PGRP, of itself
    p.load(_arg(0))
    p.jump(_JGE, 2, "deny", 0)
    p.load(_arg(1))
    p.jump(_JEQ, 0, "allow", 0)
    p.jump(_JEQ, pid, "allow", "deny")
    p.label("ioprio")  # ioprio_set(which, who): IOPRIO_WHO_PROCESS or _PGRP, of itself
    p.load(_arg(0))
    p.jump(_JEQ, 1, "ioprio_who", 0)
    p.jump(_JEQ, 2, "ioprio_who", "deny")
    p.label("ioprio_who")
    p.load(_arg(1))
    p.jump(_JEQ, 0, "allow", 0)
    p.jump(_JEQ, pid, "allow", "deny")
    p.label("signal")  # kill(pid): itself, its own group (-pid: it leads its session) or 0
    p.load(_arg(0))
    p.jump(_JEQ, (-pid) & 0xFFFFFFFF, "allow", 0)
    p.jump(_JEQ, 0, "allow", 0)
    p.jump(_JEQ, pid, "allow", "deny")
    p.label("self0")
    p.load(_arg(0))
    p.jump(_JEQ, pid, "allow", "deny")
    p.label("pid0")  # a pid_t is 32 bits: the kernel ignores the high word, and so may we
    p.load(_arg(0))
    p.jump(_JEQ, 0, "allow", 0)
    p.jump(_JEQ, pid, "allow", "deny")
    p.label("nosys")
    p.ret(_ERRNO | errno.ENOSYS)
    p.label("deny")
    p.ret(_DENY)
    p.label("allow")
    p.ret(_ALLOW)
    return p.assemble()


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(signals: bool) -> None:
    """Install the filter on every thread of this process (needs no_new_privs); OSError if refused."""
    machine = platform.machine()
    code = build(os.getpid(), signals, machine)
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _Fprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    set_mode_filter, tsync, spec_allow = 1, 1, 4
    # SPEC_ALLOW: a kernel booted with spec_store_bypass_disable=seccomp would otherwise slow the candidate's own
    # code (store forwarding off) but not the reference's: timed under other conditions. It guards a process
    # against itself, and the candidate's process holds nothing of anyone else's.
    for flags in (tsync | spec_allow, tsync):
        result = libc.syscall(ctypes.c_long(_NUMBERS[machine]["seccomp"]), ctypes.c_uint(set_mode_filter),
                              ctypes.c_uint(flags), ctypes.byref(prog))
        if not (result < 0 and ctypes.get_errno() == errno.EINVAL):  # EINVAL: a kernel before 4.17
            break
    if result != 0:
        err = ctypes.get_errno() if result < 0 else errno.EBUSY  # > 0: a thread that could not be synced
        raise OSError(err, f"seccomp: {os.strerror(err)}")
