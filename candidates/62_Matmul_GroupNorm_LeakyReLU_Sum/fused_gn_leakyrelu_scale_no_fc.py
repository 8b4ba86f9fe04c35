# Seed 001_e045c2a568772a60.txt, solution 1 (`fused_gn_leakyrelu_scale_cuda`).
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: incorrect. The kernel itself is a sound GroupNorm + LeakyReLU + scale (x + x as * 2), one
# block per (row, group) with a shared-memory reduction, but forward() hands it the raw input and never
# runs self.fc. Because input_size == hidden_size the shape still matches, so only the values are wrong.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

#define THREADS 128

__global__ void fused_gn_leakyrelu_scale_kernel(const float* x, const float* gamma, const float* beta,
                                                float* out, int channels, int groups, float eps, float slope,
                                                float scale_factor) {
    __shared__ float s_sum[THREADS], s_sq[THREADS];
    int n = blockIdx.x / groups, g = blockIdx.x % groups, tid = threadIdx.x;
    int cpg = channels / groups;
    int64_t base = (int64_t)n * channels + (int64_t)g * cpg;
    float sum = 0.0f, sq = 0.0f;
    for (int j = tid; j < cpg; j += THREADS) {
        float v = x[base + j];
        sum += v;
        sq += v * v;
    }
    s_sum[tid] = sum;
    s_sq[tid] = sq;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) {
            s_sum[tid] += s_sum[tid + s];
            s_sq[tid] += s_sq[tid + s];
        }
        __syncthreads();
    }
    float mean = s_sum[0] / cpg;
    float inv_std = rsqrtf(fmaxf(s_sq[0] / cpg - mean * mean, 0.0f) + eps);
    for (int j = tid; j < cpg; j += THREADS) {
        int c = g * cpg + j;
        float y = (x[base + j] - mean) * inv_std * gamma[c] + beta[c];
        y = y > 0.0f ? y : y * slope;
        out[base + j] = y * scale_factor;
    }
}

torch::Tensor fused_gn_leakyrelu_scale_cuda(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta,
                                            int64_t groups, double eps, double slope, double scale_factor) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x: 2-D float32 on CUDA");
    TORCH_CHECK(x.size(1) % groups == 0, "channels must divide into groups");
    x = x.contiguous();
    auto out = torch::empty_like(x);
    fused_gn_leakyrelu_scale_kernel<<<x.size(0) * groups, THREADS>>>(
        x.data_ptr<float>(), gamma.contiguous().data_ptr<float>(), beta.contiguous().data_ptr<float>(),
        out.data_ptr<float>(), (int)x.size(1), (int)groups, (float)eps, (float)slope, (float)scale_factor);
    return out;
}
"""

cpp_source = (
    "torch::Tensor fused_gn_leakyrelu_scale_cuda(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta,"
    " int64_t groups, double eps, double slope, double scale_factor);"
)

fused_gn = load_inline(
    name="fused_gn_leakyrelu_scale",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_gn_leakyrelu_scale_cuda"],
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, num_groups, eps=1e-5, negative_slope=0.01):
        super().__init__()
        self.fc = nn.Linear(input_size, hidden_size)
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=hidden_size, eps=eps)
        self.leaky_relu = nn.LeakyReLU(negative_slope=negative_slope)

    def forward(self, x):
        # BUG: self.fc(x) is never applied.
        return fused_gn.fused_gn_leakyrelu_scale_cuda(
            x, self.gn.weight, self.gn.bias, self.gn.num_groups, self.gn.eps,
            self.leaky_relu.negative_slope, 2.0,
        )
