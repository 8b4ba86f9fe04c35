"""The timing stage: the candidate interleaved with the reference, every timed call's output checked in full.

While timed, the candidate's outputs lie in the exchange (where its call put them, or copied there), and each
call's reply says where; the reference keeps its own. After each block (the hand-over is each call's reply,
inside the candidate's wall clock, so an answer computed only then shows as time its timer did not report)
the checker compares every call in full with what the
reference computed for the same call, while the candidate is frozen: a candidate that is right only for the
first calls is `incorrect`, and nothing is sampled or fingerprinted that it could fake. The candidate runs
only for its own blocks: it is stopped for the reference's and for the checks, and the reference is compared
with itself timed alone (`refguard`), so slowing the reference down is not a way to look fast.
"""

from __future__ import annotations

import time

from kernelbench_eval.common.exchange import item_bytes, slot_bytes
from kernelbench_eval.isolation import gpus
from kernelbench_eval.judge.candidate_run import CandidateRun
from kernelbench_eval.judge.measure import Call, TimedModel, measure
from kernelbench_eval.judge.plausibility import assess
from kernelbench_eval.judge.refguard import Agreement, Guard, StandIn
from kernelbench_eval.judge.timing_record import Interleaved, TimedResult, record
from kernelbench_eval.messages import Slot
from kernelbench_eval.requests import ExportRequest


class _WrongOutput(Exception):
    """A timed call's output failed its check: stop measuring, the candidate is incorrect."""


class _Overwritten(Exception):
    """A call's outputs lay over an earlier call's of the same block, left in place: measure again, a call a block."""


def time_candidate(run: CandidateRun) -> TimedResult | None:
    """Measure, and measure again once when the clocks disagree or the reference was slowed beside the candidate:
    a tampered timer or a disturbed reference does it every time, a burst of host load (a busy CPU box) rarely
    twice. Only the last measurement is reported. None when a timed call's output was wrong (the candidate is
    then `incorrect`, with the call)."""
    with run.stage("timing"):
        assert run.worker is not None
        run.ref.lender.feed(run.worker, run.ref.lender.timing_sets(), run.deadline, drop=True)
        for attempt in (1, 2):
            timed = _measure_once(run)
            if timed is None:
                return None
            verdict = assess(timed.ref, timed.cand, run.ref.settings.device, run.ref.timing.floor_ms(),
                             run.ref.settings.threads, run.ref.settings.timing)
            timed.agreement = _check_reference(run, timed)
            disturbed = timed.agreement is not None and timed.agreement.outcome == "disturbed"
            if (verdict.speedup_trusted and not disturbed) or attempt == 2:
                return record(run, timed, verdict, attempt)
    return None


def _check_reference(run: CandidateRun, timed: Interleaved) -> Agreement | None:
    """The interleaved reference against the reference alone (`refguard`), timed again in the interleaved
    cadence on a disagreement; the alone time refreshed when the machine changed. The candidate stays stopped
    throughout, and is let go after."""
    ref_side, guard = run.ref, timed.guard
    try:
        budget = min(max(ref_side.settings.timing_budget / 2, 1.0), run.deadline.left())
        stand_in = StandIn(timed.ref.idle_s)  # the candidate's turns, as the reference waited through them
        return ref_side.timing.recheck(timed.ref.event_ms, guard, budget, stand_in)
    finally:
        guard.release()
        if guard.broken:
            ref_side.checker.mark_broken()


def _measure_once(run: CandidateRun) -> Interleaved | None:
    """One measurement; again in blocks of one call if the candidate's model handed out one buffer twice in a
    block whose outputs stay in place (`carve`): the earlier call's outputs were gone before they were checked,
    through no fault of the answer. Only the new measurement counts."""
    try:
        return _measure_blocks(run, run.block_calls)
    except _Overwritten:
        run.block_calls = 1
        return _measure_blocks(run, 1)


