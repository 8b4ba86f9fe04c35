"""The statistics behind a timing claim: stability of a median, a speedup's confidence interval, fast_p.

Medians, not means, because one preempted call must not move the answer; a bootstrap interval, because
a speedup of 1.02x means nothing unless its interval excludes 1.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence

import torch

BOOTSTRAP_RESAMPLES = 2000
FAST_P = (0.0, 1.0, 1.5, 2.0)


def rse_of_median(samples: Sequence[float]) -> float:
    """Relative standard error of the median, from the median absolute deviation (robust to outliers)."""
    if len(samples) < 2:
        return math.inf
    median = statistics.median(samples)
    if median <= 0:
        return math.inf
    mad = statistics.median(abs(x - median) for x in samples)
    sigma = 1.4826 * mad  # the MAD of a normal sample, scaled to its standard deviation
    return 1.2533 * sigma / math.sqrt(len(samples)) / median  # sqrt(pi/2): the median's standard error


def bootstrap_ci(groups: Sequence[Sequence[float]], combine: Callable[[list[torch.Tensor]], torch.Tensor],
                 confidence: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of `combine(medians of each group)`, each group resampled independently."""
    generator = torch.Generator().manual_seed(seed)
    medians = []
    for group in groups:
        data = torch.tensor(list(group), dtype=torch.float64)
        idx = torch.randint(len(data), (resamples, len(data)), generator=generator)
        medians.append(data[idx].median(dim=1).values)
    values = combine(medians)
    alpha = (1 - confidence) / 2
    low, high = torch.quantile(values, torch.tensor([alpha, 1 - alpha], dtype=torch.float64)).tolist()
    return low, high


def speedup_ci(reference: Sequence[float], candidate: Sequence[float]) -> tuple[float, float]:
    """95 % interval of median(reference) / median(candidate)."""
    return bootstrap_ci([reference, candidate], lambda m: m[0] / m[1])


def chained_speedup_ci(base_other: Sequence[float], base_eager: Sequence[float], eager: Sequence[float],
                       candidate: Sequence[float]) -> tuple[float, float]:
    """95 % interval of (other / eager) from the baseline times (eager / candidate) measured side by side."""
    return bootstrap_ci([base_other, base_eager, eager, candidate], lambda m: m[0] / m[1] * m[2] / m[3])


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
