# Seed 002_44f8821cba4ebc79.txt, solution 7 of 7 (logsumexp kernel only).
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: incorrect. "Same as fifth": exp(input[row*channels + i]) with no max subtraction, a fixed
# `__shared__ float shared[256]`, i = threadIdx.x (one thread per feature, no stride loop), launched with
# 256 threads per row. With 1024 features only the first 256 reach the sum, so every row is about
# log(4) = 1.39 too small. (Unlike logsumexp_no_max.py, sigmoid stays in PyTorch and thread 0 adds the
# 256 partial values serially.)

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void logsumexp_kernel(const float* input, float* output, int channels) {
    __shared__ float shared[256];
    int row = blockIdx.x;
    int i = threadIdx.x;
    shared[i] = i < channels ? exp(input[(int64_t)row * channels + i]) : 0.0f;
    __syncthreads();
    if (i == 0) {
        float total = 0.0f;
        for (int k = 0; k < blockDim.x; ++k) total += shared[k];
        output[row] = log(total);
    }
}

torch::Tensor logsumexp_cuda(torch::Tensor input) {
    TORCH_CHECK(input.is_cuda() && input.dim() == 2, "input: 2-D CUDA tensor");
    input = input.contiguous();
    auto output = torch::empty({input.size(0)}, input.options());
    logsumexp_kernel<<<input.size(0), 256>>>(input.data_ptr<float>(), output.data_ptr<float>(),
                                            (int)input.size(1));
    return output;
}
"""

cpp_source = "torch::Tensor logsumexp_cuda(torch::Tensor input);"

logsumexp = load_inline(
    name="logsumexp",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["logsumexp_cuda"],
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.linear1 = nn.Linear(input_size, hidden_size)
        self.linear2 = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        x = torch.sigmoid(self.linear1(x))
        x = self.linear2(x)
        return logsumexp.logsumexp_cuda(x)
