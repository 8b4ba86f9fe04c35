"""The inputs of timed calls, made inside a worker: fixed buffers refilled before each call (`Rotation`).

No function of earlier calls' inputs may predict a call's: a candidate that memoises an answer (by pointer, by
value, by a few elements, by whatever a positive rescaling leaves alone) must meet inputs it has never seen.
So, per input, from the base sets the problem's own `get_inputs` drew (its domain, learned from those draws):

- a float input takes each element from one of two base sets, chosen afresh per element and call: its order,
  signs and argmax change from call to call, while each element keeps the distribution the problem drew it
  from (a nonnegative input stays nonnegative, zeros every draw shares stay zero) and no linear shortcut
  (W(s x) = s W x) can reuse an answer. Discrete values (integral, at most LEVELS of them: ±1 targets, 0/1
  labels stored as floats) are drawn afresh from those values. With one base set (what the memory plan keeps
  for the largest problems) or non-finite draws, a float input is its base times fresh factors (the call's
  common scale, JITTER wide per element): its values change, its order and signs barely.
- an integer input is drawn afresh, uniformly between the smallest and largest value the draws held: a
  permutation stays a permutation (a fresh one), a sorted one sorted; one the draws never changed is copied.
- a bool input is drawn afresh with the draws' share of True; a constant one is copied.

Deterministic in (base set, scale, seed) on a device type, so the checker computes the same call.
Before, float inputs were one base set times positive factors and integer inputs copied unchanged: argmax, sort
order, signs and anything computed from integers could be memoised from the first calls
(tests/fixtures/attacks_36: `sign_count/memo_signs`, `label_count/memo_labels`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

JITTER = 0.05  # each element's factor varies by this much around the call's common scale
LEVELS = 16  # a float input whose draws hold at most this many distinct integral values is discrete
PLACEMENTS = 2  # CUDA: input buffers at this many places in memory, taken in turn window by window


@dataclass(frozen=True)
class Domain:
    """What the draws of one input say about the values a call may get."""

    kind: str  # "float", "levels", "ints", "sorted", "permutation", "bools", "constant" or "other"
    lo: int = 0  # ints: the smallest value drawn
    hi: int = 0  # ints: the largest value drawn
    share: float = 0.0  # bools: the share of True
    finite: bool = True  # float: every value drawn was finite
    levels: torch.Tensor | None = None  # levels: the values drawn
    step: float = 0.0  # levels: their spacing where it is even (drawn in place), else 0


def learn(draws: list[object]) -> Domain:
    """The domain of one input from its draws (the base sets' tensors at one position). Each test runs over
    chunks (`_every`) or rejects on the first row first: an input can be a fifth of the device, and the memory
    plan counts no temporaries of its size."""
    first = draws[0]
    if not isinstance(first, torch.Tensor) or first.numel() == 0 or first.is_complex():
        return Domain("other")
    tensors = [d.detach() for d in draws if isinstance(d, torch.Tensor)]
    if first.is_floating_point():
        finite = all(_every(t, torch.isfinite) for t in tensors)
        if finite and all(_every(t, lambda c: c == c.round()) for t in tensors):
            levels = torch.unique(torch.cat([_head(t).unique() for t in tensors]))
            if len(levels) <= LEVELS and all(_every(t, lambda c, v=levels: torch.isin(c, v.to(c))) for t in tensors):
                return Domain("levels", levels=levels.cpu(), step=_even_step(levels.tolist()))
        return Domain("float", finite=finite)
    if all(torch.equal(t, first) for t in tensors[1:]) and (len(tensors) > 1 or first.numel() == 1):
        return Domain("constant")
    if first.dtype == torch.bool:
        share = sum(int(t.sum(dtype=torch.int64)) for t in tensors) / sum(t.numel() for t in tensors)
        return Domain("bools", share=share) if 0.0 < share < 1.0 else Domain("constant")
    lo, hi = min(int(t.min()) for t in tensors), max(int(t.max()) for t in tensors)
    if lo == hi:
        return Domain("constant")
    if hi >= torch.iinfo(first.dtype).max:  # no exclusive upper end to draw below
        return Domain("other")
    rows = [t.reshape(-1, t.shape[-1]) for t in tensors] if first.dim() and first.shape[-1] > 1 else []
    if rows and lo == 0 and hi == first.shape[-1] - 1 and all(_is_permutation(r) for r in rows):
        return Domain("permutation")
    if rows and all(bool((r[0].diff() >= 0).all()) and bool((r.diff(dim=-1) >= 0).all()) for r in rows):
        return Domain("sorted", lo, hi)
    return Domain("ints", lo, hi)


def _even_step(levels: list[float]) -> float:
    """The spacing of `levels` where every one is the first plus a multiple of it, else 0."""
    if len(levels) < 2:
        return 0.0
    step = (levels[-1] - levels[0]) / (len(levels) - 1)
    return step if all(v == levels[0] + j * step for j, v in enumerate(levels)) else 0.0


CHUNK = 1 << 24  # elements a test looks at at once


def _every(t: torch.Tensor, test) -> bool:
    flat = t.reshape(-1)
    return all(bool(test(flat[i:i + CHUNK]).all()) for i in range(0, flat.numel(), CHUNK))


def _head(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1)[:CHUNK]


def _is_permutation(rows: torch.Tensor) -> bool:
    """Each row a permutation of 0..n-1 (sorted a chunk of rows at a time)."""
    n = rows.shape[-1]
    step, arange = max(CHUNK // n, 1), torch.arange(n, device=rows.device)
    return all(torch.equal(part.sort(dim=-1).values, arange.expand(len(part), -1))
               for part in (rows[i:i + step] for i in range(0, len(rows), step)))


class Rotation:
    """Fixed input buffers, refilled before each call from base set `k` and the domains the base sets show.

    On a GPU there are PLACEMENTS copies of the buffers, allocated apart. Where a buffer lies changes a kernel's
    time (0.15-0.24 % for a 94 us SiLU on an H100, as much as between two processes: docs/benchmarks.md), and
    a process has one placement of its own: the timing takes them in turn, window by window, so one session's
    samples, and its interval, carry what a new process would change.
    """

    def __init__(self, bases: list[list[object]], placements: int = 1) -> None:
        self.bases = bases
        self.domains = [learn([base[i] for base in bases]) for i in range(len(bases[0]))]
        self.placements = [[x.clone() if isinstance(x, torch.Tensor) else x for x in bases[0]]
                           for _ in range(max(placements, 1))]
        self.live = self.placements[0]  # what a captured CUDA graph replays on
        self.generators: dict[torch.device, torch.Generator] = {}

    def fill(self, k: int, scale: float, seed: int, placement: int = 0) -> list[object]:
        """Deterministic in (k, scale, seed) on a device type, so the reference can compute the same call."""
        live_set = self.placements[placement % len(self.placements)]
        count = len(self.bases)
        other = (k + 1 + random.Random(seed).randrange(count - 1)) % count if count > 1 else k
        for i, (live, domain) in enumerate(zip(live_set, self.domains, strict=True)):
            if not isinstance(live, torch.Tensor):
                continue
            generator = self._generator(live.device).manual_seed((seed * 1009 + i) % (1 << 63))
            base, second = self.bases[k][i], self.bases[other][i]
            if domain.kind == "float" and domain.finite and other != k:
                # each element from base set k or `other`: a fair coin per element, then lerp with weights 0 or 1
                # written over the coins (five passes, no temporary)
                live.bernoulli_(0.5, generator=generator)
                torch.lerp(second, base, live, out=live)
            elif domain.kind == "float":
                # base times factors drawn uniformly in scale * [1 - J, 1 + J), in two passes and no temporary: a
                # fresh factor tensor and four more passes cost 71_Conv2d's 67 MB input 0.27 ms per timed call
                live.uniform_(scale * (1 - JITTER), scale * (1 + JITTER), generator=generator)
                live.mul_(base)
            elif domain.kind == "levels":
                assert domain.levels is not None
                if domain.step:  # in place
                    live.random_(0, len(domain.levels), generator=generator).mul_(domain.step)
                    live.add_(float(domain.levels[0]))
                else:
                    pick = torch.randint(len(domain.levels), live.shape, generator=generator, device=live.device)
                    live.copy_(domain.levels.to(live.device, live.dtype)[pick])
            elif domain.kind in ("ints", "sorted"):
                live.random_(domain.lo, domain.hi + 1, generator=generator)
                if domain.kind == "sorted":
                    live.copy_(live.sort(dim=-1).values)
            elif domain.kind == "permutation":
                keys = torch.rand(live.shape, generator=generator, device=live.device)
                live.copy_(keys.argsort(dim=-1))
            elif domain.kind == "bools":
                live.bernoulli_(domain.share, generator=generator)
            else:
                live.copy_(base)
        return live_set

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self.generators:
            self.generators[device] = torch.Generator(device=device)
        return self.generators[device]
