"""Launch accounting (`launches.py`), `kbeval profile`, the Triton build warm-up and Triton discovery."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, kbeval, read_verdicts

from kernelbench_eval.building.jitwarmup import WarmupSpec, build_env, needs_warmup
from kernelbench_eval.common.launches import (
    NO_CUSTOM_WARNING,
    Attribution,
    _cuda_units,
    is_custom_event,
    kernels_of,
    profile_model,
    warning_for,
)
from kernelbench_eval.common.marks import EXTENSION_MARK, INDUCTOR_MARK
from kernelbench_eval.discover.corpus import declared_devices
from kernelbench_eval.records import KernelCount
from kernelbench_eval.requests import WarmupRequest
from kernelbench_eval.worker.candidate import CandidateWorker
from kernelbench_eval.worker.failures import classify

PROBLEM = FIXTURES / "problems" / "tiny_linear_relu.py"
CANDIDATES = FIXTURES / "candidates" / "tiny_linear_relu"
TRITON = FIXTURES / "candidates_triton" / "tiny_linear_relu"
COMPILED = FIXTURES / "candidates_compile" / "tiny_linear_relu" / "torch_compile.py"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_triton_sources_need_cuda_and_a_warmup() -> None:
    for path in TRITON.glob("*.py"):
        source = path.read_text()
        assert declared_devices(source) == ("cuda",), path.name
        assert needs_warmup(source), path.name
    assert declared_devices("import torch\n# not triton: tritonish\n") is None
    assert not needs_warmup((CANDIDATES / "cpp_honest.py").read_text())
    env = build_env(Path("/cache/builds/abc"))
    assert env == {"TORCH_EXTENSIONS_DIR": "/cache/builds/abc/ext", "TRITON_CACHE_DIR": "/cache/builds/abc/triton"}


def test_pure_pytorch_counts_no_custom_kernel() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
    count = kernels_of(model, [torch.rand(2, 8)], "cpu")
    assert count.custom == 0 and count.library >= 2 and count.custom_share == 0.0
    assert warning_for(count) == NO_CUSTOM_WARNING
    assert warning_for(KernelCount(custom=1, library=1, custom_share=0.5)) is None and warning_for(None) is None


def test_a_dead_weak_proxy_in_the_process_does_not_break_the_profile() -> None:
    """The walk for live modules asks each object its type, not its `__class__` (which a weak proxy whose
    referent died answers with ReferenceError: torch.compile leaves such proxies behind)."""
    import weakref

    class Gone:
        pass

    gone = Gone()
    kept = [weakref.proxy(gone)]
    del gone
    count = kernels_of(torch.nn.ReLU(), [torch.rand(4)], "cpu")
    assert count.library >= 1 and len(kept) == 1


class _Event:
    """A profiler event as `_cuda_units` reads it."""

    def __init__(self, name: str, device: str, parent: _Event | None = None, kernels: tuple[str, ...] = ()):
        from torch.autograd import DeviceType

        self.name, self.cpu_parent = name, parent
        self.device_type = DeviceType.CUDA if device == "cuda" else DeviceType.CPU
        self.kernels = [_Event(k, "cuda") for k in kernels]
        self.time_range = type("Range", (), {"elapsed_us": lambda _self: 10.0})()


def test_what_torch_compile_launches_is_library_even_under_a_custom_looking_call() -> None:
    """Inductor's Triton launchers live in the Triton cache, which the harness puts in the build folder: their
    `launch` is marked like an extension's, and only the Inductor range above it says it is PyTorch's. The
    ranges' own GPU annotations are no kernels (on the H200 the Inductor range's counted as a custom one).
    (Issue 36: the extension ranges carry the profile's secret, `Attribution.mark`.)"""
    mark = EXTENSION_MARK + "0123abcd::"
    forward = _Event("kbeval::forward", "cpu")
    graph = _Event(INDUCTOR_MARK, "cpu", forward)
    launcher = _Event(mark + "launch", "cpu", graph)
    inductor_launch = _Event("cudaLaunchKernel", "cpu", launcher, ("triton_", ))
    own = _Event(mark + "relu_loop", "cpu", forward)
    own_launch = _Event("cudaLaunchKernel", "cpu", own, ("relu_kernel",))
    annotations = [_Event(name, "cuda") for name in ("kbeval::forward", INDUCTOR_MARK, mark + "launch",
                                                      mark + "relu_loop")]  # each range's, on the GPU
    events = [forward, graph, launcher, inductor_launch, own, own_launch, _Event("triton_", "cuda"),
              _Event("relu_kernel", "cuda"), *annotations]
    assert sorted((kind, name) for kind, name, _ in _cuda_units(events, Attribution(set(), mark))) == [
        ("custom", "relu_kernel"), ("library", "triton_")]


def test_custom_events_are_matched_by_name_and_address() -> None:
    functions = Attribution({("relu_loop", "0x7f00ab"), ("launch", None)})
    assert is_custom_event("<built-in method relu_loop of pybind11_builtins.record object at 0x7f00ab>", functions)
    assert not is_custom_event("<built-in method relu_loop of pybind11_builtins.record object at 0x7f0999>",
                               functions)  # same name, another module's function (torch's own, say)
    assert is_custom_event("<built-in function launch>", functions)
    # issue 36: a custom namespace's name alone is no evidence (a range can carry it): only an op whose kernel the
    # dispatcher says was registered from the candidate's own sources (tests/test_attacks_36.py)
    assert not is_custom_event("myext::fused_relu", functions)
    assert not is_custom_event("aten::addmm", functions) and not is_custom_event("kbeval::forward", functions)
    assert is_custom_event("triton/runtime/jit.py(700): run", functions)


# Native modules of the standard library that builds often ship as shared objects, with a cheap function each
# and its arguments: one stands in for a compiled extension (`_stand_in_extension`).
_STAND_INS = (("_bisect", "bisect_left", "[1, 2, 3], 2"), ("_csv", "field_size_limit", ""),
              ("_lzma", "is_check_supported", "1"), ("_struct", "calcsize", "'i'"))


def _stand_in_extension(tmp_path: Path) -> tuple[object, str, str]:
    """(module, function name, call arguments): a standard native module loaded again from `tmp_path`, outside
    the installed packages, as `load_inline` loads an extension from its build folder; skip if none is a file."""
    import importlib
    import importlib.util
    import shutil

    for name, function, args in _STAND_INS:
        try:
            origin = str(getattr(importlib.import_module(name), "__file__", "") or "")
        except ImportError:
            continue
        if origin.endswith(".so"):
            copy = tmp_path / Path(origin).name
            shutil.copyfile(origin, copy)
            spec = importlib.util.spec_from_file_location(name, copy)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module, function, args
    pytest.skip("no native module of this interpreter's standard library is a shared object")


def test_an_extension_called_from_python_is_custom_where_the_tracer_records_no_c_call(tmp_path: Path) -> None:
    """torch 2.11+cu130's Python tracer (H200 host) recorded no C call, so an extension's function called from
    Python showed as library time; the harness's marks show it without the tracer. The extension is a stand-in
    compiled by nobody, called through its module and through a name a candidate's module bound at import."""
    import types

    ext, function, args = _stand_in_extension(tmp_path)
    candidate = types.ModuleType("kbeval_test_candidate")
    candidate.ext = ext
    exec(f"bound = ext.{function}\ndef forward(x):\n    ext.{function}({args})\n    bound({args})\n"
         "    return x.relu()\n", candidate.__dict__)

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return candidate.forward(x)

    counted = profile_model(Model(), [torch.rand(2, 8)], "cpu", python_tracer=False)
    assert counted.count.custom == 2 and counted.count.library >= 1
    rows = {(r.name, r.kind): r.calls for r in counted.rows}
    assert rows[(f"{function} (extension)", "custom")] == 2 and ("aten::relu", "library") in rows
    restored = {type(getattr(ext, function)).__name__, type(candidate.bound).__name__}  # the originals, after
    assert restored == {"builtin_function_or_method"}
    assert profile_model(Model(), [torch.rand(2, 8)], "cpu").count.custom == 2  # with the tracer: counted once each


def test_build_warmup_calls_the_candidate_on_problem_shaped_inputs(tmp_path: Path) -> None:
    worker = CandidateWorker()
    worker._module(str(CANDIDATES / "py_honest.py"))  # what op_import did in the build worker
    req = WarmupRequest(path=str(CANDIDATES / "py_honest.py"), problem=str(PROBLEM), device="cpu",
                        dims={"batch_size": 2}, precision="bf16")
    assert worker.op_warmup(req).ok
    wrong_init = worker.op_warmup(req.model_copy(update={"path": str(CANDIDATES / "py_wrong_init.py")}))
    assert not wrong_init.ok and wrong_init.error_kind == "load_error"  # as when judged: one line, no traceback
    assert wrong_init.error.startswith("warm-up call on problem-shaped inputs: ModelNew(*init): TypeError: ")
    (tmp_path / "fixed.py").write_text("import torch\nclass ModelNew(torch.nn.Module):\n"
                                       "    def __init__(self, *args):\n        super().__init__()\n"
                                       "    def forward(self, x):\n        return x @ torch.ones(3, 3)\n")
    wrong_shape = worker.op_warmup(req.model_copy(update={"path": str(tmp_path / "fixed.py")}))
    assert not wrong_shape.ok and wrong_shape.error_kind == "runtime_error"  # sized for 3 features, given 32
    assert wrong_shape.error.startswith("warm-up call on problem-shaped inputs: RuntimeError: ")
    assert "\n" not in wrong_init.error + wrong_shape.error


def test_a_triton_kernel_that_does_not_compile_is_a_compile_error() -> None:
    error = type("CompilationError", (Exception,), {"__module__": "triton.compiler.errors"})
    assert classify(error("at 3:4: name 'tl.nope' is not defined"))[0] == "compile_error"
    assert classify(ValueError("at 3:4"))[0] == "runtime_error"


def test_warmup_specs_name_their_inputs() -> None:
    spec = WarmupSpec(PROBLEM, "ab" * 32, (("batch_size", 4),), "fp32", gpu="0")
    assert spec.key() == WarmupSpec(Path("/elsewhere.py"), "ab" * 32, (("batch_size", 4),), "fp32").key()
    assert len({spec.key(), replace(spec, precision="bf16").key(), replace(spec, dims=()).key(),
                replace(spec, problem_sha256="cd" * 32).key()}) == 4


def test_profile_pure_pytorch_candidate(build_cache: Path) -> None:
    proc = kbeval("profile", str(PROBLEM), str(CANDIDATES / "py_honest.py"), "--device", "cpu", "--json",
                  "--dim", "batch_size=2", cache=build_cache)
    report = json.loads(proc.stdout)
    cand, ref = report["candidate_profile"], report["reference"]
    assert cand["kernels"]["custom"] == 0 and cand["kernels"]["library"] >= 2
    assert {r["name"] for r in cand["rows"]} >= {"aten::linear", "aten::clamp_min"}
    assert {r["name"] for r in ref["rows"]} >= {"aten::linear", "aten::relu"}
    assert all(r["kind"] == "library" and r["calls"] >= 1 for r in cand["rows"] + ref["rows"])
    assert sum(r["share"] for r in ref["rows"]) == pytest.approx(1.0)


def test_profile_of_a_broken_candidate_says_why(build_cache: Path) -> None:
    proc = kbeval("profile", str(PROBLEM), str(CANDIDATES / "missing_modelnew.py"), "--device", "cpu",
                  cache=build_cache, check=False)
    assert proc.returncode == 1 and "load_error" in proc.stdout and "aten::linear" in proc.stdout  # reference shown


@pytest.mark.slow
@pytest.mark.slow  # torch.compile on the CPU: compiles C++
def test_profile_counts_torch_compile_as_library(build_cache: Path) -> None:
    """A candidate whose forward is torch.compile's (Inductor's C++ on the CPU): profiled, not a runtime_error,
    and all of it library, under one row for the compiled graph."""
    proc = kbeval("profile", str(PROBLEM), str(COMPILED), "--device", "cpu", "--json", cache=build_cache)
    cand = json.loads(proc.stdout)["candidate_profile"]
    assert cand["kernels"]["custom"] == 0 and cand["kernels"]["library"] >= 1
    assert ("torch.compile (inductor)", "library") in {(r["name"], r["kind"]) for r in cand["rows"]}


@pytest.mark.slow
def test_profile_counts_a_cpp_extension_as_custom(build_cache: Path) -> None:
    """The one C++ compile here: `ext.relu_loop` (pybind, no aten op) is the candidate's own call."""
    proc = kbeval("profile", str(PROBLEM), str(CANDIDATES / "cpp_honest.py"), "--device", "cpu", "--json",
                  cache=build_cache)
    report = json.loads(proc.stdout)
    cand = report["candidate_profile"]
    assert cand["kernels"]["custom"] == 1 and cand["kernels"]["library"] >= 1
    assert 0 < cand["kernels"]["custom_share"] < 1
    assert {(r["name"], r["kind"]) for r in cand["rows"]} >= {("relu_loop (extension)", "custom"),
                                                             ("aten::linear", "library")}
    assert report["reference"]["kernels"]["custom"] == 0


# --- GPU (the lead runs these on a GPU machine) ----------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name, custom", [("triton_honest", True), ("triton_torch_only", False)])
def test_profile_triton_on_cuda(name: str, custom: bool, build_cache: Path) -> None:
    pytest.importorskip("triton")
    proc = kbeval("profile", str(PROBLEM), str(TRITON / f"{name}.py"), "--device", "cuda", "--json",
                  cache=build_cache)
    kernels = json.loads(proc.stdout)["candidate_profile"]["kernels"]
    assert (kernels["custom"] >= 1) is custom and kernels["device"] == "cuda"


@pytest.mark.gpu
@needs_cuda
def test_profile_counts_torch_compile_as_library_on_cuda(build_cache: Path) -> None:
    """Inductor's Triton kernels, launched through launchers in the build folder's Triton cache: library."""
    pytest.importorskip("triton")
    proc = kbeval("profile", str(PROBLEM), str(COMPILED), "--device", "cuda", "--json", cache=build_cache)
    cand = json.loads(proc.stdout)["candidate_profile"]
    assert cand["kernels"]["custom"] == 0 and cand["kernels"]["library"] >= 1, cand["rows"]


@pytest.mark.gpu
@needs_cuda
def test_profile_cuda_extension_on_cuda(build_cache: Path) -> None:
    proc = kbeval("profile", str(PROBLEM), str(CANDIDATES / "cuda_relu.py"), "--device", "cuda", "--json",
                  cache=build_cache)
    rows = json.loads(proc.stdout)["candidate_profile"]["rows"]
    assert any(r["kind"] == "custom" and "relu_kernel" in r["name"] for r in rows)
    assert any(r["kind"] == "library" for r in rows)  # the linear layer's GEMM


@pytest.mark.gpu
@needs_cuda
def test_triton_fixtures_judged_on_cuda(tmp_path: Path, build_cache: Path) -> None:
    pytest.importorskip("triton")
    kbeval("run", "--device", "cuda", "--problems", str(FIXTURES / "problems"), "--candidates",
           str(FIXTURES / "candidates_triton"), "--dim", "batch_size=64", "--timeout", "120", "--out", str(tmp_path),
           "--run-id", "triton", "--no-compile-baseline", cache=build_cache)
    verdicts = read_verdicts(tmp_path / "triton")
    assert verdicts["triton_honest"]["correct"] and verdicts["triton_torch_only"]["correct"]
    assert verdicts["triton_wrong_mask"]["status"] == "incorrect"  # 1024 outputs, one 256-wide program
    bad = verdicts["triton_compile_error"]
    assert bad["status"] == "compile_error" and not bad["compiled"], bad
    assert bad["error"].startswith("warm-up call on problem-shaped inputs: ") and "\n" not in bad["error"]


PTXAS = """#!/bin/sh
case "$*" in *--version*) ;; *) echo "$PWD" >> {calls} ;; esac
exec {real} "$@"
"""


def _watch_ptxas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Triton's ptxas behind a wrapper that lists the folder of every compile it runs; returns that list's path."""
    triton = pytest.importorskip("triton")
    real = next((p for p in Path(triton.__file__).parent.rglob("ptxas") if p.is_file()), None)
    if real is None:
        pytest.skip("no ptxas in the triton package")
    calls = tmp_path / "ptxas-calls"
    # the wrapper writes its list beside the test, where a confined build worker may not write: Landlock off for
    # this instrumentation only (the other layers stay, and test_sandbox covers Triton builds confined)
    monkeypatch.setenv("KBEVAL_SANDBOX_OFF", "landlock")
    (tmp_path / "ptxas").write_text(PTXAS.format(calls=calls, real=real))
    (tmp_path / "ptxas").chmod(0o755)
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(tmp_path / "ptxas"))  # workers get TRITON_* from the harness
    return calls


@pytest.mark.gpu
@needs_cuda
def test_triton_kernels_compile_in_the_build_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel compile (a ptxas run, seen through a wrapper that answers version probes as ptxas does) runs
    in a build worker; each build's own Triton cache holds its kernel (the warm-up's time in its record); a
    rerun judges from the cache, compiling nothing."""
    calls = _watch_ptxas(tmp_path, monkeypatch)
    cache, cands = tmp_path / "cache", tmp_path / "candidates" / "tiny_linear_relu"
    cands.mkdir(parents=True)
    for name in ("triton_honest", "triton_wrong_mask"):
        (cands / f"{name}.py").write_bytes((TRITON / f"{name}.py").read_bytes())
    args = ("run", "--device", "cuda", "--problems", str(FIXTURES / "problems"), "--candidates",
            str(tmp_path / "candidates"), "--dim", "batch_size=64", "--timeout", "120", "--trials", "2",
            "--no-compile-baseline", "--out", str(tmp_path / "out"))
    kbeval(*args, "--run-id", "first", cache=cache)
    first = read_verdicts(tmp_path / "out" / "first")
    assert first["triton_honest"]["correct"] and first["triton_wrong_mask"]["status"] == "incorrect"
    compiled_in = calls.read_text().splitlines()
    assert compiled_in and all("kbeval-compile-" in where for where in compiled_in), compiled_in
    builds = sorted(cache.glob("builds/*-cuda-w*"))
    assert len(builds) == 2  # one per source, each with its own cache
    for build in builds:
        record = json.loads((build / "compile.json").read_text())["record"]
        assert record["ok"] and record["warmup_seconds"] > 0 and record["seconds"] >= record["warmup_seconds"]
        assert [p for p in (build / "triton").rglob("*.cubin") if "relu_kernel" in p.name]
        groups = [json.loads(g.read_text())["child_paths"] for g in (build / "triton").rglob("__grp__*.json")]
        assert groups and all(path.startswith(f"{build}/triton/") for g in groups for path in g.values())
    kbeval(*args, "--run-id", "again", cache=cache)
    again = read_verdicts(tmp_path / "out" / "again")
    assert again["triton_honest"]["correct"] and again["triton_honest"]["compile_cached"]
    assert calls.read_text().splitlines() == compiled_in  # judged twice, compiled once, at build time


@pytest.mark.gpu
@needs_cuda
def test_triton_on_ray_is_warmed_up_on_the_judging_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--backend ray`: the compile task holds no GPU, so the lane warms the build up (in a build worker, under
    the build's lock) before judging it; a kernel that does not compile is still a compile_error."""
    pytest.importorskip("ray")
    calls = _watch_ptxas(tmp_path, monkeypatch)
    cache, cands = tmp_path / "cache", tmp_path / "candidates" / "tiny_linear_relu"
    cands.mkdir(parents=True)
    for name in ("triton_honest", "triton_compile_error"):
        (cands / f"{name}.py").write_bytes((TRITON / f"{name}.py").read_bytes())
    kbeval("run", "--backend", "ray", "--device", "cuda", "--lanes", "1", "--problems", str(FIXTURES / "problems"),
           "--candidates", str(tmp_path / "candidates"), "--dim", "batch_size=64", "--timeout", "120", "--trials", "2",
           "--no-compile-baseline", "--out", str(tmp_path / "out"), "--run-id", "ray", cache=cache)
    verdicts = read_verdicts(tmp_path / "out" / "ray")
    honest, bad = verdicts["triton_honest"], verdicts["triton_compile_error"]
    assert honest["correct"] and honest["lane"].startswith("ray:"), honest
    assert bad["status"] == "compile_error" and not bad["compiled"], bad
    assert bad["error"].startswith("warm-up call on problem-shaped inputs: ")
    compiled_in = calls.read_text().splitlines()
    assert compiled_in and all("kbeval-compile-" in where for where in compiled_in), compiled_in
    records = [json.loads((b / "compile.json").read_text())["record"] for b in cache.glob("builds/*-cuda-w*")]
    (warmed,) = [r for r in records if r["ok"]]
    assert warmed["warmup_seconds"] > 0 and honest["compile_seconds"] >= warmed["warmup_seconds"]


def test_account_launches_fills_the_verdict(tmp_path: Path, build_cache: Path) -> None:
    """`--account-launches`: a correct pure-PyTorch candidate's verdict counts 0 custom kernels and says so;
    without the option no verdict is profiled (it costs seconds per candidate on a GPU)."""
    candidates = tmp_path / "candidates" / "tiny_linear_relu"
    candidates.mkdir(parents=True)
    (candidates / "py_honest.py").write_bytes((CANDIDATES / "py_honest.py").read_bytes())
    common = ("--device", "cpu", "--trials", "1", "--no-compile-baseline", "--timing-budget", "0.2", "--reps", "10",
              "--warmup", "1", "--timeout", "60")
    for flag, run_id in ((("--account-launches",), "with"), ((), "without")):
        kbeval("run", "--problems", str(FIXTURES / "problems"), "--candidates", str(tmp_path / "candidates"),
               *common, *flag, "--out", str(tmp_path / "out"), "--run-id", run_id, cache=build_cache)
    out = tmp_path / "out"
    with_, without = read_verdicts(out / "with")["py_honest"], read_verdicts(out / "without")["py_honest"]
    assert with_["correct"] and with_["kernels"]["custom"] == 0 and with_["kernels"]["library"] >= 1
    assert with_["kernels_warning"] == NO_CUSTOM_WARNING
    assert without["correct"] and without["kernels"] is None
