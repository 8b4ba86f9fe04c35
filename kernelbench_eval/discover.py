"""Stage 1: find problems and candidates on disk, without running any of their code.

Everything here is static (file names, bytes, hashes, a syntax-tree read of a few declarations), so a
malformed file costs one clear message and never a crash of the harness.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

MAX_SOURCE_BYTES = 2 * 1024 * 1024
_CUDA_HINTS = re.compile(r"cuda_sources\s*=|__global__|\.cu['\"]")


@dataclass(frozen=True)
class Problem:
    problem_id: str
    path: Path
    source_sha256: str
    source: bytes | None = field(default=None, compare=False, repr=False)  # the bytes hashed at discovery


class ProblemChanged(ValueError):
    """A problem's bytes are not those hashed at discovery."""


@dataclass(frozen=True)
class Candidate:
    problem_id: str
    candidate_id: str
    path: Path
    source_sha256: str
    devices: tuple[str, ...] | None = None  # None: any device the source can run on
    invalid: str | None = field(default=None, compare=False)  # why it cannot be loaded at all


@dataclass
class Discovery:
    problems: dict[str, Problem]
    candidates: list[Candidate]
    warnings: list[str]


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def discover(problems_dir: Path, candidates_dir: Path, only: list[str] | None = None) -> Discovery:
    """Pair every `candidates/<problem_id>/<candidate_id>.py` with `problems/**/<problem_id>.py`."""
    warnings: list[str] = []
    problems = find_problems(problems_dir, warnings)
    candidates: list[Candidate] = []
    if not candidates_dir.is_dir():
        raise FileNotFoundError(f"{candidates_dir}: candidates folder not found")
    for folder in sorted(p for p in candidates_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if only and folder.name not in only:
            continue
        problem = problems.get(folder.name)
        if problem is None:
            warnings.append(f"{folder}: no problem named {folder.name!r} under {problems_dir}; folder skipped")
            continue
        for path in sorted(folder.glob("*.py")):
            candidates.append(make_candidate(problem, path))
    return Discovery(problems=problems, candidates=candidates, warnings=warnings)


def find_problems(problems_dir: Path, warnings: list[str]) -> dict[str, Problem]:
    if not problems_dir.is_dir():
        raise FileNotFoundError(f"{problems_dir}: problems folder not found")
    problems: dict[str, Problem] = {}
    for path in sorted(problems_dir.rglob("*.py")):
        if path.name.startswith(("_", ".")):
            continue
        pid = path.stem
        if pid in problems:
            warnings.append(f"{path}: problem id {pid!r} already defined by {problems[pid].path}; ignored")
            continue
        data = path.read_bytes()  # read once: the reference imports a private copy of these bytes
        problems[pid] = Problem(problem_id=pid, path=path, source_sha256=hashlib.sha256(data).hexdigest(),
                                source=data)
    return problems


def private_copy(problem: Problem) -> Path:
    """The harness's own copy of the problem's discovered bytes, checked (and rewritten) on every call.

    Why: a candidate runs before the reference is imported and could edit the user's file in between
    (and restore it, mtime included). The reference imports this copy instead, from a 0700 folder in the
    harness's private temp folder (`private`); its hash is verified against discovery's each time.
    """
    from kernelbench_eval import private  # here: discovery itself stays free of side effects

    data = problem.source if problem.source is not None else problem.path.read_bytes()
    if hashlib.sha256(data).hexdigest() != problem.source_sha256:
        raise ProblemChanged(f"{problem.path}: changed since it was discovered (sha256 differs)")
    folder = private.folder("problems") / problem.source_sha256[:32]
    folder.mkdir(mode=0o700, exist_ok=True)
    copy = folder / f"{problem.problem_id}.py"
    try:
        if copy.read_bytes() == data:
            return copy
    except OSError:
        pass
    tmp = folder / f".{problem.problem_id}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    tmp.replace(copy)
    return copy


def pinned(problem: Problem) -> Problem:
    """The problem as the reference must see it: its path is the verified private copy."""
    return replace(problem, path=private_copy(problem))


def make_candidate(problem: Problem, path: Path) -> Candidate:
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    base = {"problem_id": problem.problem_id, "candidate_id": path.stem, "path": path, "source_sha256": digest}
    error = source_problem(data)
    if error:
        return Candidate(**base, invalid=f"{path}: {error}")
    return Candidate(**base, devices=declared_devices(data.decode()))


def source_problem(data: bytes) -> str | None:
    """Why a candidate file cannot even be handed to Python, or None when it can."""
    if len(data) > MAX_SOURCE_BYTES:
        return f"file is {len(data) / 1e6:.1f} MB, over the {MAX_SOURCE_BYTES // (1024 * 1024)} MiB limit"
    if not data.strip():
        return "file is empty (no ModelNew)"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte {exc.start})"
    return None


def declared_devices(source: str) -> tuple[str, ...] | None:
    """`KBEVAL_DEVICES = [...]` at module level if declared, else ("cuda",) when the source builds CUDA."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None  # the compile stage reports the syntax error with its line
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "KBEVAL_DEVICES" for t in node.targets
        ):
            try:
                return tuple(str(d) for d in ast.literal_eval(node.value))
            except ValueError:
                return None
    return ("cuda",) if _CUDA_HINTS.search(source) else None
