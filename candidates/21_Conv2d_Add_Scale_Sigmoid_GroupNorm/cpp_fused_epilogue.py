# CPU C++ candidate (no seed). Expected: ok.
# PyTorch keeps only the Conv2d. One C++ pass, parallel over (sample, group), does + bias, * scale,
# sigmoid and GroupNorm: it writes the sigmoid values while summing them (in double), then
# normalizes the group in place with its own mean/variance and the GroupNorm weight/bias.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

KBEVAL_DEVICES = ["cpu"]

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

torch::Tensor fused_epilogue(torch::Tensor x, torch::Tensor bias, torch::Tensor scale, torch::Tensor gamma,
                             torch::Tensor beta, int64_t groups, double eps) {
    TORCH_CHECK(!x.is_cuda() && x.dim() == 4 && x.scalar_type() == torch::kFloat32, "x: float32 NCHW on CPU");
    x = x.contiguous();
    auto b = bias.contiguous(), s = scale.contiguous(), gm = gamma.contiguous(), bt = beta.contiguous();
    const int64_t N = x.size(0), C = x.size(1), plane = x.size(2) * x.size(3);
    TORCH_CHECK(C % groups == 0, "channels must divide into groups");
    const int64_t cpg = C / groups, count = cpg * plane;
    auto out = torch::empty_like(x);
    const float *xp = x.data_ptr<float>(), *bp = b.data_ptr<float>(), *sp = s.data_ptr<float>();
    const float *gp = gm.data_ptr<float>(), *btp = bt.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, N * groups, 1, [&](int64_t begin, int64_t end) {
        for (int64_t ng = begin; ng < end; ++ng) {
            const int64_t c0 = (ng % groups) * cpg, base = ng * count;  // group ng covers cpg whole planes
            double sum = 0.0, sumsq = 0.0;
            for (int64_t j = 0; j < cpg; ++j) {
                const float bc = bp[c0 + j], sc = sp[c0 + j];
                for (int64_t i = base + j * plane; i < base + (j + 1) * plane; ++i) {
                    float v = 1.0f / (1.0f + std::exp(-(xp[i] + bc) * sc));
                    op[i] = v;
                    sum += v;
                    sumsq += (double)v * v;
                }
            }
            const double mean = sum / count;
            const double var = std::max(sumsq / count - mean * mean, 0.0);
            const float inv_std = (float)(1.0 / std::sqrt(var + eps));
            for (int64_t j = 0; j < cpg; ++j) {
                const float a = gp[c0 + j] * inv_std, shift = btp[c0 + j] - (float)mean * a;
                for (int64_t i = base + j * plane; i < base + (j + 1) * plane; ++i) op[i] = op[i] * a + shift;
            }
        }
    });
    return out;
}
"""

ext = load_inline(
    name="cpp_fused_epilogue",
    cpp_sources=cpp_source,
    functions=["fused_epilogue"],
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
        gn = self.group_norm
        return ext.fused_epilogue(x, self.bias, self.scale, gn.weight, gn.bias, gn.num_groups, gn.eps)
