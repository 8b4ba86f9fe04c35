"""The memory budget: what the checker keeps on the device for one problem, so that it, the reference's calls and
a candidate's worker fit the device together (issue 34).

Why: the checker used to keep every input set (five trials, three timing bases) and every trial's expected
outputs on the device at once, and each candidate took its own copy of them all; at KernelBench's current
sizes (23_Softmax: 6.4 GB an input set) that is over 100 GB, and 7 of 19 problems ran out of memory on a
140 GB card that KernelBench's own flow (one input set at a time) judges them on. Now a plan (`plan`, a pure
function of measured sizes) decides what stays resident; what does not is made again when needed, from the
same secret seed (an input set: the draw is deterministic for its seed) or by the reference (a trial's
expected outputs: one more reference call, on the same inputs). Nothing about a verdict changes, only where
its inputs wait (tests judge the same candidates under a forced small budget, `BUDGET_VAR`).

What the device must hold at the worst moment, the timing (both workers at once):
- the checker: the timing bases, their live buffers (`placements` of them), every call of a block's outputs
  twice (the reference's kept outputs and its copy target), the exchange (an input set or a block's outputs),
  and what the reference's call allocates beyond its outputs (`transient`);
- a candidate: its own copy of the bases and live buffers, a block's outputs, and as much beyond them as the
  reference needs (`transient`: a candidate may well need more, and then runs out as a `runtime_error` naming
  memory, which the reference did not);
- and, when they fit, every trial's input set and expected outputs (the checker's, for the trials).
Dropped first: resident trial inputs (a draw costs milliseconds on a GPU), then resident expected outputs (a
reference call a trial), then the second input placement, then timing bases down to one. Where even that is over
the budget, the plan is `lean`: the candidate keeps no copy of its input sets but reads them where the checker put
them in the exchange (which then holds an input set and a block's outputs side by side, not in turn), and refills
its live buffers from there. An input set the candidate writes over there is only its own inputs changed: the
checker computes the reference from its private copies. The checker then keeps nothing of a timing between
candidates either (its base set is drawn again for each timing, its live buffers made again), and computes a
trial's expected outputs on the set it drew for them, without a copy: the peak is what `peak_bytes` counts (a
measured run that held them all ran out on an 80 GB card: 48.5 GiB held, 16 more asked).
45_Average_Pooling_2D at its current size (17.2 GB an input set) on an 80 GB card: about 92 GB at the
least plan, about 76 GB lean.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

BUDGET_VAR = "KBEVAL_MEMORY_BUDGET"  # bytes the checker and a candidate may use together ("512M", "2G"); tests
SHARE = 0.9  # of the device's free memory when the checker starts (the CUDA contexts and the allocator's slack
FIXED_BYTES = 1 << 30  # per process: its CUDA context, the flush buffer, the allocator's rounding
KEPT_BYTES = 512 << 20  # a timing block keeps a copy of every call's outputs until it is checked (`measure`)
DEVICE_BLOCK_BYTES = 3 << 30  # ...on a GPU, within this (copied into the exchange, or left in place there)
BLOCK_CALLS = 10  # calls a timing block holds at most (`measure.BLOCK_CALLS`)


@dataclass(frozen=True)
class Footprint:
    """What one problem's data takes, as the checker measured it."""

    input_bytes: int  # one input set
    output_bytes: int  # one call's outputs
    transient_bytes: int  # what a reference call allocated beyond its inputs and outputs, at its peak
    trials: int
    timing_sets: int  # base sets wanted for the timed calls
    block_bytes: int = 0  # a timing block's outputs, kept until the block is checked (0: one call's)
    placements: int = 1  # input placements wanted (CUDA: `refill.PLACEMENTS`)


@dataclass(frozen=True)
class Residency:
    """What the plan keeps on the device, and what it counted on."""

    trial_inputs: bool  # every trial's input set stays (else drawn again from its seed when a trial needs it)
    expected: bool  # every trial's expected outputs stay (else the reference computes them again per trial)
    timing_sets: int  # base sets the timed calls rotate through
    placements: int  # live input buffers per worker
    need_bytes: int  # the peak this plan counts on, both workers together
    budget_bytes: int
    fits: bool  # False: even the least resident plan is over the budget (it is used anyway; a candidate or the
    # reference may run out, and says so)
    lean: bool = False  # the candidate reads its input sets in the exchange instead of copying them

    def resident_bytes(self, fp: Footprint) -> int:
        """What the checker keeps between candidates (the lanes' memory share counts it)."""
        return (fp.trials * fp.input_bytes * self.trial_inputs + fp.trials * fp.output_bytes * self.expected
                + self.timing_sets * fp.input_bytes * (not self.lean))


