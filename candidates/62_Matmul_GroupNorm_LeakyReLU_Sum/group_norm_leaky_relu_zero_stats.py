# Seed 001_e045c2a568772a60.txt, solution 3 (`group_norm_leaky_relu` kernel).
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: incorrect. The kernel takes the group mean and variance as inputs instead of computing them
# ("assumes precomputed means/variances"); forward() has nothing to pass, so it passes zeros and ones,
# and the "normalization" becomes x / sqrt(1 + eps). (The seed also says this one skipped the FC and the
# x + x; both are done here in PyTorch so the missing statistics alone make it wrong.)

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void group_norm_leaky_relu(const float* x, const float* mean, const float* var, const float* gamma,
                                      const float* beta, float* out, int64_t total, int channels, int groups,
                                      float eps, float slope) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    int c = (int)(i % channels);
    int64_t n = i / channels;
    int64_t stat = n * groups + c / (channels / groups);
    float y = (x[i] - mean[stat]) * rsqrtf(var[stat] + eps) * gamma[c] + beta[c];
    out[i] = y > 0.0f ? y : y * slope;
}

torch::Tensor group_norm_leaky_relu_cuda(torch::Tensor x, torch::Tensor mean, torch::Tensor var,
                                         torch::Tensor gamma, torch::Tensor beta, int64_t groups, double eps,
                                         double slope) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x: 2-D float32 on CUDA");
    x = x.contiguous();
    auto out = torch::empty_like(x);
    int64_t total = x.numel();
    int threads = 256;
    int64_t blocks = (total + threads - 1) / threads;
    group_norm_leaky_relu<<<blocks, threads>>>(x.data_ptr<float>(), mean.contiguous().data_ptr<float>(),
                                               var.contiguous().data_ptr<float>(),
                                               gamma.contiguous().data_ptr<float>(),
                                               beta.contiguous().data_ptr<float>(), out.data_ptr<float>(),
                                               total, (int)x.size(1), (int)groups, (float)eps, (float)slope);
    return out;
}
"""

cpp_source = (
    "torch::Tensor group_norm_leaky_relu_cuda(torch::Tensor x, torch::Tensor mean, torch::Tensor var,"
    " torch::Tensor gamma, torch::Tensor beta, int64_t groups, double eps, double slope);"
)

gn_lrelu = load_inline(
    name="group_norm_leaky_relu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["group_norm_leaky_relu_cuda"],
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, num_groups, eps=1e-5, negative_slope=0.01):
        super().__init__()
        self.fc = nn.Linear(input_size, hidden_size)
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=hidden_size, eps=eps)
        self.leaky_relu = nn.LeakyReLU(negative_slope=negative_slope)

    def forward(self, x):
        x = self.fc(x)
        groups = self.gn.num_groups
        mean = torch.zeros(x.size(0), groups, device=x.device)  # BUG: the statistics are never computed
        var = torch.ones(x.size(0), groups, device=x.device)
        x = gn_lrelu.group_norm_leaky_relu_cuda(
            x, mean, var, self.gn.weight, self.gn.bias, groups, self.gn.eps, self.leaky_relu.negative_slope
        )
        return x + x
