"""The statistics behind a timing claim: what one call costs, how stable that is, a speedup's interval, fast_p.

What a call costs is the median, over windows of WINDOW consecutive calls, of each window's mean: every call
in a window is paid for (a candidate that does ten calls' work in one and answers the other nine from what it
kept costs its real mean, where a median of calls would report the nine cheap ones), and one window slowed by a
preemption is outvoted by the others. A bootstrap interval, because a speedup of 1.02x means nothing unless its
interval excludes 1. `Samples` is the one type for per-call times: `measure` collects them, the records keep
their summary (`models.TimingStats.from_samples`), the reports read that. torch is imported only by the
bootstraps (they resample thousands of times), so the records can use this module without it.
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
WINDOW = 10  # consecutive calls whose mean is one observation: a block on the GPU, ten 1-call blocks on the CPU
MIN_WINDOWS = 5  # below 5 * WINDOW calls, windows shrink so that there are this many (one window has no spread)
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

    def per_call(self) -> float:
        """What one call costs (`per_call_ms`): what a runtime is reported as."""
        return per_call_ms(self)

    def rse_per_call(self) -> float:
        return rse_per_call(self)

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


def window_means(samples: Sequence[float], window: int = WINDOW) -> list[float]:
    """The mean of every run of `window` consecutive calls (n // window runs, the rest spread over them), and at
    least MIN_WINDOWS runs where there are that many calls: a single window's mean has no spread, and an
    interval bootstrapped from it would claim a precision its samples never showed (`95% CI 0.874-0.874`)."""
    n = len(samples)
    if n == 0:
        return []
    count = max(min(n, MIN_WINDOWS), n // window)
    bounds = [round(i * n / count) for i in range(count + 1)]
    return [math.fsum(samples[a:b]) / (b - a) for a, b in zip(bounds, bounds[1:], strict=False)]


def per_call_ms(samples: Sequence[float]) -> float:
    """What one call costs: the median of the window means (`window_means`)."""
    return statistics.median(window_means(samples))


def rse_per_call(samples: Sequence[float]) -> float:
    """Relative standard error of `per_call_ms`, from the spread of the window means (inf below two windows)."""
    return rse_of_median(window_means(samples))


def median_stderr(samples: Sequence[float]) -> float:
    """Standard error of the median, from the median absolute deviation (robust to outliers)."""
    if len(samples) < 2:
        return math.inf
    median = statistics.median(samples)
    mad = statistics.median(abs(x - median) for x in samples)
    return MEDIAN_SE * MAD_TO_SIGMA * mad / math.sqrt(len(samples))


def rse_of_median(samples: Sequence[float]) -> float:
    """Relative standard error of the median, from the median absolute deviation (robust to outliers)."""
    if len(samples) < 2:
        return math.inf
    median = statistics.median(samples)
    if median <= 0:
        return math.inf
    mad = statistics.median(abs(x - median) for x in samples)
    return MEDIAN_SE * MAD_TO_SIGMA * mad / math.sqrt(len(samples)) / median


def bootstrap_ci(groups: Sequence[Sequence[float]], combine: Callable[[list[torch.Tensor]], torch.Tensor],
                 confidence: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of `combine(medians of each group)`, each group resampled independently."""
    import torch

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


def _windows(samples: Sequence[float]) -> torch.Tensor:
    import torch

    return torch.tensor(window_means(list(samples)), dtype=torch.float64)


def _resampled(windows: torch.Tensor, idx: torch.Tensor, mean: bool = False) -> torch.Tensor:
    """The median of each resample, as `statistics.median` takes it (the middle two averaged); with `mean`, its
    mean (KernelBench's statistic, `kbmethod`: the windows are of equal size where the calls divide into them, and
    their mean is then the calls')."""
    import torch

    return windows[idx].mean(dim=1) if mean else torch.quantile(windows[idx], 0.5, dim=1)


def paired_windows(reference: Sequence[float], candidate: Sequence[float], resamples: int,
                   generator: torch.Generator, mean: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Bootstrap `per_call_ms` of two lanes timed side by side, resampling windows *in pairs*.

    Call i of each lane ran on the same inputs, moments apart, so a burst of host load slows both: resampling
    the lanes independently treats that shared slowness as signal, and consecutive calls share a burst, so
    resampling single calls treats one burst as many independent facts. Both made intervals far too narrow
    on a busy host (identical code at 0.67x with [0.66, 0.69]); resampling window i of both lanes together does
    not (a window is WINDOW consecutive calls: a block bootstrap).
    """
    import torch

    n = min(len(reference), len(candidate))
    ref, cand = _windows(list(reference)[:n]), _windows(list(candidate)[:n])
    idx = torch.randint(len(ref), (resamples, len(ref)), generator=generator)
    return _resampled(ref, idx, mean), _resampled(cand, idx, mean)


def unpaired_windows(samples: Sequence[float], resamples: int, generator: torch.Generator, mean: bool = False
                     ) -> torch.Tensor:
    """Bootstrap `per_call_ms` of one lane timed on its own (a baseline), resampling its windows."""
    import torch

    windows = _windows(samples)
    return _resampled(windows, torch.randint(len(windows), (resamples, len(windows)), generator=generator), mean)


def _interval(values: torch.Tensor, confidence: float) -> tuple[float, float]:
    import torch

    alpha = (1 - confidence) / 2
    low, high = torch.quantile(values, torch.tensor([alpha, 1 - alpha], dtype=torch.float64)).tolist()
    return low, high


def speedup_ci(reference: Sequence[float], candidate: Sequence[float], confidence: float = 0.95,
               resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0, mean: bool = False) -> tuple[float, float]:
    """95 % interval of per_call(reference) / per_call(candidate), the lanes' windows paired (`mean`: of the
    ratio of their means)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    if len(reference) != len(candidate):  # not timed side by side: nothing to pair
        return ratio_ci(reference, candidate, confidence, resamples, seed, mean)
    ref, cand = paired_windows(reference, candidate, resamples, generator, mean)
    return _interval(ref / cand, confidence)


def ratio_ci(numerator: Sequence[float], denominator: Sequence[float], confidence: float = 0.95,
             resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0, mean: bool = False) -> tuple[float, float]:
    """95 % interval of per_call(numerator) / per_call(denominator), measured apart (each resampled alone)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    top, bottom = (unpaired_windows(group, resamples, generator, mean) for group in (numerator, denominator))
    return _interval(top / bottom, confidence)


def chained_speedup_ci(base_other: Sequence[float], base_eager: Sequence[float], eager: Sequence[float],
                       candidate: Sequence[float], mean: bool = False) -> tuple[float, float]:
    """95 % interval of (other / eager) from the baseline times (eager / candidate) measured side by side."""
    import torch

    generator = torch.Generator().manual_seed(0)
    other, base = (unpaired_windows(group, BOOTSTRAP_RESAMPLES, generator, mean) for group in (base_other, base_eager))
    if len(eager) != len(candidate):
        ref, cand = (unpaired_windows(group, BOOTSTRAP_RESAMPLES, generator, mean) for group in (eager, candidate))
    else:
        ref, cand = paired_windows(eager, candidate, BOOTSTRAP_RESAMPLES, generator, mean)
    return _interval(other / base * ref / cand, 0.95)


def finite(value: float) -> float | None:
    """A number that survives the JSON round trip of a record (inf would come back as null): else None."""
    return value if math.isfinite(value) else None


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
