"""An honest candidate for KernelBench level1/19_ReLU (2025-01 sizes: 16 x 16384, a few microseconds): one
elementwise kernel. For bench/ground_truth.py."""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
__global__ void relu(const float* x, float* out, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(x[i], 0.f);
}
torch::Tensor run(torch::Tensor x) {
    auto out = torch::empty_like(x);
    long n = x.numel();
    relu<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
_ext = load_inline(name="gt_relu_kernel", cpp_sources="torch::Tensor run(torch::Tensor x);", cuda_sources=_SRC,
                   functions=["run"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.run(x.contiguous())
