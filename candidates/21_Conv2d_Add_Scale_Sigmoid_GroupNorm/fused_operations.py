# Seed 000_4541806e67152f63.txt, solution 4 of 6 (`fused_operations_cuda`).
# Seed verdict: Evaluation True, Runtime 13.6 ms.
# Expected: ok. Nearly the same as solution 3 (fused_elementwise_sigmoid.py): one flat-indexed
# bias + scale + sigmoid kernel between PyTorch's conv and GroupNorm; the channel comes from the
# conv output's own H*W.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void fused_operations_kernel(const float* input, const float* bias, const float* scale,
                                        float* output, int64_t size, int channels, int64_t spatial) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= size) return;
    int c = (int)((i / spatial) % channels);
    float y = (input[i] + bias[c]) * scale[c];
    output[i] = 1.0f / (1.0f + expf(-y));
}

torch::Tensor fused_operations_cuda(torch::Tensor input, torch::Tensor bias, torch::Tensor scale) {
    TORCH_CHECK(input.is_cuda(), "input must be a CUDA tensor");
    TORCH_CHECK(input.dim() == 4 && input.scalar_type() == torch::kFloat32, "expects float32 NCHW");
    input = input.contiguous();
    auto b = bias.contiguous();
    auto s = scale.contiguous();
    auto output = torch::empty_like(input);
    int64_t size = input.numel();
    int threads = 256;
    int64_t blocks = (size + threads - 1) / threads;
    fused_operations_kernel<<<blocks, threads>>>(input.data_ptr<float>(), b.data_ptr<float>(),
                                                 s.data_ptr<float>(), output.data_ptr<float>(), size,
                                                 (int)input.size(1), input.size(2) * input.size(3));
    return output;
}
"""

cpp_source = (
    "torch::Tensor fused_operations_cuda(torch::Tensor input, torch::Tensor bias, torch::Tensor scale);"
)

fused_operations = load_inline(
    name="fused_operations",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_operations_cuda"],
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
        x = fused_operations.fused_operations_cuda(x, self.bias, self.scale)
        return self.group_norm(x)
