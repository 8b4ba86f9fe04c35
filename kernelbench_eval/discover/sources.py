"""What discovery knows of one problem or one candidate file, read statically: bytes, hash, a few declarations.

Why apart from `corpus`: the layouts (`layouts.py`) make candidates too, and `corpus` walks the layouts; both
need these records without importing each other.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from kernelbench_eval.discover import names

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
    level: int | None = field(default=None, compare=False)  # KernelBench's level: its `levelN` folder
    origin: Path | None = field(default=None, compare=False, repr=False)  # the user's file, when `path` is a copy

    @property
    def shown(self) -> Path:
        """The file a person knows this problem by: theirs, never the harness's private copy (`pinned`)."""
        return self.origin or self.path

    @property
    def number(self) -> int | None:
        return names.number_of(self.path.stem)


@dataclass(frozen=True)
class Candidate:
    problem_id: str
    candidate_id: str
    path: Path
    source_sha256: str
    devices: tuple[str, ...] | None = None  # None: any device the source can run on
    invalid: str | None = field(default=None, compare=False)  # why it cannot be loaded at all
    sample: int | None = None  # KernelBench's sample index (a generation file's S), for pass@k and eval_results.json


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def candidate_id(path: Path) -> str:
    """A `.py` file is known by its stem; any other by its whole name (`fused.cu` beside `fused.py`)."""
    return path.stem if path.suffix == ".py" else path.name


def make_candidate(problem: Problem, path: Path, sample: int | None = None) -> Candidate:
    """The candidate in `path`, or one that is `invalid` (a `load_error` verdict) saying why it cannot load."""
    cid = candidate_id(path)
    sample = names.sample_of(cid) if sample is None else sample
    try:
        data = path.read_bytes()
    except OSError as exc:
        return Candidate(problem.problem_id, cid, path, hashlib.sha256(b"").hexdigest(), sample=sample,
                         invalid=f"{path}: cannot read: {exc.strerror or exc}")
    base = {"problem_id": problem.problem_id, "candidate_id": cid, "path": path,
            "source_sha256": hashlib.sha256(data).hexdigest(), "sample": sample}
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
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # null bytes, absurd nesting
        return None  # the compile stage reports the error with its line
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "KBEVAL_DEVICES" for t in node.targets
        ):
            try:
                return tuple(str(d) for d in ast.literal_eval(node.value))
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):  # not a list of literals
                return None
    return ("cuda",) if _CUDA_HINTS.search(source) or TRITON_HINTS.search(source) else None
