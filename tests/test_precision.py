"""`--precision`: casts of inputs and models (as KernelBench does), tolerance presets, settings keys, verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, kbeval, read_verdicts

from kernelbench_eval.common.precision import cast_inputs, cast_model, dtype_of, tolerance
from kernelbench_eval.records import RunSettings
from kernelbench_eval.requests import LoadRequest, PrepareRequest
from kernelbench_eval.worker.reference import CheckerWorker

PROBLEM = FIXTURES / "problems" / "tiny_linear_relu.py"
PY_HONEST = FIXTURES / "candidates" / "tiny_linear_relu" / "py_honest.py"


@pytest.mark.parametrize("precision, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_cast_inputs_casts_only_floating_tensors(precision: str, dtype: torch.dtype) -> None:
    x, idx = torch.rand(3), torch.arange(3)
    out = cast_inputs((x, idx, 7, "name"), precision)
    assert out[0].dtype == dtype and torch.allclose(out[0].float(), x, atol=1e-2)
    assert out[1] is idx and out[2] == 7 and out[3] == "name"  # integer tensors and non-tensors untouched


def test_fp32_is_the_identity() -> None:
    x = torch.rand(3)
    assert cast_inputs([x], "fp32")[0] is x and cast_inputs([x], None)[0] is x
    model = torch.nn.Linear(2, 2)
    assert cast_model(model, "fp32") is model and model.weight.dtype == torch.float32


def test_cast_model_and_errors() -> None:
    model = cast_model(torch.nn.Linear(2, 2), "bf16")
    assert model.weight.dtype == torch.bfloat16 and model.bias.dtype == torch.bfloat16
    assert cast_model(object, "fp16") is object  # no .to: left as it is, its outputs are checked anyway
    with pytest.raises(ValueError):
        dtype_of("fp8")


def test_tolerance_presets() -> None:
    assert tolerance("fp32") == (1e-2, 1e-2) and tolerance("fp16") == (1e-2, 1e-2)
    assert tolerance("fp32", "kernelbench") == (1e-4, 1e-4) and tolerance("bf16", "kernelbench") == (1e-2, 1e-2)
    with pytest.raises(ValueError):
        tolerance("fp32", "loose")


def test_precision_is_in_the_settings_key_but_fp32_keeps_old_keys() -> None:
    fp32 = RunSettings(device="cpu")
    legacy = RunSettings(device="cpu").model_dump(mode="json")
    del legacy["precision"], legacy["smoke"], legacy["account_launches"]  # added later: out of older keys
    del legacy["allow_reduced_precision"]  # issue 36: off keeps the keys of runs made before it
    del legacy["timing"]  # issue 35: the harness's own method (`--timing kbeval`) keeps them too
    import hashlib

    assert fp32.key() == hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()[:16]
    assert len({fp32.key(), RunSettings(device="cpu", precision="fp16").key(),
                RunSettings(device="cpu", precision="bf16").key()}) == 3
    assert RunSettings(device="cpu", precision="fp16").timing_key() != fp32.timing_key()  # inputs differ


def test_worker_prepares_and_loads_in_the_precision(tmp_path: Path) -> None:
    """The worker's call sites: inputs written in bf16, both models built in bf16, outputs bf16."""
    worker = CheckerWorker()
    prep = worker.op_prepare(PrepareRequest(path=str(PROBLEM), trial_seeds=[1], inputs_dir=str(tmp_path),
                                            precision="bf16", save_inputs=True))
    assert prep.ok and prep.input_shapes == ["bfloat16[8, 32]"]
    assert torch.load(tmp_path / "trial0.pt")[0].dtype == torch.bfloat16
    assert worker.sets["trial0"][0].dtype == torch.bfloat16  # the set candidates are fed from
    for path, cls in ((PROBLEM, "Model"), (PY_HONEST, "ModelNew")):
        loaded = CheckerWorker().op_load(LoadRequest(path=str(path), class_name=cls, device="cpu",
                                                     init_file=str(tmp_path / "init.pt"), init_seed=3,
                                                     precision="bf16"))
        assert loaded.ok
    worker.op_load(LoadRequest(path=str(PY_HONEST), class_name="ModelNew", device="cpu",
                               init_file=str(tmp_path / "init.pt"), init_seed=3, precision="bf16"))
    with torch.no_grad():
        out = worker.models["main"](*worker.sets["trial0"])
    assert out.dtype == torch.bfloat16


def test_eval_records_precision_and_tolerance(tmp_path: Path, build_cache: Path) -> None:
    """`--precision bf16 --tolerance kernelbench --atol 0.05`: the preset's rtol, the explicit atol, recorded."""
    kbeval("eval", str(PROBLEM), str(PY_HONEST), "--device", "cpu", "--precision", "bf16", "--tolerance",
           "kernelbench", "--atol", "0.05", "--trials", "1", "--no-compile-baseline", "--timing-budget", "0.2",
           "--reps", "10", "--warmup", "1", "--out", str(tmp_path), cache=build_cache)
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    settings = json.loads((run / "run.json").read_text())["settings"]
    assert settings["precision"] == "bf16" and settings["atol"] == 0.05 and settings["rtol"] == 1e-2
    verdict = read_verdicts(run)["py_honest"]
    assert verdict["precision"] == "bf16" and verdict["correct"] and verdict["problem_group"] is None


def test_unknown_precision_is_a_usage_error(build_cache: Path) -> None:
    proc = kbeval("eval", str(PROBLEM), str(PY_HONEST), "--device", "cpu", "--precision", "fp8", cache=build_cache,
                  check=False)
    assert proc.returncode == 2 and "fp8" in proc.stderr
