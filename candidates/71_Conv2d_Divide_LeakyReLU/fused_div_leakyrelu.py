# Seed 003_85427ec2b4df6295.txt, one of the plain out-of-place fused kernels.
# Seed verdict: Evaluation True, Runtime about 4.5 ms (the seed gives 4.49-4.52 ms for the fused kernels).
# Expected: ok. PyTorch's conv, then one kernel writing leaky_relu(x / divisor, 0.01) to a new tensor.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void div_leakyrelu_kernel(const float* __restrict__ in, float* __restrict__ out, float divisor,
                                     float negative_slope, int64_t size) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < size) {
        float v = in[idx] / divisor;
        out[idx] = v > 0.0f ? v : v * negative_slope;
    }
}

torch::Tensor div_leakyrelu_cuda(torch::Tensor x, double divisor, double negative_slope) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x: float32 on CUDA");
    x = x.contiguous();
    auto out = torch::empty_like(x);
    int64_t size = x.numel();
    int threads = 256;
    int64_t blocks = (size + threads - 1) / threads;
    div_leakyrelu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), out.data_ptr<float>(), (float)divisor,
                                              (float)negative_slope, size);
    return out;
}
"""

cpp_source = "torch::Tensor div_leakyrelu_cuda(torch::Tensor x, double divisor, double negative_slope);"

div_leakyrelu = load_inline(
    name="div_leakyrelu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["div_leakyrelu_cuda"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, divisor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.divisor = divisor

    def forward(self, x):
        x = self.conv(x)
        return div_leakyrelu.div_leakyrelu_cuda(x, float(self.divisor), 0.01)
