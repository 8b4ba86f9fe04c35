# CPU C++ candidate (no seed). Expected: ok.
# Both Linear layers and the sigmoid stay in PyTorch; a C++ loop, parallel over rows, computes a stable
# logsumexp: row max m, then m + log(sum(exp(x - m))).

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

KBEVAL_DEVICES = ["cpu"]

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

torch::Tensor row_logsumexp(torch::Tensor x) {
    TORCH_CHECK(!x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x: 2-D float32 on CPU");
    x = x.contiguous();
    const int64_t rows = x.size(0), cols = x.size(1);
    auto out = torch::empty({rows}, x.options());
    const float* xp = x.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const float* row = xp + r * cols;
            float m = -INFINITY;
            for (int64_t j = 0; j < cols; ++j) m = std::max(m, row[j]);
            float sum = 0.0f;
            for (int64_t j = 0; j < cols; ++j) sum += std::exp(row[j] - m);
            op[r] = m + std::log(sum);
        }
    });
    return out;
}
"""

ext = load_inline(
    name="cpp_logsumexp",
    cpp_sources=cpp_source,
    functions=["row_logsumexp"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.linear1 = nn.Linear(input_size, hidden_size)
        self.linear2 = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        x = torch.sigmoid(self.linear1(x))
        x = self.linear2(x)
        return ext.row_logsumexp(x)
