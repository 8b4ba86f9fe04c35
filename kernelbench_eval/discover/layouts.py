"""Stage 1, candidates: every file of a candidates folder, in kbeval's layout or KernelBench's, read statically.

Why one walk for all layouts: people keep KernelBench's folders as its scripts write them, and a file that
is neither judged nor named in a warning is a verdict silently lost. The layouts (README, "KernelBench
layouts"):

- kbeval's: `CANDIDATES/<problem id>/<file>`; a problem id with a level (`level1/19_ReLU`) is the folder
  `19_ReLU` inside `level1/`, or `19_ReLU` alone while no other problem has that stem. Every regular file
  there is a candidate (a non-Python one a `load_error`); hidden files, `__pycache__`, editor backups and
  sub-folders are listed in one warning.
- KernelBench's flat run folder (scripts/generate_samples.py): `CANDIDATES/level_{L}_problem_{P}_sample_{S}
  _kernel.py`, each the sample S of the problem numbered P in the level-L folder of the problems.
- KernelBench's runs folder: `CANDIDATES/<run_name>/level_..._kernel.py`, one run folder per level or model.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from kernelbench_eval.discover import names
from kernelbench_eval.discover.sources import Candidate, Problem, make_candidate

_SHOWN = 8  # problem numbers named in one warning about generations without a problem


def find_candidates(problems: dict[str, Problem], problems_dir: Path, candidates_dir: Path,
                    only: list[str] | None, warnings: list[str]) -> list[Candidate]:
    """Every candidate under `candidates_dir`, in the order found; what is not judged is named in `warnings`."""
    walk = _Walk(problems, problems_dir, only, warnings)
    walk.top(candidates_dir)
    walk.report_unmatched()
    return walk.candidates


class _Walk:
    def __init__(self, problems: dict[str, Problem], problems_dir: Path, only: list[str] | None,
                 warnings: list[str]) -> None:
        self.problems, self.problems_dir, self.only, self.warnings = problems, problems_dir, only, warnings
        self.candidates: list[Candidate] = []
        self.ids: dict[tuple[str, str], Path] = {}  # (problem, candidate id): the file that holds it
        self.samples: dict[tuple[str, int], Path] = {}  # (problem, sample index): the file that holds it
        self.unmatched: dict[tuple[Path, int], list[int]] = defaultdict(list)  # (folder, level): numbers
        self.by_stem: dict[str, Problem | None] = {}  # None: two problems share the stem
        self.by_number: dict[tuple[int | None, int], Problem] = {}
        for problem in problems.values():
            stem = problem.path.stem
            self.by_stem[stem] = None if stem in self.by_stem else problem
            if problem.number is None:
                continue
            key = (problem.level, problem.number)
            if key in self.by_number:
                warnings.append(f"{problem.shown}: level {problem.level} problem {problem.number} is already "
                                f"{self.by_number[key].shown}; generation files naming it are judged against that one")
            else:
                self.by_number[key] = problem
        self.levelless = all(p.level is None for p in problems.values())

    # -- folders -------------------------------------------------------------------------------------

    def top(self, folder: Path) -> None:
        entries = self._entries(folder)
        self.loose(folder, entries)
        for path in entries:
            if path.is_dir() and not names.skipped_name(path.name):
                self.folder(path, path.name)

    def loose(self, folder: Path, entries: list[Path]) -> None:
        """The files beside folders (the top, a level folder): a run folder's, or `.py` files meant as generations."""
        if _is_run_folder(entries):
            self.run_folder(folder, entries, dirs_searched=True)
            return
        for path in entries:  # notes beside kbeval's problem folders are not candidates (README)
            if path.is_file() and path.suffix == ".py" and not names.skipped_name(path.name):
                self.generation(path)

    def folder(self, path: Path, rel: str) -> None:
        problem = self.problems.get(rel) or (self.by_stem.get(rel) if "/" not in rel else None)
        if problem is not None:
            if self._wanted(problem):
                self.problem_folder(problem, path)
            return
        prefix = f"{rel}/"
        entries = self._entries(path)
        if names.level_of(path.name) is not None and any(pid.startswith(prefix) for pid in self.problems):
            self.loose(path, entries)
            for sub in entries:  # CANDIDATES/level1/19_ReLU/: a problem id with its level
                if sub.is_dir() and not names.skipped_name(sub.name):
                    self.folder(sub, prefix + sub.name)
            return
        if _is_run_folder(entries):
            self.run_folder(path, entries)
        elif not self.only:  # a folder a --problem filter leaves out is not worth a line
            self.warnings.append(f"{path}: no problem named {rel!r} under {self.problems_dir}; folder skipped")

    def problem_folder(self, problem: Problem, folder: Path) -> None:
        """kbeval's layout: every regular file is a candidate; what is not is listed in one warning."""
        left: list[str] = []
        for path in self._entries(folder):
            why = names.skipped_name(path.name)
            if why is None and path.is_dir():
                why = "a folder: not searched"
            elif why is None and not path.is_file():
                why = "not a regular file"
            if why:
                left.append(f"{path.name} ({why})")
            else:
                self.add(make_candidate(problem, path), path)
        if left:
            self.warnings.append(f"{folder}: not judged: {', '.join(left)}")

    def run_folder(self, folder: Path, entries: list[Path], dirs_searched: bool = False) -> None:
        """KernelBench's run folder: its generation files; its own prompts and configs are no candidates."""
        others = []
        for path in entries:
            if names.skipped_name(path.name) or names.COMPANIONS.fullmatch(path.name) or (
                    dirs_searched and path.is_dir()):
                continue
            if path.is_dir():
                others.append(f"{path.name}/")
            elif path.suffix == ".py":
                self.generation(path)
            else:
                others.append(path.name)
        if others:
            self.warnings.append(f"{folder}: not generation files ({names.GENERATION_FORM}), not judged: "
                                 f"{', '.join(others)}")

    # -- files ---------------------------------------------------------------------------------------

    def generation(self, path: Path) -> None:
        parsed = names.generation(path.name)
        if parsed is None:
            self.warnings.append(f"{path}: the name does not parse as {names.GENERATION_FORM}, and the file is in "
                                 "no problem's folder; not judged")
            return
        level, number, sample = parsed
        problem = self.by_number.get((level, number))
        if problem is None and self.levelless:
            problem = self.by_number.get((None, number))
        if problem is None:
            self.unmatched[(path.parent, level)].append(number)
        elif self._wanted(problem):
            self.add(make_candidate(problem, path, sample), path)

    def add(self, cand: Candidate, path: Path) -> None:
        """Keep `cand` unless its sample index, or its id, is already taken in its problem (then one warning)."""
        taken = self.samples.get((cand.problem_id, cand.sample)) if cand.sample is not None else None
        if taken is not None:
            self.warnings.append(f"{path}: sample {cand.sample} of {cand.problem_id} is already {taken}; not judged")
            return
        key = (cand.problem_id, cand.candidate_id)
        if key in self.ids:
            self.warnings.append(f"{path}: candidate {cand.candidate_id!r} of {cand.problem_id} is already "
                                 f"{self.ids[key]}; not judged")
            return
        if cand.sample is not None:
            self.samples[(cand.problem_id, cand.sample)] = path
        self.ids[key] = path
        self.candidates.append(cand)

    def report_unmatched(self) -> None:
        for (folder, level), numbers in sorted(self.unmatched.items()):
            shown = sorted(set(numbers))
            listed = ", ".join(map(str, shown[:_SHOWN])) + (", ..." if len(shown) > _SHOWN else "")
            self.warnings.append(f"{folder}: {len(numbers)} generation file(s) name level {level} problem(s) "
                                 f"{listed}, which {self.problems_dir} does not hold; not judged")

    # -- helpers -------------------------------------------------------------------------------------

    def _wanted(self, problem: Problem) -> bool:
        return not self.only or problem.problem_id in self.only

    def _entries(self, folder: Path) -> list[Path]:
        try:
            return sorted(folder.iterdir())
        except OSError as exc:
            self.warnings.append(f"{folder}: cannot be listed ({exc.strerror or exc}); skipped")
            return []


def _is_run_folder(entries: list[Path]) -> bool:
    """A folder KernelBench's scripts wrote: it holds generation files (or files meant as such) or its config."""
    return any(names.COMPANIONS.fullmatch(p.name) or (p.suffix == ".py" and p.name.startswith("level_"))
               for p in entries)
