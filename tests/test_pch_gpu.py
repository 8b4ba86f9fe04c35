"""The builds' precompiled header with the real `torch/extension.h`, through `load_inline`, on a CUDA host: a CUDA
candidate built after the header is made reads it (skipped where torch sees no GPU; a CPU box takes minutes to
precompile torch's header, and `auto` uses one for CUDA builds only)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

from kernelbench_eval.building import pch
from kernelbench_eval.building.compile import compile_candidate
from kernelbench_eval.discover.corpus import Candidate, sha256_file
from kernelbench_eval.isolation import landlock, sandbox

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CANDIDATE = '''
import torch
from torch.utils.cpp_extension import load_inline

cpp = """torch::Tensor twice(torch::Tensor x);
int probe() {
#ifdef KBEVAL_PCH_PROBE
    return KBEVAL_PCH_PROBE;
#else
    return 0;
#endif
}
"""
cuda = """#include <torch/extension.h>
__global__ void twice_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2 * x[i];
}
torch::Tensor twice(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    twice_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
ext = load_inline(name="pch_probe", cpp_sources=cpp, cuda_sources=cuda, functions=["twice", "probe"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.twice(x)
'''


def test_a_cuda_build_reads_the_harness_made_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if landlock.abi() == 0:
        pytest.skip("no Landlock here: builds never use a header")
    monkeypatch.delenv(sandbox.OFF_VAR, raising=False)
    monkeypatch.setenv(pch.MODE_VAR, "auto")
    monkeypatch.setattr(pch, "HEADER", "#define KBEVAL_PCH_PROBE 3\n#include <torch/extension.h>\n")
    cache = tmp_path / "cache"
    pch.plan(cache, "cuda", builds=2, at_once=1)
    folder = pch.wait(cache, "cuda", 600)
    assert folder is not None and (folder / pch.GCH).stat().st_size > 50 << 20
    path = tmp_path / "candidates" / "p" / "probe.py"
    path.parent.mkdir(parents=True)
    path.write_text(CANDIDATE)
    built = compile_candidate(Candidate("p", "probe", path, sha256_file(path)), "cuda", cache, tmp_path / "c.log", 600)
    assert built.record.ok, (tmp_path / "c.log").read_text()[-2000:]
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(built.build_dir / "ext"))  # loads what was built, no rebuild
    ext = runpy.run_path(str(path))["ext"]
    assert ext.probe() == 3  # main.cpp was compiled from the precompiled header
    x = torch.rand(1000, device="cuda")
    assert torch.equal(ext.twice(x), 2 * x)
    # ninja did not record the header among main.o's dependencies: the build loads without it
    deps = list((built.build_dir / "ext").rglob(".ninja_deps"))
    assert deps and all(b"extension.h.gch" not in d.read_bytes() for d in deps)