def _measure_blocks(run: CandidateRun, calls_per_block: int) -> Interleaved | None:
    ref_side, settings = run.ref, run.ref.settings
    checker, lender = ref_side.checker, ref_side.lender
    assert checker.worker is not None and run.worker is not None
    layout = lender.timed_layout(calls_per_block)
    exchange_bytes = run.exchange_bytes

    def resume() -> None:
        """Before the candidate's block, outside its wall clock: let it run, and have its worker answer once, so
        its first timed call does not pay for waking a stopped process (the reference's worker never stops)."""
        if guard.release():
            run.worker.call(ExportRequest(), run.deadline.left())

    guard = Guard(run.worker, checker.worker, checker.sched)
    ref = TimedModel(checker.worker, before=guard.before_reference)
    cand = TimedModel(run.worker, layout=layout, before=resume)
    checked = in_place = 0

    def check(block: int, schedule: list[Call]) -> None:
        """After both models ran the block: every call compared in full, with the candidate stopped meanwhile
        (no thread of its own can write into the exchange while the checker reads it). Each call's reply said
        what its outputs looked like and where they lie: in their slots, or where the call put them (`carve`)."""
        nonlocal checked, in_place
        started = time.perf_counter()
        calls = list(range(len(schedule)))
        guard.hold()
        if calls_per_block > 1 and any(reply.overwrote for reply in cand.last):
            raise _Overwritten  # (in blocks of one call the worker compares nothing across calls: nothing to say)
        metas = [reply.metas[0] if reply.metas else [] for reply in cand.last]
        slots = [placed_slots(layout[i], reply.placed[0] if reply.placed else None, exchange_bytes)
                 for i, reply in enumerate(cand.last)]
        in_place += sum(1 for i, s in enumerate(slots) if s is not None and s != layout[i])
        bad = next((i for i, s in enumerate(slots) if s is None), None)
        if bad is not None:
            run.fail(f"block {block}, timed call {bad}: its outputs were reported where the exchange cannot hold "
                     "them (outside it, or off an element boundary)")
            raise _WrongOutput
        if ref_side.stateful:  # no output of a timed call is the reference's for that call: nothing to compare
            return
        result = ref_side.compare_timed(calls, [s for s in slots if s is not None], metas)
        run.tally.note_precision(result)
        run.tally.add_time("checks", time.perf_counter() - started)
        checked += len(calls)
        run.tally.note_diffs(result.max_abs_diff, result.mean_abs_diff)
        if not result.passed:
            run.fail(f"block {block}, {result.error} (every timed call is checked)")
            raise _WrongOutput

    gpu = ref_side.env.get(gpus.VISIBLE)  # the lane's GPU
    clocks = [gpus.sm_clock_mhz(gpu)] if settings.device == "cuda" else []
    started = time.monotonic()
    try:
        result = measure([ref, cand], lender.timing_sets(), settings, run.deadline, calls_per_block, check)
    except _WrongOutput:
        guard.release()
        return None
    except BaseException:
        guard.release()
        raise
    clocks += [gpus.sm_clock_mhz(gpu)] if clocks else []
    return Interleaved(ref, cand, result.blocks, checked, clocks, time.monotonic() - started, guard, in_place,
                  calls_per_block)


def placed_slots(slots: list[Slot], placed: list[Slot] | None, exchange_bytes: int) -> list[Slot] | None:
    """The slots a call's outputs are read from: `slots` (the layout's), each moved to the offset the
    candidate's worker reported, when it did. Only the offset is taken from the candidate: dtype and shape stay
    the reference's, and the bytes must lie inside the exchange and start on an element boundary. None when they
    do not (or the report does not match the layout), which fails the call."""
    if not placed:
        return slots
    if len(placed) != len(slots):
        return None
    moved = []
    for slot, where in zip(slots, placed, strict=True):
        if slot.dtype is None:
            moved.append(slot)
            continue
        offset, size = where.offset, slot_bytes(slot)
        if offset < 0 or offset + size > exchange_bytes or offset % item_bytes(slot.dtype) != 0:
            return None
        moved.append(slot.model_copy(update={"offset": offset}))
    return moved
