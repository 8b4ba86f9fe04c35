"""The harness's private temporary folder, and the removal of those a killed harness left behind.

Why: the reference's inputs (`kbeval-ref-*`), the problem copies the reference imports, the fork server and
every worker's folder used to sit directly in the shared temp directory, where any candidate could list
and edit them. `enter()` points this process's `tempfile` at `$TMPDIR/kbeval-run-<pid>-<random>`, mode
0300 (its owner may create and enter, not list): a candidate that knows only its own folder cannot list
its siblings. It is removed at exit; one whose owning harness (the pid in its name) is dead is removed by
the next run.
Same-user code can still chmod it or follow /proc links; only an OS sandbox (another uid) closes that.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

from kernelbench_eval.isolation import linux

PREFIX = "kbeval-run-"
MODE = 0o300
_lock = threading.Lock()
_root: Path | None = None


def enter() -> Path:
    """Create (once per process) the private folder and make it `tempfile`'s default; clean up dead runs."""
    global _root
    with _lock:
        if _root is not None and _root.is_dir():
            return _root
        base = Path(tempfile.gettempdir())
        remove_dead(base)
        _root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))
        os.chmod(_root, MODE)
        tempfile.tempdir = str(_root)
        atexit.register(_remove, _root)
        return _root


def folder(name: str) -> Path:
    """A 0700 sub-folder of the private folder (created once), for files the harness itself keeps."""
    path = enter() / name
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def remove_dead(base: Path) -> list[Path]:
    """Remove `kbeval-run-<pid>-*` folders under `base` whose harness (that pid, running kbeval) is gone."""
    removed = []
    for path in base.glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not path.is_symlink() and not _alive_harness(int(pid)):
            _remove(path)
            removed.append(path)
    return removed


def _alive_harness(pid: int) -> bool:
    """Alive at all (a reused pid only keeps a dead run's folder a while longer: never the reverse)."""
    return pid == os.getpid() or linux.exists(pid)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)  # 0300 cannot be listed, so not emptied
    shutil.rmtree(path, ignore_errors=True)


INPUT_PATTERNS = ("init.pt", "inputs_*.pt", "timing_*.pt")


def seal_inputs(folder: Path) -> dict[str, str]:
    """sha256 of each input file a reference wrote into `folder` (what every candidate gets copies of)."""
    import hashlib

    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for pattern in INPUT_PATTERNS for path in sorted(folder.glob(pattern)) if path.is_file()}


def copy_sealed(src: Path, dst: Path, names: list[str], seal: dict[str, str]) -> None:
    """Copy the named input files, each verified against `seal` as copied; `InputsAltered` on a mismatch.

    For judging (`judge.candidate_run`): copies are checked as they are made, so a file altered after
    the seal is never handed to a candidate (the session is then reopened, regenerating its inputs).
    """
    import hashlib

    for name in names:
        data = (src / name).read_bytes()
        if seal.get(name) != hashlib.sha256(data).hexdigest():
            raise InputsAltered(f"{src / name}: the reference's input file changed after it was written")
        (dst / name).write_bytes(data)


class InputsAltered(OSError):
    """A reference input file no longer matches its seal: regenerate the reference's inputs."""
