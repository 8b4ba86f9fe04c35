"""The checker's input sets: one per secret seed, each drawn in its trial's distribution (`draws`), kept on the
device where the memory plan allows it and drawn again from its seed where it does not.

Why apart from the trials (`trials.py`): how a set is made (the problem's `get_inputs`, its seed, its
distribution, the run's precision) is fixed when the problem is prepared, and every later use (the expected
outputs, a set lent to a candidate, the timing's base sets) asks for a set by name and gets the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelbench_eval.common import memory
from kernelbench_eval.common.precision import cast_inputs
from kernelbench_eval.isolation.linux import keep_memory_private
from kernelbench_eval.messages import PrepareReply
from kernelbench_eval.requests import PrepareRequest
from kernelbench_eval.worker.draws import distribution_of, draw_inputs, reshape
from kernelbench_eval.worker.tensors import _describe, _memory_bytes, _nbytes, _torch, free_memory, out_of_memory
from kernelbench_eval.worker.timed import TimingWorker


class CheckerInputs(TimingWorker):
    """The checker's input sets by name ("trial0", "timing1"), each made from its secret seed."""

    def __init__(self) -> None:
        super().__init__()
        self.set_seeds: dict[str, int] = {}  # each set's secret seed
        self.draw_from: tuple[Callable[[], Any], str, str | None] | None = None  # (get_inputs, device, precision)
        self.trial_distributions: dict[str, str] = {}  # each trial's distribution, as settled (`trials`)
        self.free_at_start: int | None = None  # the device's free memory before the first set was drawn
        self.input_bytes = 0  # one input set's
        self.lean = False  # the memory plan is lean: nothing of a timing outlives its candidate (`memory`)

    def op_prepare(self, req: PrepareRequest) -> PrepareReply:
        """Apply size overrides, write the init arguments, and learn how to make one input set per secret seed.

        Only the first trial's set is drawn now (its sizes are the problem's footprint); the others are drawn
        when `op_expect` has planned what stays resident (`memory`), and again whenever one not kept is needed:
        one seed always gives one set."""
        keep_memory_private()  # secrets from here on: no same-user process may read this one's memory
        torch = _torch()
        module = self._module(req.path)
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
        if missing:
            return PrepareReply(ok=False, error_kind="load_error", error=f"problem lacks {', '.join(missing)}")
        for name, value in req.dims.items():
            if hasattr(module, name):
                setattr(module, name, value)
        self.free_at_start = free_memory(req.device or "cpu")
        out_dir = Path(req.inputs_dir or ".")
        torch.save(cast_inputs(module.get_init_inputs(), req.precision), out_dir / "init.pt")
        self.set_seeds = {f"trial{k}": s for k, s in enumerate(req.trial_seeds)}
        self.set_seeds |= {f"timing{k}": s for k, s in enumerate(req.timing_seeds)}
        self.draw_from = (module.get_inputs, req.device or "cpu", req.precision)
        names = list(self.set_seeds) if req.save_inputs else list(self.set_seeds)[:1]
        inputs: list[Any] = []
        self.input_bytes = 0
        try:
            for name in names:
                inputs = self.sets[name] = self.draw(name)
                self.input_bytes = sum(_nbytes(x) for x in inputs)
                if req.save_inputs:
                    torch.save(inputs, out_dir / f"{name}.pt")
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            self.sets = {}
            return PrepareReply(ok=False, error_kind="runtime_error", error=self._too_big(exc))
        return PrepareReply(ok=True, input_shapes=[_describe(x) for x in inputs], torch_version=torch.__version__,
                            input_bytes=self.input_bytes)

    def draw(self, name: str) -> list[Any]:
        """Input set `name`, made from its secret seed in its distribution (the same values every time)."""
        assert self.draw_from is not None, "no problem prepared"
        torch = _torch()
        get_inputs, device, precision = self.draw_from
        seed = self.set_seeds[name]
        drawn = reshape(draw_inputs(get_inputs, seed, device), self.distribution(name), seed)
        inputs = cast_inputs(drawn, precision)
        return [x.contiguous() if isinstance(x, torch.Tensor) else x for x in inputs]

    def timing_inputs(self, name: str) -> list[Any]:
        """A timing base set: kept, or (a lean plan keeps none between candidates) drawn again from its seed."""
        return self.inputs(name)

    def distribution(self, name: str) -> str:
        """The distribution set `name` is drawn in: a trial's as settled (`normal` where the reference refused
        its own), the timing sets' the problem's."""
        if name in self.trial_distributions:
            return self.trial_distributions[name]
        return distribution_of(int(name[5:])) if name.startswith("trial") else "normal"

    def inputs(self, name: str) -> list[Any]:
        """Input set `name` on the model's device: kept, or drawn again (not kept: the plan left it out)."""
        torch = _torch()
        if name in self.sets:
            return self.sets[name]
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in self.draw(name)]

    def _too_big(self, exc: BaseException) -> str:
        """The out-of-memory message of a problem whose reference cannot be judged on this device."""
        total = _memory_bytes(self.draw_from[1] if self.draw_from is not None else self.device) or 0
        one_set = f"; one input set takes {memory.gb(self.input_bytes)}" if self.input_bytes else ""
        return (f"out of memory: the reference needs more than this device has ({memory.gb(total)} in all, "
                f"{memory.gb(self.free_at_start or 0)} free when it started{one_set}): {type(exc).__name__}: "
                + " ".join(str(exc).split())[:200])
