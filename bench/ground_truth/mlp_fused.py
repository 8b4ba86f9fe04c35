"""An honest candidate for KernelBench level3/1_MLP (2025-01 sizes: batch 1, 1000 -> 400 -> 800 -> 500): each
layer one kernel (a thread per output, bias and ReLU fused), three launches instead of the reference's five. For
bench/ground_truth.py."""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
__global__ void layer(const float* x, const float* w, const float* b, float* out, int rows, int in_f, int out_f,
                      bool relu) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * out_f) return;
    int r = i / out_f, j = i % out_f;
    float acc = b[j];
    for (int k = 0; k < in_f; ++k) acc += x[r * in_f + k] * w[j * in_f + k];
    out[i] = relu ? fmaxf(acc, 0.f) : acc;
}
torch::Tensor run(torch::Tensor x, torch::Tensor w, torch::Tensor b, bool relu) {
    auto out = torch::empty({x.size(0), w.size(0)}, x.options());
    int n = x.size(0) * w.size(0);
    layer<<<(n + 127) / 128, 128>>>(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                                     out.data_ptr<float>(), x.size(0), x.size(1), w.size(0), relu);
    return out;
}
"""
_ext = load_inline(name="gt_mlp_fused", cpp_sources="torch::Tensor run(torch::Tensor x, torch::Tensor w, "
                   "torch::Tensor b, bool relu);", cuda_sources=_SRC, functions=["run"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        sizes = [input_size, *layer_sizes, output_size]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:], strict=False))

    def forward(self, x):
        x = x.contiguous()
        for n, fc in enumerate(self.layers):
            x = _ext.run(x, fc.weight, fc.bias, n < len(self.layers) - 1)
        return x
