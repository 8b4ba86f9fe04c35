# Seed 000_4541806e67152f63.txt, solution 1 of 6 (`fused_conv_sigmoid_gn`).
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: incorrect. One kernel does everything: a direct conv, + bias, * scale, sigmoid and GroupNorm.
# The conv/bias/scale/sigmoid part is right, but the GroupNorm mean and variance are computed per
# thread: each thread owns one pixel of one group and averages only its own channels_per_group values
# at that pixel, instead of all channels_per_group * H_out * W_out values of the group in that sample.
# Indices all stay in bounds, so it runs and returns wrong numbers.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

#define MAX_CPG 32

__global__ void fused_conv_sigmoid_gn_kernel(const float* x, const float* weight, const float* conv_bias,
                                             const float* bias, const float* scale, const float* gamma,
                                             const float* beta, float* out, int N, int Cin, int H, int W,
                                             int Cout, int K, int G, float eps) {
    int Ho = H - K + 1, Wo = W - K + 1, cpg = Cout / G;
    int64_t total = (int64_t)N * G * Ho * Wo;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    int wo = (int)(idx % Wo);
    int ho = (int)((idx / Wo) % Ho);
    int g = (int)((idx / ((int64_t)Wo * Ho)) % G);
    int n = (int)(idx / ((int64_t)Wo * Ho * G));

    float vals[MAX_CPG];
    for (int j = 0; j < cpg; ++j) {
        int co = g * cpg + j;
        float acc = conv_bias[co];
        for (int ci = 0; ci < Cin; ++ci)
            for (int kh = 0; kh < K; ++kh)
                for (int kw = 0; kw < K; ++kw)
                    acc += x[(((int64_t)n * Cin + ci) * H + ho + kh) * W + wo + kw] *
                           weight[((co * Cin + ci) * K + kh) * K + kw];
        float v = (acc + bias[co]) * scale[co];
        vals[j] = 1.0f / (1.0f + expf(-v));
    }

    // Group statistics (BUG: over this thread's own values only, not over the whole group).
    float mean = 0.0f, var = 0.0f;
    for (int j = 0; j < cpg; ++j) mean += vals[j];
    mean /= cpg;
    for (int j = 0; j < cpg; ++j) var += (vals[j] - mean) * (vals[j] - mean);
    var /= cpg;
    float inv_std = rsqrtf(var + eps);

    for (int j = 0; j < cpg; ++j) {
        int co = g * cpg + j;
        int64_t o = (((int64_t)n * Cout + co) * Ho + ho) * Wo + wo;
        out[o] = (vals[j] - mean) * inv_std * gamma[co] + beta[co];
    }
}

torch::Tensor fused_conv_sigmoid_gn_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor conv_bias,
                                         torch::Tensor bias, torch::Tensor scale, torch::Tensor gamma,
                                         torch::Tensor beta, int64_t num_groups, double eps) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 4 && x.scalar_type() == torch::kFloat32, "x: float32 NCHW on CUDA");
    x = x.contiguous();
    weight = weight.contiguous();
    int N = x.size(0), Cin = x.size(1), H = x.size(2), W = x.size(3);
    int Cout = weight.size(0), K = weight.size(2), G = num_groups;
    TORCH_CHECK(Cout % G == 0 && Cout / G <= MAX_CPG, "channels per group must divide and be <= 32");
    int Ho = H - K + 1, Wo = W - K + 1;
    auto out = torch::empty({N, Cout, Ho, Wo}, x.options());
    int64_t total = (int64_t)N * G * Ho * Wo;
    int threads = 256;
    int64_t blocks = (total + threads - 1) / threads;
    fused_conv_sigmoid_gn_kernel<<<blocks, threads>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), conv_bias.contiguous().data_ptr<float>(),
        bias.contiguous().data_ptr<float>(), scale.contiguous().data_ptr<float>(),
        gamma.contiguous().data_ptr<float>(), beta.contiguous().data_ptr<float>(), out.data_ptr<float>(),
        N, Cin, H, W, Cout, K, G, (float)eps);
    return out;
}
"""

cpp_source = (
    "torch::Tensor fused_conv_sigmoid_gn_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor conv_bias,"
    " torch::Tensor bias, torch::Tensor scale, torch::Tensor gamma, torch::Tensor beta,"
    " int64_t num_groups, double eps);"
)

fused_conv_sigmoid_gn = load_inline(
    name="fused_conv_sigmoid_gn",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_conv_sigmoid_gn_cuda"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, num_groups, bias_shape, scale_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.scale = nn.Parameter(torch.randn(scale_shape))
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        gn = self.group_norm
        return fused_conv_sigmoid_gn.fused_conv_sigmoid_gn_cuda(
            x, self.conv.weight, self.conv.bias, self.bias, self.scale,
            gn.weight, gn.bias, gn.num_groups, gn.eps,
        )
