# CPU C++ candidate (no seed). Expected: ok.
# PyTorch keeps Conv2d and GroupNorm; one C++ loop, parallel over the (n, c) planes, computes
# sigmoid((x + bias[c]) * scale[c]).

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

KBEVAL_DEVICES = ["cpu"]

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

torch::Tensor bias_scale_sigmoid(torch::Tensor x, torch::Tensor bias, torch::Tensor scale) {
    TORCH_CHECK(!x.is_cuda() && x.dim() == 4 && x.scalar_type() == torch::kFloat32, "x: float32 NCHW on CPU");
    x = x.contiguous();
    auto b = bias.contiguous();
    auto s = scale.contiguous();
    auto out = torch::empty_like(x);
    const int64_t C = x.size(1), plane = x.size(2) * x.size(3);
    const float* xp = x.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    const float* sp = s.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, x.size(0) * C, 1, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
            const float bc = bp[p % C], sc = sp[p % C];
            for (int64_t i = p * plane; i < (p + 1) * plane; ++i) {
                float v = (xp[i] + bc) * sc;
                op[i] = 1.0f / (1.0f + std::exp(-v));
            }
        }
    });
    return out;
}
"""

ext = load_inline(
    name="cpp_bias_scale_sigmoid",
    cpp_sources=cpp_source,
    functions=["bias_scale_sigmoid"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, num_groups, bias_shape, scale_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.scale = nn.Parameter(torch.randn(scale_shape))
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        x = self.conv(x)
        x = ext.bias_scale_sigmoid(x, self.bias, self.scale)
        return self.group_norm(x)
