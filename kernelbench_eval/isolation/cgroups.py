"""One cgroup v2 leaf per candidate worker, killed whole when its work ends: nothing it started survives.

Why a cgroup: a process cannot leave its cgroup without writing into cgroupfs (which the worker's Landlock
rules forbid), whatever it does to its session, process group, parent or environment, and `cgroup.kill`
(Linux 5.14) kills every member at once, forks racing it included. The environment token that came before
missed a daemon that `execve`d with an empty environment.

Leaves live under `<cgroup2 mount><this process's cgroup>/kbeval-<pid>-<random>/`, found through
/proc/self/mounts (the hybrid layout of some machines mounts cgroup2 at /sys/fs/cgroup/unified), removed
when the harness exits; the next harness removes (and kills) those whose harness died.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import threading
import time
from pathlib import Path

PREFIX = "kbeval-"
KILL_WAIT = 30.0  # seconds for a killed leaf to empty
_lock = threading.Lock()
_base: Path | None = None
_base_error: str | None = None


def mount_point() -> Path | None:
    """Where cgroup2 is mounted (the first one listed), or None."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1].replace("\\040", " "))
    return None


def own_cgroup() -> str | None:
    """This process's cgroup v2 path ("0::/path" in /proc/self/cgroup)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].removesuffix(" (deleted)")
    return None


def base() -> Path:
    """This harness's folder of leaves (made once); OSError saying why where there can be none."""
    global _base, _base_error
    with _lock:
        if _base is not None:
            return _base
        if _base_error is not None:
            raise OSError(_base_error)
        try:
            mount, own = mount_point(), own_cgroup()
            if mount is None or own is None:
                raise OSError("no cgroup2 hierarchy mounted")
            parent = mount / own.lstrip("/")
            remove_dead(parent)
            path = parent / f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
            path.mkdir()
            if not (path / "cgroup.kill").exists():
                path.rmdir()
                raise OSError("cgroup.kill is missing (Linux < 5.14)")
        except OSError as exc:
            _base_error = f"cgroup v2: {exc.strerror or exc}"
            raise OSError(_base_error) from None
        atexit.register(_remove_tree, path)
        _base = path
        return path


class Leaf:
    """One worker's cgroup: `add` its pid before it runs candidate code, `kill` it when done."""

    def __init__(self) -> None:
        self.path = base() / f"w-{secrets.token_hex(6)}"
        self.path.mkdir()

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def kill(self) -> bool:
        """Kill every process in the leaf, wait until it is empty, remove it; False if it did not empty."""
        return _kill(self.path)

    def cpu_ms(self) -> float | None:
        """CPU time every process that was ever in the leaf used (`cpu.stat` usage_usec: those gone included), in
        ms; None when unreadable. What the cores rule counts: a helper process the candidate forked is in here."""
        return cpu_stat_ms(self.path)

    def freeze(self, frozen: bool = True, wait_s: float = 1.0) -> bool:
        """Freeze (or thaw) every process in the leaf, those in sessions of their own included (`judge.refguard`
        holds a candidate so while the reference is timed); True once the kernel reports it so."""
        want = "1" if frozen else "0"
        try:
            (self.path / "cgroup.freeze").write_text(want)
        except OSError:
            return False
        deadline = time.monotonic() + wait_s
        while _events(self.path).get("frozen", want) != want:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0001)
        return True


def cpu_stat_ms(path: Path) -> float | None:
    """`usage_usec` of a cgroup v2 folder's `cpu.stat` (kept by the cgroup core, with or without the cpu
    controller), in ms; None when unreadable."""
    try:
        for line in (path / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec":
                return int(value) / 1000
    except (OSError, ValueError):
        pass
    return None


def tree_cpu_ms(pid: int) -> float:
    """CPU time of process `pid` and its live descendants (their threads included), and of the children each of
    them reaped (cutime, cstime), from /proc: the fallback where no cgroup holds a worker. A process that left
    the tree (reparented after its parent died) is not counted: that is what the cgroup is for."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, list[int]] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
            times[int(entry.name)] = sum(int(fields[k]) for k in _TIMES)
        except (OSError, ValueError, IndexError):
            continue
    total, todo, seen = 0, [pid], set()
    while todo:
        one = todo.pop()
        if one in seen:
            continue
        seen.add(one)
        total += times.get(one, 0)
        todo += parents.get(one, [])
    return total * 1000 / tick


_TIMES = (11, 12, 13, 14)  # utime, stime, cutime, cstime: fields 14-17 of /proc/<pid>/stat, from the third on


def _kill(path: Path) -> bool:
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + KILL_WAIT
    while _populated(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    with contextlib.suppress(OSError):
        path.rmdir()
    return not path.exists()


def _populated(path: Path) -> bool:
    return _events(path).get("populated") == "1"  # {} once gone


def _events(path: Path) -> dict[str, str]:
    try:
        return dict(line.split(" ", 1) for line in (path / "cgroup.events").read_text().splitlines() if " " in line)
    except OSError:
        return {}


def remove_dead(parent: Path) -> None:
    """Kill and remove the leaves of harnesses that are gone (the pid in the folder's name)."""
    for path in parent.glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            _remove_tree(path)


def _remove_tree(path: Path) -> None:
    with contextlib.suppress(OSError):
        for leaf in path.iterdir():
            if leaf.is_dir():
                _kill(leaf)
        path.rmdir()
