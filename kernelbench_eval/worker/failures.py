"""How an exception raised in a worker becomes its reply's error: a status and one line a person can act on.

Apart from the loop (`main.serve`) because a build's warm-up (`CandidateWorker.op_warmup`) names its failure the
same way.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

from kernelbench_eval.worker.tensors import _one_line

_BUILD_FAILURE = "Error building extension"
_BUILD_PATH = re.compile(r"^/\S*/")  # the private build directory in front of `main.cpp:6:25: error: ...`


def first_compiler_error(text: str) -> str | None:
    """The compiler's first `error` line, the one a person fixes first."""
    for line in text.splitlines():
        if "error:" in line:  # gcc `file:3:5: error: ...`, nvcc `file(3): error: ...`, `fatal error:`
            return _BUILD_PATH.sub("", line.strip())[:400]
    return None


def classify(exc: BaseException) -> tuple[str, str]:
    """(status, one-line message) for an exception raised while importing or running a model."""
    if isinstance(exc, SyntaxError):
        return "load_error", f"SyntaxError: {exc.msg} ({Path(exc.filename or '?').name}, line {exc.lineno})"
    text = str(exc)
    if _BUILD_FAILURE in text:
        return "compile_error", first_compiler_error(text) or _one_line(exc)
    if type(exc).__module__.startswith("triton.compiler"):  # a @triton.jit kernel that does not compile
        return "compile_error", _one_line(exc) + _candidate_frame(exc)
    where = _candidate_frame(exc)
    return "runtime_error", f"{_one_line(exc)}{where}"


def _candidate_frame(exc: BaseException) -> str:
    """` (file:line)` of the innermost frame outside torch and this package, to point at the culprit."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "site-packages" not in f.filename]
    frames = [f for f in frames if "kernelbench_eval" not in f.filename]
    return f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
