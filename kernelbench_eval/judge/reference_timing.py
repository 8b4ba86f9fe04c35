"""The reference's own time: its calls timed alone (what its interleaved time is checked against), its time in each
timing session so far (the between-session spread of every later interval), and the bandwidth floor of a call.

Apart from `reference` because these numbers change as candidates are judged (a refreshed alone time, one session
more per candidate), and only through the methods here, on the timing stage's word (`timing_stage`).
"""

from __future__ import annotations

from collections.abc import Callable

from kernelbench_eval.common import kbmethod
from kernelbench_eval.isolation.process import WorkerProcess
from kernelbench_eval.judge.checker import Checker
from kernelbench_eval.judge.lending import Lender
from kernelbench_eval.judge.measure import Deadline, TimedModel, measure
from kernelbench_eval.judge.refguard import Agreement, Guard, check_reference
from kernelbench_eval.judge.sessions import between_sessions
from kernelbench_eval.records import RunSettings


class ReferenceTiming:
    """The reference's times for one problem and lane, kept while its candidates are judged."""

    def __init__(self, checker: Checker, lender: Lender, settings: RunSettings, time_limit: float) -> None:
        self.checker, self.lender, self.settings, self.time_limit = checker, lender, settings, time_limit
        self.alone: list[float] = []  # its calls timed alone, what its interleaved time is checked against
        # its time per call in each timing session so far (`sessions.between_sessions`): on a GPU its time alone
        # is one (the flush makes alone and interleaved the same measurement), then one per candidate
        self.session_ms: list[float] = []
        self.bandwidth_gbs: float | None = None  # the device's, as the checker reports it
        self.event_overhead_ms: float | None = None

    def learn_device(self, bandwidth_gbs: float | None, event_overhead_ms: float | None) -> None:
        """What the checker measured of its device as the reference was loaded."""
        self.bandwidth_gbs, self.event_overhead_ms = bandwidth_gbs, event_overhead_ms

    def start(self, alone: list[float]) -> None:
        """Its first alone time (a stored baseline's, or measured now)."""
        self.alone = alone
        if self.settings.device == "cuda" and alone:
            self.session_ms = [kbmethod.per_call(self.settings.timing, alone)]  # the run's own statistic

    def time_alone(self, budget: float | None = None, between: Callable[[], None] | None = None) -> list[float]:
        """The reference's calls timed with nothing interleaved (no candidate, or one stopped), within `budget` s;
        `between` runs before each block, outside its clock (`refguard.StandIn`)."""
        assert self.checker.worker is not None
        settings = self.settings if budget is None else self.settings.model_copy(update={"timing_budget": budget})
        return self.measure_alone(self.checker.worker, Deadline(self.time_limit), settings, between)

    def measure_alone(self, worker: WorkerProcess, deadline: Deadline, settings: RunSettings | None = None,
                      between: Callable[[], None] | None = None) -> list[float]:
        """One model (`worker`'s) timed on the timing sets, in the cadence the lane's candidates are timed in."""
        timed = TimedModel(worker, before=between)
        measure([timed], self.lender.timing_sets(), settings or self.settings, deadline, self.lender.calls_per_block())
        return timed.event_ms

    def recheck(self, interleaved: list[float], guard: Guard, budget: float, between: Callable[[], None]
                ) -> Agreement | None:
        """Its interleaved calls against its time alone (`refguard.check_reference`), timed alone again on a
        disagreement, within `budget` s; the alone time refreshed when the machine changed. None: no alone time."""
        if not self.alone:
            return None
        agreement, self.alone = check_reference(interleaved, self.alone, self.settings.device, guard,
                                                lambda: self.time_alone(budget, between))
        return agreement

    def add_session(self, ref_ms: float, doubted: bool) -> tuple[float, int] | None:
        """Add this session to the problem's record unless it was doubted, and return the between-session spread
        for this candidate's interval (`sessions.between_sessions`), its session included. The session joins the
        record only when nothing in its timing was doubted: a candidate that disturbed the reference must not
        widen the intervals of the candidates judged after it."""
        if not doubted:
            self.session_ms.append(ref_ms)
            return between_sessions(self.session_ms)
        return between_sessions([*self.session_ms, ref_ms])

    def floor_ms(self) -> float | None:
        """The least a call can take on a GPU: reading its inputs once at the device's bandwidth."""
        if self.settings.device == "cuda" and self.bandwidth_gbs:
            return self.lender.input_bytes / (self.bandwidth_gbs * 1e9) * 1e3
        return None
