"""What a run shows while it works: one row per phase (building, baselines, judging), each with what is in flight.

Compiles can take minutes, so a bar that moved only when a verdict landed looked stuck. The rows are fed by
a thin wrapper around the backend (every compile and every lane call passes through it) and by each
recorded verdict; they are sized to stay on one line each at 80 columns.
"""

from __future__ import annotations

import threading
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column

from kernelbench_eval.building.compile import Compiled
from kernelbench_eval.building.jitwarmup import WarmupSpec
from kernelbench_eval.discover.corpus import Candidate, Problem
from kernelbench_eval.records import Verdict
from kernelbench_eval.run.lanes import LaneConfig, LaneHandle, LaneResult, Prepared
from kernelbench_eval.run.plan import Plan


def short(problem_id: str, candidate_id: str | None = None) -> str:
    """`45/cpp_logsumexp` for KernelBench's numbered problem ids; the full id otherwise."""
    head = problem_id.split("_", 1)[0]
    name = head if head.isdigit() else problem_id
    return f"{name}/{candidate_id}" if candidate_id else name


class RunProgress:
    """The rows on stderr; `observe` goes into `RunOptions.observe`, `verdict` is the run's listener."""

    def __init__(self, console: Console, plan: Plan) -> None:
        names = Column(no_wrap=True, overflow="ellipsis", ratio=1)
        self.bar = Progress(TextColumn("{task.description:<9}"), BarColumn(bar_width=12), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.fields[names]}", table_column=names),
                            console=console, transient=False, expand=True)
        self._lock = threading.Lock()
        self._flight: dict[TaskID, list[str]] = {}
        self.build = self._task("building", plan.build)
        self.baselines = self._task("baselines", plan.problems)
        self.judge = self._task("judging", plan.judge)
        self._opened: set[str] = set()

    def _task(self, name: str, total: int) -> TaskID:
        task = self.bar.add_task(name, total=total, names="", visible=total > 0)
        self._flight[task] = []
        return task

    def __enter__(self) -> RunProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(None, None, None)

    def observe(self, backend):  # a run.setup.Backend in, one out
        return _ObservedBackend(backend, self)

    def verdict(self, verdict: Verdict) -> None:
        self.bar.update(self.judge, advance=1)

    def start(self, task: TaskID, name: str) -> None:
        with self._lock:
            self._flight[task].append(name)
            self._show(task)

    def finish(self, task: TaskID, name: str, advance: int = 1) -> None:
        with self._lock:
            if name in self._flight[task]:
                self._flight[task].remove(name)
            self.bar.update(task, advance=advance)
            self._show(task)

    def opening(self, problem: Problem) -> bool:
        """True the first time any lane takes this problem: its reference (and baselines) are prepared now."""
        with self._lock:
            first = problem.problem_id not in self._opened
            self._opened.add(problem.problem_id)
        return first

    def _show(self, task: TaskID) -> None:
        flight = self._flight[task]
        text = ", ".join(flight[:3]) + (f" +{len(flight) - 3}" if len(flight) > 3 else "")
        self.bar.update(task, names=text)


class _ObservedBackend:
    """The run's backend, reporting each compile's start and end to the progress rows."""

    def __init__(self, inner, progress: RunProgress) -> None:
        self.inner, self.progress, self.name = inner, progress, inner.name

    def compile(self, cand: Candidate, device: str, cache_dir: Path, log: Path, timeout: float,
                warm: WarmupSpec | None = None) -> Compiled:
        name = short(cand.problem_id, cand.candidate_id)
        self.progress.start(self.progress.build, name)
        try:
            return self.inner.compile(cand, device, cache_dir, log, timeout, warm)
        finally:
            self.progress.finish(self.progress.build, name)

    def lanes(self, config: LaneConfig, gpus: list[str] | None, count: int | None) -> list[LaneHandle]:
        return [_ObservedLane(lane, self.progress) for lane in self.inner.lanes(config, gpus, count)]

    def close(self) -> None:
        self.inner.close()


class _ObservedLane:
    """One lane: shows the candidate it judges and, the first time a problem is taken, its reference/baselines."""

    def __init__(self, inner: LaneHandle, progress: RunProgress) -> None:
        self.inner, self.progress = inner, progress

    def evaluate(self, problem: Problem, path: Path, compiled: Compiled, ref_log: Path, log: Path) -> LaneResult:
        name = short(problem.problem_id, Path(path).stem)
        opening = self.progress.opening(problem)
        rows = [self.progress.judge] + ([self.progress.baselines] if opening else [])
        for row in rows:
            self.progress.start(row, short(problem.problem_id) if row == self.progress.baselines else name)
        try:
            return self.inner.evaluate(problem, path, compiled, ref_log, log)
        finally:
            if opening:
                self.progress.finish(self.progress.baselines, short(problem.problem_id))
            self.progress.finish(self.progress.judge, name, advance=0)  # the verdict itself advances the row

    def has_build(self, compiled: Compiled) -> bool:
        return self.inner.has_build(compiled)

    def prepare(self, problem: Problem, ref_log: Path) -> Prepared | None:
        opening = self.progress.opening(problem)
        if opening:
            self.progress.start(self.progress.baselines, short(problem.problem_id))
        try:
            return self.inner.prepare(problem, ref_log)
        finally:
            if opening:
                self.progress.finish(self.progress.baselines, short(problem.problem_id))

    def holds(self) -> list[str]:
        return self.inner.holds()

    def close(self) -> None:
        self.inner.close()