def peak_bytes(fp: Footprint, trial_inputs: bool, expected: bool, timing_sets: int, placements: int,
               lean: bool = False) -> int:
    """Both workers' device memory at the worst moment of judging one candidate (see the module's docstring)."""
    block_outputs = max(fp.output_bytes, fp.block_bytes)
    exchange = fp.input_bytes + block_outputs if lean else max(fp.input_bytes, block_outputs)
    live = (timing_sets + placements) * fp.input_bytes
    checker = live + 2 * block_outputs + exchange + fp.transient_bytes
    candidate = (placements if lean else timing_sets + placements) * fp.input_bytes + block_outputs \
        + fp.transient_bytes
    trials = fp.trials * (fp.input_bytes * trial_inputs + fp.output_bytes * expected)
    during_trials = (fp.input_bytes + fp.output_bytes + exchange + fp.transient_bytes  # the checker, one trial
                     + fp.input_bytes + 2 * fp.output_bytes + fp.transient_bytes)  # the candidate, its two runs
    return max(checker + candidate, during_trials) + trials + 2 * FIXED_BYTES


def block_bytes(output_bytes: int, device: str) -> int:
    """The most a timing block's outputs take (`measure.block_calls`: up to BLOCK_CALLS calls within KEPT_BYTES
    on the CPU, within DEVICE_BLOCK_BYTES on a GPU), at least one call's."""
    cap = DEVICE_BLOCK_BYTES if device == "cuda" else KEPT_BYTES
    return max(output_bytes, min(output_bytes * BLOCK_CALLS, cap))


def plan(fp: Footprint, budget: int) -> Residency:
    """The most resident plan within `budget` (see the order in the module's docstring)."""
    choices = [(True, True, fp.timing_sets, fp.placements), (False, True, fp.timing_sets, fp.placements),
               (False, False, fp.timing_sets, fp.placements)]
    if fp.placements > 1:
        choices.append((False, False, fp.timing_sets, 1))
    choices += [(False, False, sets, 1) for sets in range(fp.timing_sets - 1, 0, -1)]
    for trial_inputs, expected, sets, placements in choices:
        need = peak_bytes(fp, trial_inputs, expected, sets, placements)
        if need <= budget:
            return Residency(trial_inputs, expected, sets, placements, need, budget, True)
    trial_inputs, expected, sets, placements = choices[-1]
    least = peak_bytes(fp, trial_inputs, expected, sets, placements)
    lean = peak_bytes(fp, False, False, 1, 1, lean=True)
    if lean < least:  # the candidate's copy of its inputs given up (see the module's docstring)
        return Residency(False, False, 1, 1, lean, budget, lean <= budget, lean=True)
    return Residency(trial_inputs, expected, sets, placements, least, budget, False)


def parse_bytes(text: str) -> int:
    """`4096`, `512M`, `2G`, `1.5GiB` -> bytes; ValueError naming the text otherwise."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not found:
        raise ValueError(f"{BUDGET_VAR}={text!r}: expected bytes, e.g. 512M or 2G")
    return int(float(found.group(1)) * 1024 ** "_kmgt".index(found.group(2) or "_"))


def forced_budget() -> int | None:
    """The budget forced by `BUDGET_VAR`, if any (tests, and users who share a card with other work)."""
    text = os.environ.get(BUDGET_VAR)
    return parse_bytes(text) if text else None


OUT_OF_MEMORY = ("out of memory", "not enough memory", "can't allocate memory")  # how allocators say it
_ASKED = re.compile(r"tried to allocate\s+([\d.]+)\s*(bytes|[kmgt]i?b|b)\b", re.IGNORECASE)


def names_memory(text: str) -> bool:
    """Whether an error's text is an allocation that failed (CUDA's caching allocator, the host's)."""
    low = text.lower()
    return any(words in low for words in OUT_OF_MEMORY) or "outofmemoryerror" in low


def asked_bytes(text: str) -> int | None:
    """The bytes a failed allocation asked for, as CUDA's ("Tried to allocate 16.00 GiB") or the host's
    allocator ("you tried to allocate 100000 bytes") says it; None where the text does not say."""
    found = _ASKED.search(text)
    if not found:
        return None
    unit = found.group(2).lower()
    scale = 1 if unit in ("b", "bytes") else (1024 if "i" in unit else 1000) ** ("kmgt".index(unit[0]) + 1)
    return int(float(found.group(1)) * scale)


def gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"
