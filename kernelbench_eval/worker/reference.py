"""The checker: the reference's worker holds the inputs and expected outputs and compares what candidates send.

Why here and not in the harness: the expected outputs and every comparison stay next to the device they
were computed on (a GPU compares a 2 GB output in milliseconds), in a process no candidate code ever runs
in, which makes itself non-dumpable before it holds anything secret. A candidate only ever gets the
exchange buffer this process lends it (see `exchange`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelbench_eval.isolation.linux import keep_memory_private
from kernelbench_eval.judge import flush, timing
from kernelbench_eval.judge.check import compare_outputs, degenerate_outputs
from kernelbench_eval.judge.exchange import Exchange
from kernelbench_eval.judge.precision import cast_inputs
from kernelbench_eval.messages import CheckResult, Slot, TensorMeta, WorkerReply, WorkerRequest
from kernelbench_eval.worker.common import _describe, _meta, _nbytes, _sync, _torch, as_list


class ReferenceOps:
    """Mixed into `worker.Worker`; these ops are only ever sent to a reference's worker."""

    device: str
    models: dict[str, Any]
    sets: dict[str, list[Any]]
    exchange: Exchange | None
    kept: list[list[Any]]
    store: list[list[Any]]
    rotation: timing.Rotation | None

    def op_prepare(self, req: WorkerRequest) -> WorkerReply:
        """Apply size overrides, write the init arguments, and make one input set per secret seed (kept here)."""
        keep_memory_private()  # secrets from here on: no same-user process may read this one's memory
        torch = _torch()
        module = self._module(req.path)  # type: ignore[attr-defined]
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
        if missing:
            return WorkerReply(ok=False, error_kind="load_error", error=f"problem lacks {', '.join(missing)}")
        for name, value in req.dims.items():
            if hasattr(module, name):
                setattr(module, name, value)
        out_dir = Path(req.inputs_dir or ".")
        torch.save(cast_inputs(module.get_init_inputs(), req.precision), out_dir / "init.pt")
        named = [(f"trial{k}", s) for k, s in enumerate(req.trial_seeds)]
        named += [(f"timing{k}", s) for k, s in enumerate(req.timing_seeds)]
        inputs: list[Any] = []
        for name, seed in named:
            inputs = cast_inputs(draw_inputs(module.get_inputs, seed, req.device or "cpu"), req.precision)
            self.sets[name] = [x.contiguous() if isinstance(x, torch.Tensor) else x for x in inputs]
            if req.save_inputs:
                torch.save(inputs, out_dir / f"{name}.pt")
        return WorkerReply(ok=True, input_shapes=[_describe(x) for x in inputs], torch_version=torch.__version__,
                           input_bytes=sum(_nbytes(x) for x in inputs))

    def op_expect(self, req: WorkerRequest) -> WorkerReply:
        """Move the input sets to the device (those drawn on the CPU) and compute every trial's expected outputs."""
        torch = _torch()
        self.atol, self.rtol = req.atol, req.rtol
        for name, inputs in self.sets.items():
            self.sets[name] = [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]
        self.expected: list[list[Any]] = []
        self.expected_metas: list[list[TensorMeta]] = []
        model = self.models["main"]
        with torch.no_grad():
            for trial in range(len(req.trial_seeds)):
                outs = as_list(model(*[_clone(x) for x in self.sets[f"trial{trial}"]]))
                _sync(self.device)
                if not all(type(o) is torch.Tensor for o in outs):
                    return WorkerReply(ok=False, error_kind="load_error",
                                       error="the reference returned something other than tensors")
                self.expected.append([o.detach() for o in outs])
                self.expected_metas.append([_meta(o) for o in outs])
        warning = degenerate_outputs(self.expected[0], self.atol, self.rtol) if self.expected else None
        return WorkerReply(ok=True, expected=self.expected_metas, warning=warning)

    def op_park(self, req: WorkerRequest) -> WorkerReply:
        """Another problem's candidates are judged on this lane meanwhile: free what only a timing needed (the
        last block's outputs and their storage, the allocator's cached blocks); the input sets and expected
        outputs stay."""
        self.kept, self.store = [], []
        if self.device == "cuda":
            flush.release_flush()
            if self.rotation is not None:
                self.rotation.flush = None  # a view: it would hold the buffer
            _torch().cuda.empty_cache()
        return WorkerReply(ok=True)

    def op_open_exchange(self, req: WorkerRequest) -> WorkerReply:
        self.op_close_exchange(req)
        self.exchange = Exchange.create(self.device, req.size, req.shm_dir, prefer_ipc=req.name != "shm")
        return WorkerReply(ok=True, exchange=self.exchange.info)

    def op_close_exchange(self, req: WorkerRequest) -> WorkerReply:
        if self.exchange is not None:
            self.exchange.close()
            self.exchange = None
        return WorkerReply(ok=True)

    def op_put(self, req: WorkerRequest) -> WorkerReply:
        """Write input set `name` into the exchange, for the candidate to copy out."""
        assert self.exchange is not None
        slots = self.exchange.write(self.sets[req.name or ""])
        _sync(self.device)
        return WorkerReply(ok=True, slots=slots)

    def store_keeper(self, first: int, calls: int) -> timing.Keeper:
        """While timed: each call's outputs copied into storage made before the block, as the candidate copies
        into the exchange, with the same host work after the call (describe, copy, wait): both keepers run
        inside the wall clock the clock check compares, so work one side did alone would count against it.
        Keeping fresh outputs (or fresh clones) instead makes every call of a block allocate new memory, which
        on a CPU means new pages: an A/A test then found the reference 1.5-1.9x slower than its own copy.
        `first`: the block's call index of this request's first call."""
        torch = _torch()
        template = self.expected[0] if getattr(self, "expected", None) else []
        while len(self.store) < first + calls:
            self.store.append([torch.empty_like(e) if isinstance(e, torch.Tensor) else None for e in template])

        def keeper(call: int, out: Any) -> Callable[[], list[Any]]:
            outs, slots = as_list(out), self.store[first + call]
            [_meta(o) for o in outs]  # the candidate's keeper describes its outputs too: the same host work

            def copy() -> list[Any]:
                if len(slots) != len(outs):
                    slots[:] = [None] * len(outs)
                for k, o in enumerate(outs):
                    if not isinstance(o, torch.Tensor):
                        slots[k] = None
                        continue
                    if slots[k] is None or slots[k].shape != o.shape or slots[k].dtype != o.dtype \
                            or slots[k].device != o.device:
                        slots[k] = torch.empty_like(o)
                    slots[k].copy_(o.detach())
                _sync(self.device)  # as the candidate's keeper waits for its copies into the exchange
                return list(slots)

            return copy

        return keeper

    def op_compare(self, req: WorkerRequest) -> WorkerReply:
        """Trial `trial`: the candidate's outputs, as it described them and as they lie in the exchange."""
        return WorkerReply(ok=True, check=self._compare(self.expected[req.trial], self.expected_metas[req.trial],
                                                        req.slots, req.outputs))

    def op_compare_timed(self, req: WorkerRequest) -> WorkerReply:
        """Every listed call of the last timed block, in full, against this worker's own outputs of that call."""
        worst = CheckResult(passed=True, max_abs_diff=0.0, mean_abs_diff=0.0)
        for call, slots, metas in zip(req.calls, req.layout, req.metas, strict=True):
            expected = self.kept[call]
            result = self._compare(expected, [_meta(e) for e in expected], slots, metas)
            if not result.passed:
                result.error = f"timed call {call}: {result.error}"
                return WorkerReply(ok=True, check=result)
            worst.max_abs_diff = max(worst.max_abs_diff or 0.0, result.max_abs_diff or 0.0)
            worst.mean_abs_diff = max(worst.mean_abs_diff or 0.0, result.mean_abs_diff or 0.0)
        return WorkerReply(ok=True, check=worst)

    def _compare(self, expected: list[Any], expected_metas: list[TensorMeta], slots: list[Slot],
                 metas: list[TensorMeta]) -> CheckResult:
        assert self.exchange is not None
        # on a GPU run over a shared file (CUDA IPC refused), the outputs are brought to the expected ones' device
        got: list[Any] = []
        if len(slots) == len(metas) == len(expected):
            try:
                got = [self.exchange.view(s).to(e.device) for s, e in zip(slots, expected, strict=True)]
            except (ValueError, RuntimeError) as exc:  # a slot outside the exchange or misaligned (the harness
                # checks first; what a candidate reported is never trusted here either)
                return CheckResult(passed=False, error=str(exc))
        result = compare_outputs(expected, expected_metas, got, metas, self.atol, self.rtol)
        return CheckResult(passed=result.passed, max_abs_diff=result.max_abs_diff,
                           mean_abs_diff=result.mean_abs_diff, error=result.error)


def draw_inputs(get_inputs: Callable[[], Any], seed: int, device: str) -> list[Any]:
    """The problem's input set for `seed`, made on `device` directly where its `get_inputs` allows, else on the CPU.

    Why: drawn on the CPU and copied over, a GPU run's sets cost seconds of one CPU thread's random numbers
    (problem 45: eight sets of 128 MB) before the first candidate; drawn on the GPU, milliseconds. A
    `get_inputs` that fails there (numpy, `.tolist()`) or makes any tensor elsewhere on purpose is drawn again
    on the CPU from the same seed, as before (moved to the device with the expected outputs). Either way one
    seed gives one set: each generator is deterministic for its seed.
    """
    torch = _torch()
    if device != "cpu":
        torch.manual_seed(seed)  # every device's generator
        try:
            with torch.device(device):
                drawn = list(get_inputs())
        except Exception:
            drawn = None
        if drawn is not None and all(x.device.type == torch.device(device).type
                                     for x in drawn if isinstance(x, torch.Tensor)):
            return drawn
    torch.manual_seed(seed)
    return list(get_inputs())


def _clone(x: Any) -> Any:
    return x.clone() if hasattr(x, "clone") else x
