# Seed 000_4541806e67152f63.txt, solution 6 of 6 (`fused_elementwise_cuda`, the slow one).
# Seed verdict: Evaluation True, Runtime 18.2 ms (vs 13.6 ms for solutions 3 and 4).
# Expected: ok, but slower than fused_elementwise_sigmoid.py. The seed blames "separate dimension
# variables instead of flattened indices" and "less cache-efficient memory access". Both are real here:
# each thread decodes a 4-D index (n, h, w, c) with the CHANNEL varying fastest, so the 32 threads of a
# warp touch 32 addresses H*W floats apart (uncoalesced loads and stores). The values are still exact
# sigmoid((x + bias[c]) * scale[c]). Measured on one H100 at full size (whole forward, median of 10):
# 8.7 ms against 5.3 ms for fused_elementwise_sigmoid.py (the seed's ratio was 18.2 / 13.6).

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void fused_elementwise_kernel(const float* input, const float* bias, const float* scale,
                                         float* output, int batch, int channels, int height, int width) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t total = (int64_t)batch * channels * height * width;
    if (idx >= total) return;
    int c = (int)(idx % channels);
    int w = (int)((idx / channels) % width);
    int h = (int)((idx / ((int64_t)channels * width)) % height);
    int n = (int)(idx / ((int64_t)channels * width * height));
    int64_t offset = (((int64_t)n * channels + c) * height + h) * width + w;
    float v = (input[offset] + bias[c]) * scale[c];
    output[offset] = 1.0f / (1.0f + expf(-v));
}

torch::Tensor fused_elementwise_cuda(torch::Tensor input, torch::Tensor bias, torch::Tensor scale) {
    TORCH_CHECK(input.is_cuda(), "input must be a CUDA tensor");
    TORCH_CHECK(input.dim() == 4 && input.scalar_type() == torch::kFloat32, "expects float32 NCHW");
    int batch = input.size(0), channels = input.size(1), height = input.size(2), width = input.size(3);
    TORCH_CHECK(bias.numel() == channels && scale.numel() == channels, "bias/scale must have C elements");
    input = input.contiguous();
    bias = bias.contiguous();
    scale = scale.contiguous();
    auto output = torch::empty_like(input);
    int64_t total = input.numel();
    const int block_size = 256;
    int64_t num_blocks = (total + block_size - 1) / block_size;
    fused_elementwise_kernel<<<num_blocks, block_size>>>(input.data_ptr<float>(), bias.data_ptr<float>(),
                                                         scale.data_ptr<float>(), output.data_ptr<float>(),
                                                         batch, channels, height, width);
    return output;
}
"""

cpp_source = (
    "torch::Tensor fused_elementwise_cuda(torch::Tensor input, torch::Tensor bias, torch::Tensor scale);"
)

fused_elementwise = load_inline(
    name="fused_elementwise",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_elementwise_cuda"],
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
        x = fused_elementwise.fused_elementwise_cuda(x, self.bias, self.scale)
        x = self.group_norm(x)
        return x
