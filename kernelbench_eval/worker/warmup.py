"""The build worker's warm-up call (`CandidateWorker.op_warmup`): one forward of ModelNew on problem-shaped inputs.

Here, with the rest of what runs inside a worker, because it runs candidate code; the harness's side of the warm-up
(whether a source needs one, the inputs it is made for, the build's Triton cache) is `building.jitwarmup`.
"""

from __future__ import annotations

from typing import Any

from kernelbench_eval.common.precision import cast_inputs, cast_model
from kernelbench_eval.messages import ImportReply
from kernelbench_eval.requests import WarmupRequest
from kernelbench_eval.worker.tensors import _one_line


def warm_up(candidate: Any, problem: Any, req: WarmupRequest) -> ImportReply:
    """One forward of `candidate.ModelNew` built from `problem`'s init inputs, on `problem.get_inputs()`."""
    import torch

    for name, value in req.dims.items():
        if hasattr(problem, name):
            setattr(problem, name, value)
    device = req.device or "cpu"
    torch.manual_seed(req.init_seed or 0)
    init = cast_inputs(problem.get_init_inputs(), req.precision)
    try:
        model = candidate.ModelNew(*init)
    except Exception as exc:  # as when judged (`op_load`): the wrong constructor is a load error
        return ImportReply(ok=False, error_kind="load_error", error=f"ModelNew(*init): {_one_line(exc)}")
    model = cast_model(model.to(device) if hasattr(model, "to") else model, req.precision)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x
              for x in cast_inputs(problem.get_inputs(), req.precision)]
    with torch.no_grad():
        model(*inputs)
    if device == "cuda":
        torch.cuda.synchronize()
    return ImportReply(ok=True, torch_version=torch.__version__)
