# Seed 000_4541806e67152f63.txt, solution 2 of 6 (`fused_ops_cuda`).
# Seed verdict: none given ("Evaluation: Not specified explicitly, but structurally correct").
# Expected: ok. Bias + scale + sigmoid fused in one kernel; PyTorch keeps Conv2d and GroupNorm.
# Written here as a grid-stride loop so it is correct for any size.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void fused_ops_kernel(const float* x, const float* bias, const float* scale, float* out,
                                 int64_t n, int channels, int64_t hw) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int c = (int)((i / hw) % channels);
        float v = (x[i] + bias[c]) * scale[c];
        out[i] = 1.0f / (1.0f + __expf(-v));
    }
}

torch::Tensor fused_ops_cuda(torch::Tensor x, torch::Tensor bias, torch::Tensor scale) {
    TORCH_CHECK(x.is_cuda() && bias.is_cuda() && scale.is_cuda(), "all tensors must be on CUDA");
    TORCH_CHECK(x.dim() == 4 && x.scalar_type() == torch::kFloat32, "expects float32 NCHW");
    x = x.contiguous();
    bias = bias.contiguous();
    scale = scale.contiguous();
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    int threads = 256;
    int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65535);
    fused_ops_kernel<<<blocks, threads>>>(x.data_ptr<float>(), bias.data_ptr<float>(),
                                          scale.data_ptr<float>(), out.data_ptr<float>(), n,
                                          (int)x.size(1), x.size(2) * x.size(3));
    return out;
}
"""

cpp_source = "torch::Tensor fused_ops_cuda(torch::Tensor x, torch::Tensor bias, torch::Tensor scale);"

fused_ops = load_inline(
    name="fused_ops",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_ops_cuda"],
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
        x = fused_ops.fused_ops_cuda(x, self.bias, self.scale)
        x = self.group_norm(x)
        return x
