"""Build-stage warm-up, the harness's side: which candidates call ModelNew once on problem-shaped inputs at build
time (so JIT-compiled kernels build then), on which inputs, and where their kernels are cached.

A Triton kernel (`@triton.jit`) is compiled on its first call, for the dtypes and the specialisation of the
arguments it sees (and autotuned then, with `@triton.autotune`). Importing the candidate, which is what
builds a `load_inline` extension, compiles nothing of it: without a warm-up its compile time would land in
the first correctness trial and its failures would read as runtime errors. The build worker therefore
imports the candidate (`op_import`), then calls it (`op_warmup`, in `worker.warmup`) on inputs made the way
the reference's are (same `--dim` overrides and precision), so the kernels it will be judged on are in the
build's Triton cache (`build_env`) before evaluation starts. Its time is part of the compile's.

What the warmed kernels depend on (the problem's bytes, `--dim`, `--precision`) is part of the build's
folder name (`WarmupSpec.key`): one source judged on two problems or two precisions gets two builds, each
with the Triton cache for its own inputs, instead of one cache that would miss for one of them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from kernelbench_eval.discover.corpus import TRITON_HINTS, Problem
from kernelbench_eval.records import RunSettings
from kernelbench_eval.requests import WarmupRequest


def needs_warmup(source: str) -> bool:
    """Whether a candidate compiles kernels at its first call (Triton) and so needs a build-stage warm-up."""
    return bool(TRITON_HINTS.search(source))


@dataclass(frozen=True)
class WarmupSpec:
    """What a warm-up needs besides the candidate: the problem file whose `get_init_inputs`/`get_inputs` shape
    the call, and the run's settings that change those inputs."""

    problem: Path
    problem_sha256: str
    dims: tuple[tuple[str, int | float], ...] = ()
    precision: str = "fp32"
    gpu: str | None = field(default=None, compare=False)  # CUDA_VISIBLE_DEVICES of the build worker (a lane's GPU)

    @classmethod
    def of(cls, problem: Problem, settings: RunSettings, gpu: str | None = None) -> WarmupSpec:
        return cls(problem.path, problem.source_sha256, tuple(sorted(settings.dims.items())), settings.precision, gpu)

    def key(self) -> str:
        """12 hex digits naming the inputs the warmed kernels were compiled for."""
        text = json.dumps([self.problem_sha256, list(self.dims), self.precision])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def request(self, candidate: Path, device: str) -> WarmupRequest:
        return WarmupRequest(path=str(candidate.resolve()), problem=str(self.problem.resolve()),
                             device=device, dims=dict(self.dims), precision=self.precision)


def build_env(build: Path) -> dict[str, str]:
    """The environment of every process that imports this build: its own Triton cache next to its extensions.

    One cache per build keeps a candidate's compiled Triton kernels with its content hash (reused when the
    same source is judged again, never shared with another candidate) instead of in ~/.triton.
    """
    return {"TORCH_EXTENSIONS_DIR": str(build / "ext"), "TRITON_CACHE_DIR": str(build / "triton")}
