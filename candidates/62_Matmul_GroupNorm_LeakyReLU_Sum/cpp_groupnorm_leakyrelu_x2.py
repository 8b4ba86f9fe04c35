# CPU C++ candidate (no seed). Expected: ok.
# The Linear layer stays in PyTorch; a C++ loop, parallel over (row, group), does GroupNorm (mean and
# variance of the group's channels, in double), LeakyReLU and x + x.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

KBEVAL_DEVICES = ["cpu"]

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

torch::Tensor gn_leaky_x2(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, int64_t groups,
                          double eps, double slope) {
    TORCH_CHECK(!x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x: 2-D float32 on CPU");
    x = x.contiguous();
    auto gm = gamma.contiguous(), bt = beta.contiguous();
    const int64_t C = x.size(1);
    TORCH_CHECK(C % groups == 0, "channels must divide into groups");
    const int64_t cpg = C / groups;
    auto out = torch::empty_like(x);
    const float *xp = x.data_ptr<float>(), *gp = gm.data_ptr<float>(), *bp = bt.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const float neg = (float)slope;
    at::parallel_for(0, x.size(0) * groups, 1, [&](int64_t begin, int64_t end) {
        for (int64_t ng = begin; ng < end; ++ng) {
            const int64_t base = ng * cpg, c0 = (ng % groups) * cpg;  // a group is cpg consecutive values
            double sum = 0.0, sumsq = 0.0;
            for (int64_t j = 0; j < cpg; ++j) {
                sum += xp[base + j];
                sumsq += (double)xp[base + j] * xp[base + j];
            }
            const double mean = sum / cpg;
            const float inv_std = (float)(1.0 / std::sqrt(std::max(sumsq / cpg - mean * mean, 0.0) + eps));
            for (int64_t j = 0; j < cpg; ++j) {
                float y = (xp[base + j] - (float)mean) * inv_std * gp[c0 + j] + bp[c0 + j];
                y = y > 0.0f ? y : y * neg;
                op[base + j] = y + y;
            }
        }
    });
    return out;
}
"""

ext = load_inline(
    name="cpp_gn_leaky_x2",
    cpp_sources=cpp_source,
    functions=["gn_leaky_x2"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, num_groups, eps=1e-5, negative_slope=0.01):
        super().__init__()
        self.fc = nn.Linear(input_size, hidden_size)
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=hidden_size, eps=eps)
        self.leaky_relu = nn.LeakyReLU(negative_slope=negative_slope)

    def forward(self, x):
        x = self.fc(x)
        return ext.gn_leaky_x2(
            x, self.gn.weight, self.gn.bias, self.gn.num_groups, self.gn.eps, self.leaky_relu.negative_slope
        )
