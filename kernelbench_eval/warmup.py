"""Build-stage warm-up: call ModelNew once on problem-shaped inputs, so JIT-compiled kernels build at compile time.

A Triton kernel (`@triton.jit`) is compiled on its first call, for the dtypes and the specialisation of the
arguments it sees (and autotuned then, with `@triton.autotune`). Importing the candidate, which is what
builds a `load_inline` extension, compiles nothing of it: without a warm-up its compile time would land in
the first correctness trial and its failures would read as runtime errors. The build worker therefore
imports the candidate (`op_import`), then runs this (`op_warmup`) on inputs made the way the reference's
are (same `--dim` overrides and precision), so the kernels it will be judged on are in the build's Triton
cache (`build_env`) before evaluation starts. Its time is part of the compile's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kernelbench_eval.models import WorkerReply, WorkerRequest
from kernelbench_eval.precision import cast_inputs, cast_model

_NEEDS_WARMUP = re.compile(r"^\s*(import\s+triton|from\s+triton\b)|@triton\.(jit|autotune)", re.MULTILINE)


def needs_warmup(source: str) -> bool:
    """Whether a candidate compiles kernels at its first call (Triton) and so needs a build-stage warm-up."""
    return bool(_NEEDS_WARMUP.search(source))


def build_env(build: Path) -> dict[str, str]:
    """The environment of every process that imports this build: its own Triton cache next to its extensions.

    One cache per build keeps a candidate's compiled Triton kernels with its content hash (reused when the
    same source is judged again, never shared with another candidate) instead of in ~/.triton.
    """
    return {"TORCH_EXTENSIONS_DIR": str(build / "ext"), "TRITON_CACHE_DIR": str(build / "triton")}


def warm_up(candidate: Any, problem: Any, req: WorkerRequest) -> WorkerReply:
    """One forward of `candidate.ModelNew` built from `problem`'s init inputs, on `problem.get_inputs()`."""
    import torch

    for name, value in req.dims.items():
        if hasattr(problem, name):
            setattr(problem, name, value)
    device = req.device or "cpu"
    torch.manual_seed(req.init_seed or 0)
    init = cast_inputs(problem.get_init_inputs(), req.precision)
    model = candidate.ModelNew(*init)
    model = cast_model(model.to(device) if hasattr(model, "to") else model, req.precision)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x
              for x in cast_inputs(problem.get_inputs(), req.precision)]
    with torch.no_grad():
        model(*inputs)
    if device == "cuda":
        torch.cuda.synchronize()
    return WorkerReply(ok=True, torch_version=torch.__version__)
