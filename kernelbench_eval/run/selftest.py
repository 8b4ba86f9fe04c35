"""`kbeval selftest`: judge every problem's reference against an identical copy of itself.

The copy (`class ModelNew(Model): pass` appended to the problem's own source) goes through the normal
pipeline: same isolation, checks and timing. Its true speedup is exactly 1, so the run shows what the
harness gets wrong on this machine: a copy that is not `ok` is a false alarm (a check or a plausibility
rule misfiring), and intervals that exclude 1 more often than a 95 % interval may mean the interval is
too narrow (timing not stable enough here to claim small speedups).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from kernelbench_eval.discover.corpus import Candidate, Discovery, Problem, make_candidate
from kernelbench_eval.records import RunSettings, Verdict
from kernelbench_eval.results.formatting import number
from kernelbench_eval.run.pipeline import run
from kernelbench_eval.run.setup import RunOptions

CANDIDATE_ID = "selftest_copy"
CONFIDENCE = 0.95  # what each verdict's interval claims
FALSE_ALARM = 0.01  # the self-test's own chance of failing a harness whose intervals are right


@dataclass
class Row:
    """One problem's self-test: the copy's verdict, reduced to what tells whether the harness is right here."""

    problem: str
    status: str
    correct: bool
    speedup: float | None
    ci: tuple[float, float] | None
    ref_median_ms: float | None
    ref_spread: float | None  # the reference's IQR over its median: how noisy one call is here
    resolution: float | None  # sqrt(high / low): the smallest speedup this run could tell apart from 1
    excludes_one: bool
    error: str | None
    problem_warning: str | None


@dataclass
class Summary:
    rows: list[Row]
    not_ok: int
    excluded: int
    allowed: int  # intervals excluding 1 that chance explains (binomial bound at FALSE_ALARM)
    device_name: str | None = None  # where it was measured: a self-test's figures mean nothing without it
    torch_version: str | None = None

    @property
    def passed(self) -> bool:
        return self.not_ok == 0 and self.excluded <= self.allowed

    def to_json(self) -> dict:
        return {"passed": self.passed, "not_ok": self.not_ok, "excluded": self.excluded, "allowed": self.allowed,
                "confidence": CONFIDENCE, "device_name": self.device_name, "torch_version": self.torch_version,
                "rows": [asdict(r) for r in self.rows]}


def copy_source(problem_source: str) -> str:
    """A candidate that is the reference: the problem's own code, with ModelNew an empty subclass of Model."""
    return problem_source.rstrip("\n") + "\n\n\nclass ModelNew(Model):\n    pass\n"


def write_copies(problems: dict[str, Problem], candidates_dir: Path, only: list[str] | None = None
                 ) -> list[Candidate]:
    """Write `candidates_dir/<problem>/selftest_copy.py` for each problem (all, or those in `only`)."""
    copies = []
    for pid in sorted(pid for pid in problems if not only or pid in only):
        folder = candidates_dir / pid
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{CANDIDATE_ID}.py"
        path.write_text(copy_source(problems[pid].path.read_text()))
        copies.append(make_candidate(problems[pid], path))
    return copies


def resolution(ci: tuple[float, float] | None) -> float | None:
    """The smallest speedup (or, inverted, slowdown) this measurement could tell apart from 1.

    A speedup r measured with the same noise gets the interval r * [low/s, high/s]; it excludes 1 once r is
    beyond the interval's geometric half-width sqrt(high / low). So 1.05 means 5 % differences were visible.
    """
    if not ci or ci[0] <= 0:
        return None
    return math.sqrt(ci[1] / ci[0])


def allowed_exclusions(n: int, miss: float = 1 - CONFIDENCE, alpha: float = FALSE_ALARM) -> int:
    """The most intervals that may exclude 1 among n: the smallest k with P(Binomial(n, miss) > k) <= alpha."""
    tail = 1.0
    for k in range(n + 1):
        tail -= math.comb(n, k) * miss ** k * (1 - miss) ** (n - k)
        if tail <= alpha:
            return k
    return n


def row_of(verdict: Verdict) -> Row:
    ci = verdict.speedup_vs_eager_ci
    ref = verdict.ref_runtime_stats
    spread = ref.iqr_ms / ref.median_ms if ref and ref.median_ms > 0 else None
    excludes = bool(ci) and not (ci[0] <= 1.0 <= ci[1])
    return Row(problem=verdict.problem, status=verdict.status, correct=verdict.correct,
               speedup=verdict.speedup_vs_eager,
               ci=tuple(ci) if ci else None, ref_median_ms=ref.median_ms if ref else None, ref_spread=spread,
               resolution=resolution(ci), excludes_one=excludes, error=verdict.error,
               problem_warning=verdict.problem_warning)


def summarize(verdicts: list[Verdict]) -> Summary:
    rows = [row_of(v) for v in verdicts]
    timed = [r for r in rows if r.ci]
    first = verdicts[0] if verdicts else None
    return Summary(rows=rows, not_ok=sum(r.status != "ok" for r in rows), excluded=sum(r.excludes_one for r in rows),
                   allowed=allowed_exclusions(len(timed)), device_name=first.device_name if first else None,
                   torch_version=first.torch_version if first else None)


def selftest(problems_dir: Path, problems: dict[str, Problem], settings: RunSettings, only: list[str] | None = None,
             results_dir: Path | None = None, **options: object) -> Summary:
    """Judge an identical copy of each problem's reference through `pipeline.run`.

    `problems` is what the caller found in `problems_dir`: the copies are paired with them here, so the run
    discovers nothing again.
    """
    with tempfile.TemporaryDirectory(prefix="kbeval-selftest-") as tmp:
        candidates = Path(tmp) / "candidates"
        copies = write_copies(problems, candidates, only)
        if not copies:
            raise FileNotFoundError(f"{problems_dir}: no problems to self-test")
        ids = [c.problem_id for c in copies]
        opts = RunOptions(problems_dir=problems_dir, candidates_dir=candidates, settings=settings,
                          results_dir=results_dir or Path(tmp) / "results", only=ids,
                          lanes=1 if settings.device == "cpu" else None, **options)  # a lane per GPU
        result = run(opts, found=Discovery(problems=problems, candidates=copies, warnings=[]))
    return summarize([v for v in result.verdicts if v.candidate == CANDIDATE_ID])


def lines(summary: Summary) -> list[str]:
    """The table people read: one line per problem, then the verdict on the harness."""
    out = [f"{'problem':40} {'status':11} {'speedup':>8} {'95% interval':>16} {'ref ms':>9} {'spread':>7} "
           f"{'resolves':>8}"]
    for r in summary.rows:
        ci = f"[{r.ci[0]:.3f}, {r.ci[1]:.3f}]" if r.ci else "-"
        mark = " *" if r.excludes_one else ""
        out.append(f"{r.problem[:40]:40} {r.status:11} {number(r.speedup, '.3f', missing='-'):>8} {ci:>16} "
                   f"{number(r.ref_median_ms, '.4g', missing='-'):>9} {number(r.ref_spread, '.1%', missing='-'):>7} "
                   f"{number(r.resolution, '.3f', missing='-'):>8}{mark}")
        for note in (r.error, r.problem_warning):
            if note:
                out.append(f"    {note}")
    out.append(f"{summary.not_ok} not ok; {summary.excluded} interval(s) exclude 1 (* above), at most "
               f"{summary.allowed} expected by chance: {'PASS' if summary.passed else 'FAIL'}")
    return out
