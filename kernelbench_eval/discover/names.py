"""File and folder names as KernelBench writes them, read without opening a file.

Why a module of its own: discovery, the verdict record (`Verdict.sample`) and KernelBench's results file all
read the same names (`level1/`, `19_ReLU.py`, `level_1_problem_19_sample_0_kernel.py`), and must agree.
Nothing here imports the rest of the package.
"""

from __future__ import annotations

import re

# KernelBench's scripts/generate_samples.py writes each generation as this file in its run folder
GENERATION = re.compile(r"level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py")
GENERATION_FORM = "level_{L}_problem_{P}_sample_{S}_kernel.py"
LEVEL_FOLDER = re.compile(r"level(\d+)")  # KernelBench/level1/, level2/, ...
_NUMBER = re.compile(r"(\d+)_")  # a problem file's number: 19 of 19_ReLU.py
# what KernelBench's scripts write beside the generations in a run folder: never candidates, never listed
COMPANIONS = re.compile(r"level_\d+_problem_\d+_sample_\d+_prompt\.txt|generation_config\.yaml|eval_results\.json"
                        r"|pass_at_k_results\.json")
_BACKUP_SUFFIXES = (".swp", ".swo", ".bak", ".orig", ".rej")


def generation(name: str) -> tuple[int, int, int] | None:
    """(level, problem number, sample) of a generation file's name, or None when it is not one."""
    match = GENERATION.fullmatch(name)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def sample_of(candidate_id: str) -> int | None:
    """The sample index a candidate id carries: its file stem, when that is a generation's name."""
    found = generation(candidate_id.rsplit("/", 1)[-1] + ".py")
    return found[2] if found else None


def level_of(folder: str) -> int | None:
    """N of a folder named `levelN`, else None."""
    match = LEVEL_FOLDER.fullmatch(folder)
    return int(match[1]) if match else None


def number_of(stem: str) -> int | None:
    """A problem's number, the leading digits of its file stem (`19_ReLU` is 19), else None."""
    match = _NUMBER.match(stem)
    return int(match[1]) if match else None


def skipped_name(name: str) -> str | None:
    """Why a file or folder is no candidate by its name alone (hidden, Python's cache, an editor's backup)."""
    if name.startswith("."):
        return "hidden"
    if name == "__pycache__":
        return "Python's cache"
    if name.endswith("~") or (name.startswith("#") and name.endswith("#")) or name.endswith(_BACKUP_SUFFIXES):
        return "editor backup"
    return None
