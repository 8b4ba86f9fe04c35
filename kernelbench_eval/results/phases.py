"""Where a run's wall time went: building, opening references (their runs and baselines), judging, or nothing.

Why: at research scale a run is bound by one floor (the compilers, the GPUs, or the harness between them), and a
wall time alone cannot say which (issue 38). Each phase is entered and left around the work itself (a compile, a
reference opened ahead of its candidates, a candidate judged), from any thread; the account keeps, for every mix
of phases running at once, how long that mix lasted, for each phase its worker-seconds (two lanes judging for
10 s are 20 lane-seconds), and how many of its entries ran to their end (a rate needs the builds finished, not
the candidates a cut run was given). `kbeval run` writes it to `RUN_DIR/phases.json` (one entry per session: a
resume adds one) and `summary.json` carries it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from kernelbench_eval.store.atomic import write_atomic

PHASES = ("build", "reference", "judge")
FILE_NAME = "phases.json"


class Account:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: Counter[str] = Counter()
        self._started = self._since = time.monotonic()
        self._mixes: Counter[tuple[str, ...]] = Counter()  # phases running together -> seconds
        self._work: Counter[str] = Counter()  # phase -> worker-seconds
        self._done: Counter[str] = Counter()  # phase -> entries that ran to their end (an interrupted one did not)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with self._lock:
            self._tick()
            self._active[name] += 1
        finished = False
        try:
            yield
            finished = True
        finally:
            with self._lock:
                self._tick()
                self._active[name] -= 1
                self._done[name] += finished

    def _tick(self) -> None:
        now = time.monotonic()
        span = now - self._since
        self._mixes[tuple(p for p in PHASES if self._active[p] > 0)] += span
        for p in PHASES:
            self._work[p] += self._active[p] * span
        self._since = now

    def summary(self) -> dict[str, object]:
        """Seconds of wall time with each phase running (alone or beside others), with none (`idle`), and the
        worker-seconds of each; `bound` names the phase that was running for most of the wall time."""
        with self._lock:
            self._tick()
            mixes, work, wall, done = dict(self._mixes), dict(self._work), self._since - self._started, dict(self._done)
        running = {p: round(sum(s for mix, s in mixes.items() if p in mix), 3) for p in PHASES}
        only = {p: round(mixes.get((p,), 0.0), 3) for p in PHASES}
        busiest = max(PHASES, key=lambda p: running[p])
        return {"wall_s": round(wall, 3), "running_s": running, "alone_s": only,
                "idle_s": round(mixes.get((), 0.0), 3), "worker_s": {p: round(work.get(p, 0.0), 3) for p in PHASES},
                "done": {p: done.get(p, 0) for p in PHASES}, "bound": busiest if running[busiest] > 0 else "idle"}


def record(run_dir: Path, summary: dict[str, object]) -> None:
    """Add this session's account to `RUN_DIR/phases.json`."""
    path = run_dir / FILE_NAME
    try:
        sessions = json.loads(path.read_text())["sessions"]
    except (OSError, ValueError, KeyError, TypeError):
        sessions = []
    write_atomic(path, json.dumps({"sessions": [*sessions, summary]}, indent=2) + "\n")


def read(run_dir: Path) -> list[dict[str, object]]:
    """The sessions' accounts of a run (none for runs made before it existed)."""
    try:
        sessions = json.loads((run_dir / FILE_NAME).read_text())["sessions"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return sessions if isinstance(sessions, list) else []


def line(summary: dict[str, object]) -> str:
    """One line for the terminal (under 80 columns): where the wall time went (worker-seconds: phases.json)."""
    running = summary["running_s"]
    assert isinstance(running, dict)
    return (f"time {summary['wall_s']:.0f} s: build {running['build']:.0f} s, references {running['reference']:.0f} "
            f"s, judge {running['judge']:.0f} s, idle {summary['idle_s']:.0f} s ({summary['bound']}-bound)")
