# Seed 000_4541806e67152f63.txt, solution 3 of 6 (`fused_elementwise_sigmoid_cuda`).
# Seed verdict: Evaluation True, Runtime 13.6 ms.
# Expected: ok. Conv and GroupNorm stay in PyTorch; one flat-indexed kernel computes
# sigmoid((x + bias[c]) * scale[c]), with c = (idx / (H*W)) % C taken from the conv output's own shape.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void fused_elementwise_sigmoid_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                                 const float* __restrict__ scale, float* __restrict__ out,
                                                 int64_t n, int channels, int64_t plane) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        int c = (int)((idx / plane) % channels);
        float v = (x[idx] + bias[c]) * scale[c];
        out[idx] = 1.0f / (1.0f + expf(-v));
    }
}

torch::Tensor fused_elementwise_sigmoid_cuda(torch::Tensor x, torch::Tensor bias, torch::Tensor scale) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 4, "x must be a 4-D CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
    x = x.contiguous();
    bias = bias.contiguous();
    scale = scale.contiguous();
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    const int block = 256;
    int64_t grid = (n + block - 1) / block;
    fused_elementwise_sigmoid_kernel<<<grid, block>>>(x.data_ptr<float>(), bias.data_ptr<float>(),
                                                      scale.data_ptr<float>(), out.data_ptr<float>(),
                                                      n, (int)x.size(1), x.size(2) * x.size(3));
    return out;
}
"""

cpp_source = (
    "torch::Tensor fused_elementwise_sigmoid_cuda(torch::Tensor x, torch::Tensor bias, torch::Tensor scale);"
)

fused_elementwise_sigmoid = load_inline(
    name="fused_elementwise_sigmoid",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_elementwise_sigmoid_cuda"],
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
        x = fused_elementwise_sigmoid.fused_elementwise_sigmoid_cuda(x, self.bias, self.scale)
        x = self.group_norm(x)
        return x
