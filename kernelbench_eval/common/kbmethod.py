"""KernelBench's `cuda_event` timing (`--timing kernelbench`, `--timing kernelbench-2025`), reimplemented so that
runtimes can be compared with published ones, with every check of the harness still on.

KernelBench times a model (reference and candidate alike) with `time_execution_with_cuda_event`: WARMUP calls,
each followed by a synchronise, then one call a trial: synchronise, new start and end events, [flush], start
event, the call, end event, synchronise, the events' elapsed time; its runtime is the mean of the trials, and a
speedup is the reference's mean over the candidate's. Two versions are offered:

- `kernelbench` (src/kernelbench/timing.py today; its eval uses 100 trials): after the warm-up the allocator's
  cache is emptied, every trial first thrashes the L2 by writing a fresh 256 MB int64 tensor, and one more trial
  than asked for is run, the first discarded.
- `kernelbench-2025` (src/eval.py of January 2025, what most published numbers used): no flush, no discard.

What stays the harness's (`measure`, `timing_stage`): the calls are sent one at a time on inputs refilled for each call
(`refill.Rotation`, before the trial's synchronise, so the cache state the events see is the method's: flushed,
or in the 2025 method as hot as KernelBench's repeated inputs leave it), in blocks alternating between the
reference and the candidate, every timed call's outputs compared in full, the harness's wall clock checked against
the calls' times, work left on other streams timed device-wide, `--max-speedup`, the reference guarded against the
candidate and compared with itself timed alone (by this method too). What differs from KernelBench: inputs change
from call to call; the two models' trials alternate block by block instead of one model's all after the other's;
after each trial its outputs are copied for the check (before the next trial's synchronise); the reference is
timed again for every candidate. On the CPU (KernelBench times only CUDA) the calls are timed by the host clock,
with the same warm-up, trial counts and mean, and no flush.

Here: the method's constants and what the harness reads of it: `check`, `measured` and `calls` (for `measure`),
`is_kernelbench`, `per_call`, `rse`, `basis`. The timing itself runs in the worker (`worker/kbtiming.py`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import get_args

from kernelbench_eval.common.stats import per_call_ms, rse_per_call, window_means
from kernelbench_eval.records import RunSettings, TimingMethod

METHODS: tuple[str, ...] = get_args(TimingMethod)
OWN, CURRENT, JAN2025 = METHODS  # the harness's own (`percall`, `measure`); KernelBench's today; of January 2025
WARMUP = 3  # KernelBench's num_warmup
DISCARD = {CURRENT: 1, JAN2025: 0}  # trials run first and dropped (discard_first)


# -- harness side ----------------------------------------------------------------------------------------------


def check(method: str, cuda_graph: bool = False) -> None:
    """ValueError naming the option when `method` is unknown, or KernelBench's asked for with CUDA graphs."""
    if method not in METHODS:
        raise ValueError(f"--timing: {method!r}: use one of {', '.join(METHODS)}")
    if method != OWN and cuda_graph:
        raise ValueError(f"--cuda-graph: not with --timing {method} (KernelBench times plain calls)")


def is_kernelbench(method: str) -> bool:
    return method != OWN


def measured(settings: RunSettings) -> RunSettings:
    """The settings `measure` runs by: under KernelBench's method its warm-up count and exactly --reps calls,
    whatever their spread or the time they take (`--timeout` still holds), and no CUDA graph; else as they are."""
    if not is_kernelbench(settings.timing):
        return settings
    return settings.model_copy(update={"warmup": WARMUP, "max_reps": settings.reps, "timing_budget": math.inf,
                                       "cuda_graph": False})


def calls(settings: RunSettings, block: int, done: int) -> int:
    """Calls in `measure`'s next block of `block`, `done` made: under KernelBench's method the last block is cut
    to what --reps leaves (no call beyond its trials)."""
    return min(block, settings.reps - done) if is_kernelbench(settings.timing) else block


def per_call(method: str, samples: Sequence[float]) -> float:
    """What one call costs under `method`: KernelBench's mean of the calls, or the harness's `stats.per_call_ms`."""
    return statistics.fmean(samples) if is_kernelbench(method) else per_call_ms(samples)


def rse(method: str, samples: Sequence[float]) -> float:
    """The relative standard error of `per_call` (inf below two windows): for the mean, from the spread of the
    window means (`stats.window_means`: consecutive calls share a burst of load, so single calls would claim more
    precision than the calls hold)."""
    if not is_kernelbench(method):
        return rse_per_call(samples)
    windows = window_means(samples)
    center = statistics.fmean(windows) if windows else 0.0
    if len(windows) < 2 or center <= 0:
        return math.inf
    return statistics.stdev(windows) / math.sqrt(len(windows)) / center


def basis(method: str, device: str, calls: int) -> str:
    """What a verdict's runtimes, reference times and speedups measure under `method` (`Timing.basis`)."""
    if device == "cuda":
        how = ("a 256 MB L2 thrash before each, one more call run first and discarded" if method == CURRENT
               else "no flush")
        name = "kernelbench-cuda-event" if method == CURRENT else "kernelbench-2025-cuda-event"
    else:
        how = ("one more call run first and discarded; " if method == CURRENT else "") + \
            "KernelBench itself times only CUDA"
        name = "kernelbench-host-clock" if method == CURRENT else "kernelbench-2025-host-clock"
    return f"{name} (mean of {calls} calls after {WARMUP} warm-ups, {how})"
