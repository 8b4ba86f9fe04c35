# Seed 003_85427ec2b4df6295.txt, the in-place solution (`fused_div_leakyrelu_inplace`).
# Seed verdict: Evaluation True, Runtime about 4.5 ms (the seed gives 4.49-4.52 ms for the fused kernels).
# Expected: ok. The kernel overwrites the conv output with leaky_relu(x / divisor, 0.01) and returns that
# same tensor, saving one allocation; the conv output is a fresh contiguous tensor nobody else holds.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void fused_div_leakyrelu_inplace_kernel(float* data, float divisor, float negative_slope,
                                                   int64_t size) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < size) {
        float v = data[idx] / divisor;
        data[idx] = v > 0.0f ? v : v * negative_slope;
    }
}

torch::Tensor fused_div_leakyrelu_inplace(torch::Tensor x, double divisor, double negative_slope) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x: float32 on CUDA");
    TORCH_CHECK(x.is_contiguous(), "in-place kernel needs a contiguous tensor");
    int64_t size = x.numel();
    int threads = 256;
    int64_t blocks = (size + threads - 1) / threads;
    fused_div_leakyrelu_inplace_kernel<<<blocks, threads>>>(x.data_ptr<float>(), (float)divisor,
                                                            (float)negative_slope, size);
    return x;
}
"""

cpp_source = (
    "torch::Tensor fused_div_leakyrelu_inplace(torch::Tensor x, double divisor, double negative_slope);"
)

inplace_ext = load_inline(
    name="fused_div_leakyrelu_inplace",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_div_leakyrelu_inplace"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, divisor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.divisor = divisor

    def forward(self, x):
        x = self.conv(x).contiguous()
        return inplace_ext.fused_div_leakyrelu_inplace(x, float(self.divisor), 0.01)
