"""Stage 1: find problems and candidates on disk, without running any of their code.

Everything here is static (file names, bytes, hashes, a syntax-tree read of a few declarations), so a
malformed file costs one clear message and never a crash of the harness.
"""

from __future__ import annotations

import ast
import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path

from kernelbench_eval.discover import names
from kernelbench_eval.discover.layouts import find_candidates
from kernelbench_eval.discover.sources import (
    MAX_SOURCE_BYTES,
    TRITON_HINTS,
    Candidate,
    Problem,
    declared_devices,
    make_candidate,
    sha256_file,
    source_problem,
)

__all__ = ["MAX_SOURCE_BYTES", "TRITON_HINTS", "Candidate", "Discovery", "Problem", "ProblemChanged", "check_dims",
           "check_problem_ids", "declared_devices", "discover", "find_problems", "make_candidate",
           "merged_smoke_dims", "module_names", "pinned", "private_copy", "sha256_file", "smoke_dims",
           "source_problem"]


class ProblemChanged(ValueError):
    """A problem's bytes are not those hashed at discovery."""


@dataclass
class Discovery:
    problems: dict[str, Problem]
    candidates: list[Candidate]
    warnings: list[str]


def discover(problems_dir: Path, candidates_dir: Path, only: list[str] | None = None) -> Discovery:
    """Every problem under `problems_dir`, and every candidate under `candidates_dir` in any layout `layouts`
    reads (kbeval's `candidates/<problem_id>/<file>`, KernelBench's generation folders)."""
    warnings: list[str] = []
    problems = find_problems(problems_dir, warnings)
    if not candidates_dir.is_dir():
        raise FileNotFoundError(f"{candidates_dir}: candidates folder not found")
    candidates = find_candidates(problems, problems_dir, candidates_dir, only, warnings)
    return Discovery(problems=problems, candidates=candidates, warnings=warnings)


def find_problems(problems_dir: Path, warnings: list[str]) -> dict[str, Problem]:
    """`problems/**/<stem>.py`, each known by its stem; in a KernelBench tree (two or more `levelN` folders at the
    top, where numbers repeat across levels) a problem inside one is `levelN/<stem>` (`level1/19_ReLU`)."""
    if not problems_dir.is_dir():
        raise FileNotFoundError(f"{problems_dir}: problems folder not found")
    paths = [p for p in sorted(problems_dir.rglob("*.py")) if not p.name.startswith(("_", "."))
             and not any(part.startswith(".") for part in p.relative_to(problems_dir).parts)]
    tops = {p.relative_to(problems_dir).parts[0] for p in paths if len(p.relative_to(problems_dir).parts) > 1}
    qualified = sum(names.level_of(top) is not None for top in tops) >= 2
    problems: dict[str, Problem] = {}
    for path in paths:
        rel = path.relative_to(problems_dir)
        levels = [n for n in map(names.level_of, [problems_dir.resolve().name, *rel.parts[:-1]]) if n is not None]
        in_level = len(rel.parts) > 1 and names.level_of(rel.parts[0]) is not None
        pid = f"{rel.parts[0]}/{path.stem}" if qualified and in_level else path.stem
        if pid in problems:
            warnings.append(f"{path}: problem id {pid!r} already defined by {problems[pid].path}; ignored")
            continue
        try:
            data = path.read_bytes()  # read once: the reference imports a private copy of these bytes
        except OSError as exc:
            warnings.append(f"{path}: cannot be read ({exc.strerror or exc}); ignored")
            continue
        problems[pid] = Problem(problem_id=pid, path=path, source_sha256=hashlib.sha256(data).hexdigest(),
                                source=data, level=levels[-1] if levels else None)
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
        raise ProblemChanged(f"{problem.shown}: changed since it was discovered (sha256 differs)")
    folder = private.folder("problems") / problem.source_sha256[:32]
    folder.mkdir(mode=0o700, exist_ok=True)
    copy = folder / problem.path.name  # the file's own name: an id may hold a level folder (`level1/19_ReLU`)
    try:
        if copy.read_bytes() == data:
            return copy
    except OSError:
        pass
    tmp = folder / f".{problem.path.name}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    tmp.replace(copy)
    return copy


def pinned(problem: Problem) -> Problem:
    """The problem as the reference must see it: its path is the verified private copy; `origin` keeps the
    user's file, the one every message names (`guard.user_paths`)."""
    return replace(problem, path=private_copy(problem), origin=problem.shown)


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
