# CPU C++ candidate (no seed). Expected: incorrect.
# PyTorch's conv, then one C++ loop (at::parallel_for over the flat tensor) computing
# leaky_relu(x / divisor, ...) into a new tensor, but with the slope typed as 0.1 instead of 0.01:
# every negative value comes out ten times too large.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

KBEVAL_DEVICES = ["cpu"]

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>

torch::Tensor div_leakyrelu(torch::Tensor x, double divisor) {
    TORCH_CHECK(!x.is_cuda() && x.scalar_type() == torch::kFloat32, "x: float32 on CPU");
    x = x.contiguous();
    auto out = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const float d = (float)divisor;
    const float slope = 0.1f;  // BUG: the model uses 0.01
    at::parallel_for(0, x.numel(), 16384, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            float v = xp[i] / d;
            op[i] = v > 0.0f ? v : v * slope;
        }
    });
    return out;
}
"""

ext = load_inline(
    name="cpp_wrong_slope",
    cpp_sources=cpp_source,
    functions=["div_leakyrelu"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, divisor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.divisor = divisor

    def forward(self, x):
        x = self.conv(x)
        return ext.div_leakyrelu(x, float(self.divisor))
