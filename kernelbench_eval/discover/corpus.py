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
# Triton kernels run only on a GPU, and compile at their first call: `import triton`, `from triton ...` or a
# `@triton.jit`/`@triton.autotune` kernel means CUDA (here) and a build-stage warm-up (`warmup.needs_warmup`).
TRITON_HINTS = re.compile(r"^\s*(import\s+triton|from\s+triton\b)|@triton\.(jit|autotune)", re.MULTILINE)


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
    from kernelbench_eval.isolation import private  # here: discovery itself stays free of side effects

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
    error = source_problem(data) if path.suffix == ".py" else (
        f"not a Python source ({path.suffix or 'no extension'}): a candidate is a .py file defining ModelNew")
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
    """`KBEVAL_DEVICES = [...]` at module level if declared, else ("cuda",) when the source builds CUDA or
    uses Triton."""
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
    return ("cuda",) if _CUDA_HINTS.search(source) or TRITON_HINTS.search(source) else None


# --- sizes, read statically: `--dim` and `--smoke` are checked before anything runs -------------------


def module_names(path: Path) -> set[str]:
    """Names a problem assigns at module level (its sizes among them); none when it does not parse."""
    tree = _parse(path)
    names: set[str] = set()
    for node in tree.body if tree else []:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def smoke_dims(path: Path) -> dict[str, int | float]:
    """A problem's `KBEVAL_SMOKE_DIMS = {...}`: small sizes for a CPU smoke run; read, never executed."""
    tree = _parse(path)
    for node in tree.body if tree else []:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "KBEVAL_SMOKE_DIMS"
                                                for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                value = None
            if not isinstance(value, dict) or not all(
                    isinstance(k, str) and k.isidentifier() and type(v) in (int, float) for k, v in value.items()):
                raise ValueError(f"{path}: KBEVAL_SMOKE_DIMS must be a dict of name: number literals")
            return value
    return {}


def check_dims(dims: dict[str, int | float], problems: list[Problem]) -> None:
    """Every `--dim` name must be a module-level name of some problem of the run (else it would do nothing)."""
    known = set().union(*(module_names(p.path) for p in problems)) - {"KBEVAL_SMOKE_DIMS"}
    unknown = sorted(set(dims) - known)
    if unknown:
        raise ValueError(f"--dim: {', '.join(unknown)} is in no problem of this run; known: "
                         f"{', '.join(sorted(known)) or 'none'}")


def check_problem_ids(only: list[str] | None, problems: dict[str, Problem]) -> None:
    unknown = [pid for pid in only or [] if pid not in problems]
    if unknown:
        raise ValueError(f"--problem: unknown problem id {', '.join(map(repr, unknown))}; known: "
                         f"{', '.join(problems) or 'none'}")


def merged_smoke_dims(problems: list[Problem], explicit: dict[str, int | float],
                      warnings: list[str]) -> dict[str, int | float]:
    """One set of sizes for the run (a run's settings hold one): every problem's smoke sizes, then `--dim`.

    Two problems asking different values for one name is an error, unless `--dim` settles that name.
    """
    dims: dict[str, int | float] = {}
    owner: dict[str, str] = {}
    for prob in problems:
        declared = smoke_dims(prob.path)
        if not declared:
            warnings.append(f"{prob.path}: declares no KBEVAL_SMOKE_DIMS: --smoke lowers only the sizes "
                            "it shares by name with the other problems (or --dim)")
        for name, value in declared.items():
            if name in dims and dims[name] != value and name not in explicit:
                raise ValueError(f"--smoke: {owner[name]} sets {name}={dims[name]} but {prob.problem_id} sets "
                                 f"{name}={value}; pass --dim {name}=N or judge them apart (--problem)")
            dims.setdefault(name, value)
            owner.setdefault(name, prob.problem_id)
    return dims | explicit


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_bytes())
    except (SyntaxError, ValueError, OSError):
        return None  # the problem's own load reports it, with its line
