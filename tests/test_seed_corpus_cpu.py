"""The README's CPU command on the seed corpus: real C++ compiles judged, CUDA candidates skipped with reason."""

from __future__ import annotations

import pytest
from conftest import ROOT, kbeval, read_verdicts
from timed import assert_timed_sanely, settled

pytestmark = pytest.mark.slow  # the whole seed corpus built and judged on the CPU: minutes

CPU_DIMS = ("--dim", "batch_size=2", "--dim", "height=32", "--dim", "width=32", "--dim", "input_size=256",
            "--dim", "hidden_size=512", "--dim", "num_groups=32")

EXPECTED_CPU = {
    "cpp_fused_bias_scale_sigmoid": "ok", "cpp_fused_epilogue": "ok", "cpp_divide_by_scale": "incorrect",
    "cpp_logsumexp": "ok", "cpp_logsumexp_forgot_max": "incorrect",
    "cpp_groupnorm_leakyrelu_x2": "ok", "cpp_forgot_double": "incorrect",
    "cpp_div_leakyrelu": "ok", "cpp_wrong_slope": "incorrect",
    "pytorch_mul": "ok", "undefined_fused_helpers": "runtime_error", "empty": "load_error",
    "fused_model_wrong_class": "load_error", "malformed_stray_or": "load_error", "pseudo_code_pass": "load_error",
    "torch_jit_script": "load_error",
}


def test_seed_corpus_on_cpu(tmp_path, build_cache):
    kbeval("run", "--device", "cpu", *CPU_DIMS, "--out", str(tmp_path), "--run-id", "seeds", "--trials", "3",
           "--reps", "20", "--no-compile-baseline", cache=build_cache)
    verdicts = read_verdicts(tmp_path / "seeds")
    assert len(verdicts) == len(list((ROOT / "candidates").glob("*/*.py")))
    for name, status in EXPECTED_CPU.items():
        assert settled(verdicts[name]["status"]) == settled(status), (name, verdicts[name]["error"])
        if status == "ok":
            assert_timed_sanely(verdicts[name], name)
    cuda_only = {n: v for n, v in verdicts.items() if n not in EXPECTED_CPU}
    assert cuda_only and all(v["status"] == "skipped" and "needs cuda" in v["error"] for v in cuda_only.values())
    assert (tmp_path / "seeds" / "report.html").exists() and (tmp_path / "seeds" / "junit.xml").exists()
