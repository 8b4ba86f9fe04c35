"""A model's CUDA-graph replay on its rotation's fixed input buffers (`--cuda-graph`), checked once against a plain
call.

Apart from `percall` because capturing is a job of its own, done once per worker before its first timed block:
`time_block` times whatever it is handed, a plain call or this replay.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernelbench_eval.worker.percall import keep
from kernelbench_eval.worker.refill import Rotation


def capture_graph(model: Callable[..., object], rotation: Rotation) -> tuple[Callable[[], object] | None, str | None]:
    """A CUDA-graph replay of the model on the fixed input buffers, or (None, why) when it cannot be captured."""
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    saved = generator.clone_state() if hasattr(generator, "clone_state") else None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model(*rotation.live)
        torch.cuda.current_stream().wait_stream(side)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph, capture_error_mode="global"):  # legacy-stream launches fail loudly
            static_out = model(*rotation.live)
    except Exception as exc:  # any capture failure falls back to plain calls
        torch.cuda.synchronize()
        # a failed capture leaves the default generator capturing: every later random draw on the device (the
        # candidate's dropout, a test's torch.rand) raised "Offset increment outside graph capture"
        if saved is not None:
            generator.graphsafe_set_state(saved)
        return None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"

    def replay() -> object:
        cuda_graph.replay()
        return static_out

    if not _replay_matches(model, rotation, replay):
        return None, "a graph replay differs from a plain call (work launched outside the captured stream?)"
    return replay, None


def _replay_matches(model: Callable[..., object], rotation: Rotation, replay: Callable[[], object]) -> bool:
    """A captured graph that does not redo the whole call (a kernel launched on another stream ran eagerly
    during capture and is missing) would be timed, and checked, as something else: compare once."""
    inputs = rotation.fill(0, 1.0, 0x5EED)
    replayed = keep(replay())
    plain = keep(model(*inputs))
    torch.cuda.synchronize()
    return len(replayed) == len(plain) and all(
        (a is None and b is None) or (a is not None and b is not None and a.shape == b.shape
                                      and torch.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True))
        for a, b in zip(replayed, plain, strict=True))
