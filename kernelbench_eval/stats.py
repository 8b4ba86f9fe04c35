"""The statistics behind a timing claim, in one place: `Samples` (one model's per-call times, and what they
summarise to), the stability of a median, a speedup's confidence interval, fast_p.

Medians, not means, because one preempted call must not move the answer; a bootstrap interval, because
a speedup of 1.02x means nothing unless its interval excludes 1. `measure` collects `Samples`, the records
keep their summary (`models.TimingStats.from_samples`), the reports read that. torch is imported only by
the bootstrap (it resamples thousands of times), so the records can use this module without it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BOOTSTRAP_RESAMPLES = 2000
FAST_P = (0.0, 1.0, 1.5, 2.0)
MAD_TO_SIGMA = 1.4826  # the MAD of a normal sample, scaled to its standard deviation
MEDIAN_SE = 1.2533  # sqrt(pi/2): the median's standard error over the mean's, for normal samples


class Samples(list[float]):
    """Per-call times in milliseconds (or any per-call values): a list that knows its statistics."""

    def median(self) -> float:
        return statistics.median(self)

    def mean(self) -> float:
        return statistics.fmean(self)

    def median_stderr(self) -> float:
        return median_stderr(self)

    def rse(self) -> float:
        return rse_of_median(self)

    def summary(self) -> dict[str, float | int]:
        """Median, mean, spread and extremes, as `models.TimingStats` stores them."""
        if not self:
            raise ValueError("no timing samples")
        ordered = sorted(self)
        if len(ordered) >= 4:
            q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
        else:
            q1, q3 = ordered[0], ordered[-1]
        return {"median_ms": statistics.median(ordered), "mean_ms": statistics.fmean(ordered),
                "std_ms": statistics.pstdev(ordered) if len(ordered) > 1 else 0.0, "min_ms": ordered[0],
                "max_ms": ordered[-1], "iqr_ms": q3 - q1, "calls": len(ordered)}


def median_stderr(samples: Sequence[float]) -> float:
    """Standard error of the median, from the median absolute deviation (robust to outliers)."""
    if len(samples) < 2:
        return math.inf
    median = statistics.median(samples)
    mad = statistics.median(abs(x - median) for x in samples)
    return MEDIAN_SE * MAD_TO_SIGMA * mad / math.sqrt(len(samples))


def rse_of_median(samples: Sequence[float]) -> float:
    """Relative standard error of the median (`median_stderr` over the median)."""
    if len(samples) < 2:
        return math.inf
    median = statistics.median(samples)
    if median <= 0:
        return math.inf
    return median_stderr(samples) / median


def bootstrap_ci(groups: Sequence[Sequence[float]], combine: Callable[[list[torch.Tensor]], torch.Tensor],
                 confidence: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of `combine(medians of each group)`, each group resampled independently."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return _interval(combine([_resampled_medians(group, resamples, generator) for group in groups]), confidence)


def _resampled_medians(group: Sequence[float], resamples: int, generator: torch.Generator) -> torch.Tensor:
    """The medians of `resamples` bootstrap resamples of one group, calls drawn independently."""
    import torch

    data = torch.tensor(list(group), dtype=torch.float64)
    idx = torch.randint(len(data), (resamples, len(data)), generator=generator)
    return data[idx].median(dim=1).values


PAIR_RUN = 10  # consecutive pairs resampled together: host load lasts longer than one call


def paired_medians(reference: Sequence[float], candidate: Sequence[float], resamples: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Bootstrap medians of two models timed side by side, resampling *pairs* in runs of PAIR_RUN.

    Call i of each model ran on the same inputs, moments apart, so a burst of host load slows both: resampling
    the two independently treats that shared slowness as signal, and consecutive calls share a burst, so
    resampling single calls treats one burst as many independent facts. Both made intervals far too narrow
    on a busy host (identical code at 0.67x with [0.66, 0.69]); a moving-block bootstrap of pairs does not.
    """
    import torch

    ref = torch.tensor(list(reference), dtype=torch.float64)
    cand = torch.tensor(list(candidate), dtype=torch.float64)
    n = min(len(ref), len(cand))
    ref, cand = ref[:n], cand[:n]
    run = max(1, min(PAIR_RUN, n // 4 or 1))
    runs = -(-n // run)
    starts = torch.randint(n, (resamples, runs, 1), generator=generator)
    idx = ((starts + torch.arange(run)) % n).reshape(resamples, -1)[:, :n]  # circular, so every call counts alike
    return ref[idx].median(dim=1).values, cand[idx].median(dim=1).values


def _interval(values: torch.Tensor, confidence: float) -> tuple[float, float]:
    import torch

    alpha = (1 - confidence) / 2
    low, high = torch.quantile(values, torch.tensor([alpha, 1 - alpha], dtype=torch.float64)).tolist()
    return low, high


def speedup_ci(reference: Sequence[float], candidate: Sequence[float], confidence: float = 0.95,
               resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """95 % interval of median(reference) / median(candidate), the two models' samples paired call by call."""
    if len(reference) != len(candidate):  # not timed side by side: nothing to pair
        return bootstrap_ci([reference, candidate], lambda m: m[0] / m[1], confidence, resamples, seed)
    import torch

    generator = torch.Generator().manual_seed(seed)
    ref, cand = paired_medians(reference, candidate, resamples, generator)
    return _interval(ref / cand, confidence)


def chained_speedup_ci(base_other: Sequence[float], base_eager: Sequence[float], eager: Sequence[float],
                       candidate: Sequence[float]) -> tuple[float, float]:
    """95 % interval of (other / eager) from the baseline times (eager / candidate) measured side by side."""
    if len(eager) != len(candidate):
        return bootstrap_ci([base_other, base_eager, eager, candidate], lambda m: m[0] / m[1] * m[2] / m[3])
    import torch

    generator = torch.Generator().manual_seed(0)
    base = [_resampled_medians(group, BOOTSTRAP_RESAMPLES, generator) for group in (base_other, base_eager)]
    ref, cand = paired_medians(eager, candidate, BOOTSTRAP_RESAMPLES, generator)
    return _interval(base[0] / base[1] * ref / cand, 0.95)


def fast_p(entries: Iterable[tuple[bool, float | None]], p: float) -> float:
    """Share of candidates correct and faster than the baseline by more than p, judged on the interval's low end.

    One (correct, lower bound of the speedup interval) pair per candidate. For p = 0 this is the share of
    correct candidates; for p > 0 a candidate without an interval does not count as faster.
    """
    pairs = list(entries)
    if not pairs:
        return 0.0
    hits = sum(1 for correct, low in pairs if correct and (p == 0 or (low is not None and low > p)))
    return hits / len(pairs)
