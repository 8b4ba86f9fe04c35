# Seed 002_44f8821cba4ebc79.txt, solution 4 of 7 (the custom logsumexp kernel).
# Seed verdict: Evaluation True, Runtime 30.8 ms.
# Expected: ok. Both Linear layers and the sigmoid stay in PyTorch. A CUDA kernel, one block per row,
# does a numerically stable logsumexp: a grid-stride pass and a shared-memory tree reduction for the
# row max, then a second pass and reduction for sum(exp(x - max)); the row result is max + log(sum).

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

#define THREADS 256

__global__ void logsumexp_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    __shared__ float buf[THREADS];
    const float* row = x + (int64_t)blockIdx.x * cols;
    int tid = threadIdx.x;

    float m = -INFINITY;
    for (int j = tid; j < cols; j += THREADS) m = fmaxf(m, row[j]);
    buf[tid] = m;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) buf[tid] = fmaxf(buf[tid], buf[tid + s]);
        __syncthreads();
    }
    const float row_max = buf[0];
    __syncthreads();

    float sum = 0.0f;
    for (int j = tid; j < cols; j += THREADS) sum += expf(row[j] - row_max);
    buf[tid] = sum;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) buf[tid] += buf[tid + s];
        __syncthreads();
    }
    if (tid == 0) out[blockIdx.x] = row_max + logf(buf[0]);
}

torch::Tensor logsumexp_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x: 2-D float32 on CUDA");
    x = x.contiguous();
    auto out = torch::empty({x.size(0)}, x.options());
    logsumexp_kernel<<<x.size(0), THREADS>>>(x.data_ptr<float>(), out.data_ptr<float>(), (int)x.size(1));
    return out;
}
"""

cpp_source = "torch::Tensor logsumexp_cuda(torch::Tensor x);"

logsumexp_ext = load_inline(
    name="logsumexp_ext",
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
        x = self.linear1(x)
        x = torch.sigmoid(x)
        x = self.linear2(x)
        return logsumexp_ext.logsumexp_cuda(x)
