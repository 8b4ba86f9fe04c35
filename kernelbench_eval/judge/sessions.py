"""What moves between timing sessions, and how much of it a speedup's interval must carry.

A session's own calls (`stats.speedup_ci`, a bootstrap of paired windows) cannot see what changes when a new
process times the same source: where its buffers and outputs lie, its threads, the host's state. The
reference's time per call over the problem's sessions (its time alone, then one per candidate) measures that
(`between_sessions`); pooled with a prior (`pooled`) it widens each interval (`widened`), and says so when an
interval cannot resolve a 10 % difference (`unresolved`). `rerun_interval` predicts where another session lands.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# What the between-session term assumes before it has seen sessions (a scaled inverse chi-square prior): the sd of
# log time per call between processes (0.15-0.24 % measured for a 94 us SiLU on an H100, docs/benchmarks.md;
# twice that here), worth PRIOR_DF sessions. With one or two sessions Student's t (12.7 at one degree of
# freedom) made intervals like [0.0, 180332]; the prior keeps the term honest and finite, and real sessions
# outweigh it as they come.
PRIOR_SD = 0.005
# On a CPU, two processes timing one op land further apart: on the 2-core CI box identical copies of KernelBench's
# level-1 activations came out 0.84-0.88 in one harness session and 1.08-1.13 in the next (every problem of a
# session shifted together; the low ones partly the order of calls around the check, halved since by
# `measure.block_order`), so the prior there is 5 %
PRIOR_SD_CPU = 0.05
PRIOR_ABS_MS = 0.00015  # and, for short calls, 0.15 us of absolute time: two processes timing one 6 us kernel
# differed by up to 4 % on an H200 (KernelBench level 1 at its 2025 sizes, docs/benchmarks.md)
# And on a GPU, calls up to about PRIOR_SHORT_MS move PRIOR_SHORT_SD more between processes: 398 identical copies of
# KernelBench levels 1-2 on H200s (both sizes, docs/benchmarks.md, "Between processes") landed +-1.1-1.3 % apart
# (robust sd of log speedup) at 10-80 us a call, tails to 10 %, against 0.05 % at 1 ms and more; with the two
# terms above alone, 64 of 77 intervals at 20-80 us held 1.0, with this one 74 (the 5-20 us band kept 30/30)
PRIOR_SHORT_SD = 0.012
PRIOR_SHORT_MS = 0.08
PRIOR_DF = 8
RESOLVES = 1.10  # an interval wider than this factor each side (sqrt(high / low)) cannot tell 10 % apart


# Two-sided 95 % quantiles of Student's t by degrees of freedom (beyond the table: the normal's 1.96).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000}


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with `df` degrees of freedom (a table's value at or below `df`)."""
    return next((_T975[k] for k in sorted(_T975, reverse=True) if df >= k), math.inf) if df < 120 else 1.96


def between_sessions(per_call: Sequence[float]) -> tuple[float, int] | None:
    """The standard deviation of log time per call over sessions of one process's model, with its degrees of
    freedom; None below two sessions. What one process's bootstrap cannot see: how much a time moves from one
    timing session (and process, and allocation) to the next."""
    logs = [math.log(x) for x in per_call if x > 0]
    if len(logs) < 2:
        return None
    return statistics.stdev(logs), len(logs) - 1


def prior_sd(time_ms: float | None = None, device: str = "cuda") -> float:
    """The between-session sd assumed before sessions are seen: PRIOR_SD (PRIOR_SD_CPU on a CPU), PRIOR_ABS_MS of
    `time_ms` where the call is short enough that the absolute floor dominates, and on a GPU the short-call term
    (PRIOR_SHORT_SD, fading out past PRIOR_SHORT_MS), each in quadrature."""
    base = PRIOR_SD_CPU if device == "cpu" else PRIOR_SD
    if not time_ms:
        return base
    short = 0.0 if device == "cpu" else PRIOR_SHORT_SD / (1 + (time_ms / PRIOR_SHORT_MS) ** 4)
    return math.sqrt(base**2 + (PRIOR_ABS_MS / time_ms) ** 2 + short**2)


def pooled(between: tuple[float, int], time_ms: float | None = None, device: str = "cuda") -> tuple[float, int]:
    """The between-session sd and its freedom with the prior (`prior_sd` worth PRIOR_DF sessions) pooled in."""
    sigma, df = between
    return math.sqrt((df * sigma**2 + PRIOR_DF * prior_sd(time_ms, device)**2) / (df + PRIOR_DF)), df + PRIOR_DF


def widened(interval: tuple[float, float], point: float, between: tuple[float, int] | None,
            time_ms: float | None = None, device: str = "cuda") -> tuple[float, float]:
    """`interval` around `point`, each side widened (in quadrature, on the log scale) by the between-session
    term of a ratio of two such times: sqrt(2) times `between`'s deviation (pooled with the prior, `pooled`, for
    calls of `time_ms` on `device`), at Student's t for its freedom. With no session seen yet (a CPU run's first
    candidate of a problem), the prior alone: a session's own calls never see what the next process changes."""
    if point <= 0 or interval[0] <= 0:
        return interval
    sigma, df = pooled(between or (0.0, 0), time_ms, device)
    extra = t975(df) * math.sqrt(2) * sigma
    low, high = math.log(point / interval[0]), math.log(interval[1] / point)
    return point * math.exp(-math.hypot(max(low, 0.0), extra)), point * math.exp(math.hypot(max(high, 0.0), extra))


def unresolved(interval: tuple[float, float] | None, within: tuple[float, float] | None,
               between: tuple[float, int] | None, time_ms: float | None = None, device: str = "cuda") -> str | None:
    """Why a speedup's interval cannot tell a RESOLVES difference apart (None when it can), naming the part that
    widened it: the session's own calls (`within`), or what moves between sessions (measured, or the prior),
    said in the verdict instead of leaving a reader to find an interval spanning orders of magnitude meaningful."""
    if interval is None or interval[0] <= 0:
        return "no interval: too few timed calls"
    factor = math.sqrt(interval[1] / interval[0])
    if factor <= RESOLVES:
        return None
    if within is not None and within[0] > 0 and math.sqrt(within[1] / within[0]) > RESOLVES:
        why = "its calls' times vary too much within the session"
    elif between is not None:
        why = (f"the reference's time moved between sessions (sd {between[0]:.1%} over {between[1] + 1}), "
               f"pooled with {prior_sd(time_ms, device):.1%} assumed")
    else:
        why = (f"two processes timing the same code differ by about {prior_sd(time_ms, device):.1%} on this "
               "kind of device, which one session cannot measure")
    return f"cannot resolve {RESOLVES - 1:.0%} differences (interval x/{factor:.2f}): {why}"


def rerun_interval(interval: tuple[float, float], point: float) -> tuple[float, float]:
    """Where another session's speedup for the same source lands, 95 %: a prediction interval.

    `interval` (the widened one) says where the true speedup lies; a second session's estimate has as much error
    again, independent of this one's, so the difference of the two has sqrt(2) times the spread, and the
    interval for it is sqrt(2) times as wide on the log scale (each side). With honest confidence intervals, two
    copies lie inside each other's confidence interval only 83 % of the time each way, but inside each other's
    rerun interval 95 % of the time."""
    if point <= 0 or interval[0] <= 0:
        return interval
    low, high = math.log(point / interval[0]), math.log(interval[1] / point)
    return point * math.exp(-math.sqrt(2) * max(low, 0.0)), point * math.exp(math.sqrt(2) * max(high, 0.0))
