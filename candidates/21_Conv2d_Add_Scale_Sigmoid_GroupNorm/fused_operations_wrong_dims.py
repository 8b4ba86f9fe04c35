# Seed 000_4541806e67152f63.txt, solution 5 of 6 (`fused_operations_cuda`, the failing one).
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: incorrect. The seed only says this one looks like solutions 3/4 (it also moves bias and scale
# to the input's device) but gets its indexing wrong. Here the bug is real: forward() reads H and W from
# the conv INPUT (256x256) and the kernel uses them to find the channel of each element of the conv
# OUTPUT (254x254, no padding), so c = (idx / (H*W)) % C picks the wrong bias/scale for most elements.
# Every index stays in bounds (the element count comes from the output), so it runs and is just wrong.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void fused_operations_kernel(const float* input, const float* bias, const float* scale,
                                        float* output, int64_t size, int channels, int height, int width) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= size) return;
    int c = (int)((i / ((int64_t)height * width)) % channels);
    float y = (input[i] + bias[c]) * scale[c];
    output[i] = 1.0f / (1.0f + expf(-y));
}

torch::Tensor fused_operations_cuda(torch::Tensor input, torch::Tensor bias, torch::Tensor scale,
                                    int64_t height, int64_t width) {
    TORCH_CHECK(input.is_cuda(), "input must be a CUDA tensor");
    TORCH_CHECK(input.dim() == 4 && input.scalar_type() == torch::kFloat32, "expects float32 NCHW");
    input = input.contiguous();
    auto b = bias.to(input.device()).contiguous();
    auto s = scale.to(input.device()).contiguous();
    auto output = torch::empty_like(input);
    int64_t size = input.numel();
    int threads = 256;
    int64_t blocks = (size + threads - 1) / threads;
    fused_operations_kernel<<<blocks, threads>>>(input.data_ptr<float>(), b.data_ptr<float>(),
                                                 s.data_ptr<float>(), output.data_ptr<float>(), size,
                                                 (int)input.size(1), (int)height, (int)width);
    return output;
}
"""

cpp_source = (
    "torch::Tensor fused_operations_cuda(torch::Tensor input, torch::Tensor bias, torch::Tensor scale,"
    " int64_t height, int64_t width);"
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
        height, width = x.size(2), x.size(3)  # BUG: the conv output is (H-k+1) x (W-k+1)
        x = self.conv(x)
        x = fused_operations.fused_operations_cuda(x, self.bias, self.scale, height, width)
        return self.group_norm(x)
