"""The child side of every isolated process: imports, builds, runs and times one model.

Started by `process.WorkerProcess` as `python -m kernelbench_eval.worker.main --reply-fd N`, its role in its
environment (`messages.ROLE_VAR`). Requests arrive as JSON lines on stdin; replies go to the private pipe N, never
to stdout, which (with stderr) is the candidate's log. A reference's worker (the checker, `CheckerWorker`) holds
the inputs and expected outputs and compares; a candidate's (`CandidateWorker`) only ever sees inputs and its own
outputs. Each answers the ops of its own table (`OPS`) and refuses any other.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback
from typing import Any

from kernelbench_eval.building import pch
from kernelbench_eval.isolation import cores, sandbox  # timing binds the clocks before candidate code is imported
from kernelbench_eval.isolation.linux import die_with_parent, poll_readable
from kernelbench_eval.messages import ROLE_VAR, Reply, Role
from kernelbench_eval.requests import Request, parse_request
from kernelbench_eval.worker import workermemory
from kernelbench_eval.worker.candidate import CandidateWorker
from kernelbench_eval.worker.failures import classify
from kernelbench_eval.worker.reference import CheckerWorker
from kernelbench_eval.worker.tensors import _one_line
from kernelbench_eval.worker.timed import TimingWorker

ROLES: dict[str, type[TimingWorker]] = {"checker": CheckerWorker, "candidate": CandidateWorker}
# After these replies stdin is polled this long for the next timed call before sleeping on it: waking from a
# pipe costs tens of microseconds with the device idle. `export` woke a stopped candidate for its block; a timed
# call is followed by the block's next one within microseconds (`WorkerProcess.call_each`), or by nothing for
# a while (the block ended: a candidate is stopped then, a reference checks it).
NEXT_CALL_S = {"export": 0.002, "time": 0.0005}
KEEP_TIMING = frozenset({"export"})  # requests that allocate nothing on the device: the timing scope stays


def serve(reply_fd: int, role: Role) -> None:
    worker = ROLES[role]()
    deferred: BaseException | None = None  # what failed after a reply was written: the next reply says it
    for line in sys.stdin:
        req, refused = _read(line, role, worker)
        try:  # an answered (overlapped) call's device work, waited for now: the next request, read and parsed
            worker.settle_answered()  # while the device still computed, costs it no idle time
        except Exception as exc:
            deferred = exc
        op = req.op if req is not None else ""
        if op == "exit":
            break
        # no collection (0.1 s once torch is loaded) inside a timed call: it waits for a request of another kind
        if op == "time":
            gc.disable()
        else:
            gc.enable()
            if op not in KEEP_TIMING:
                worker.leave_timing()
        started = time.perf_counter()
        try:
            if deferred is not None:
                failed, deferred = deferred, None
                raise failed
            if req is None:
                print(f"kbeval: {refused}", file=sys.stderr, flush=True)
                reply = Reply(ok=False, error_kind="runtime_error", error=refused)
            else:
                reply = type(worker).OPS[op](worker, req)
        except Exception as exc:
            traceback.print_exc()
            status, message = classify(exc)
            if op in ("import", "load", "prepare") and status == "runtime_error":
                status = "load_error"
            reply = Reply(ok=False, error_kind=status, error=message)
        reply.seconds = time.perf_counter() - started
        if op != "time":  # (a timed call's reply carries nothing it does not need)
            reply.peak_bytes = workermemory.peak(worker.device)
            workermemory.give_back(op, worker.device)
            workermemory.trace(op, worker.device)
        sys.stdout.flush()
        _write_all(reply_fd, (reply.model_dump_json(exclude_defaults=True) + "\n").encode())
        if worker.device == "cuda" and op in NEXT_CALL_S:  # the next timed call is on its way
            poll_readable(sys.stdin.fileno(), NEXT_CALL_S[op])


def _read(line: str, role: Role, worker: TimingWorker) -> tuple[Request[Any] | None, str]:
    """The request on `line`, or None and why it is refused: it is no request, or not one of this role's ops."""
    try:
        req = parse_request(line)
    except ValueError as exc:
        return None, f"the {role}'s worker cannot read the request: {_one_line(exc)}"
    if req.op != "exit" and req.op not in type(worker).OPS:
        return None, f"the {role}'s worker answers no {req.op!r} request (its ops: {', '.join(sorted(worker.OPS))})"
    return req, ""


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def main() -> None:
    die_with_parent()  # no candidate outlives the harness, even one SIGKILLed
    cores.pin_self()  # a lane's cores or the builds', before any thread of torch's or the candidate's starts
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reply-fd", type=int, required=True)
    reply_fd = parser.parse_args().reply_fd
    role = os.environ.get(ROLE_VAR, "")
    if role not in ROLES:
        parser.error(f"{ROLE_VAR} is {role!r}: one of {', '.join(ROLES)} (the harness sets it)")
    confined = sandbox.enter_and_report(reply_fd)  # a candidate's worker: confined before its first request
    pch.enter(confined)  # a build's precompiled header, used only where this worker cannot rewrite it
    workermemory.allocator_settings()
    serve(reply_fd, role)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
