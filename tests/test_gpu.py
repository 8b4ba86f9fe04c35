"""The GPU path, end to end on a CUDA device (skipped where torch sees none)."""

from __future__ import annotations

import pytest
import torch
from conftest import FIXTURES, kbeval, read_verdicts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_fixture_corpus_on_cuda(tmp_path, build_cache):
    """CUDA candidates compile and pass; CPU-only C++ ones are skipped with the reason; faults stay contained."""
    kbeval("run", "--device", "cuda", "--problems", str(FIXTURES / "problems"),
           "--candidates", str(FIXTURES / "candidates"), "--timeout", "60", "--out", str(tmp_path),
           "--run-id", "gpu", cache=build_cache)
    verdicts = read_verdicts(tmp_path / "gpu")
    status = {name: v["status"] for name, v in verdicts.items()}
    assert status["cuda_relu"] == "ok" and status["py_honest"] == "ok"
    assert status["py_wrong_shape"] == "incorrect" and status["py_nan"] == "incorrect"
    assert status["py_empty"] == "incorrect"  # uninitialised GPU memory never holds the expected values
    assert status["py_mutates_input"] == "ok" and verdicts["py_mutates_input"]["mutates_inputs"]
    assert status["py_exit"] == "crashed" and status["missing_modelnew"] == "load_error"
    for name in ("cpp_honest", "cpp_wrong", "cpp_hang", "cpp_segfault"):
        assert status[name] == "skipped" and "needs cpu" in verdicts[name]["error"]
    ok = verdicts["cuda_relu"]
    assert ok["device"] == "cuda" and ("H100" in ok["device_name"] or "H200" in ok["device_name"])
    assert ok["runtime_stats"]["calls"] == 100 and ok["runtime_ms"] > 0 and ok["speedup"] > 0


def test_l2_flush_buffer_is_twice_the_l2():
    from kernelbench_eval.timing import l2_flush_buffer

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert l2 > 0 and l2_flush_buffer().numel() == 2 * l2
