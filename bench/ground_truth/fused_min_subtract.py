"""An honest candidate for KernelBench level2/68_Matmul_Min_Subtract (2025-01 sizes): one fused kernel, one
thread per output element (x @ W.T + b, min with the constant, minus the constant). For bench/ground_truth.py."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
__global__ void fused(const float* x, const float* w, const float* b, const float* c, float* out,
                      int rows, int in_f, int out_f) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * out_f) return;
    int r = i / out_f, j = i % out_f;
    float acc = b[j];
    for (int k = 0; k < in_f; ++k) acc += x[r * in_f + k] * w[j * in_f + k];
    float k0 = c[0];
    out[i] = fminf(acc, k0) - k0;
}
torch::Tensor run(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor c) {
    auto out = torch::empty({x.size(0), w.size(0)}, x.options());
    int n = x.size(0) * w.size(0);
    fused<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                                     c.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1), w.size(0));
    return out;
}
"""
_ext = load_inline(name="gt_fused_min_subtract", cpp_sources="torch::Tensor run(torch::Tensor x, torch::Tensor w, "
                   "torch::Tensor b, torch::Tensor c);", cuda_sources=_SRC, functions=["run"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, constant):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.constant = nn.Parameter(torch.tensor(constant))

    def forward(self, x):
        return _ext.run(x.contiguous(), self.linear.weight, self.linear.bias, self.constant.reshape(1))
