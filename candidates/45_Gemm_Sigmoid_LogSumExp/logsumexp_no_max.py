# Seed 002_44f8821cba4ebc79.txt, solution 5 of 7 (sigmoid kernel + logsumexp kernel).
# Seed verdict: Evaluation False, Runtime -1.0. (Solution 6 is the same code; it is not repeated here.)
# Expected: incorrect. The logsumexp kernel has the two faults the seed names: no max subtraction
# (harmless at these magnitudes: the logits are O(1), so exp() cannot overflow) and a fixed
# `__shared__ float shared[256]` with one thread per feature and no stride loop. The launch is capped
# at 256 threads to fit that array, so only features 0..255 of the 1024 are summed: the result is
# about log(256/1024) = -1.39 off for every row. The sigmoid kernel is correct.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void sigmoid_kernel(const float* x, float* y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 1.0f / (1.0f + expf(-x[i]));
}

__global__ void logsumexp_kernel(const float* input, float* output, int features) {
    __shared__ float shared[256];
    int row = blockIdx.x;
    int tid = threadIdx.x;  // one thread per feature
    shared[tid] = (tid < features) ? expf(input[(int64_t)row * features + tid]) : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) shared[tid] += shared[tid + s];
        __syncthreads();
    }
    if (tid == 0) output[row] = logf(shared[0]);
}

torch::Tensor sigmoid_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x: float32 on CUDA");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    sigmoid_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}

torch::Tensor logsumexp_forward_cuda(torch::Tensor input) {
    TORCH_CHECK(input.is_cuda() && input.dim() == 2, "input: 2-D CUDA tensor");
    input = input.contiguous();
    int rows = input.size(0), features = input.size(1);
    auto output = torch::empty({rows}, input.options());
    int threads = features < 256 ? features : 256;  // shared[] holds 256 values
    logsumexp_kernel<<<rows, threads>>>(input.data_ptr<float>(), output.data_ptr<float>(), features);
    return output;
}
"""

cpp_source = """
torch::Tensor sigmoid_cuda(torch::Tensor x);
torch::Tensor logsumexp_forward_cuda(torch::Tensor input);
"""

custom_ops = load_inline(
    name="custom_ops",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["sigmoid_cuda", "logsumexp_forward_cuda"],
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.linear1 = nn.Linear(input_size, hidden_size)
        self.linear2 = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        x = custom_ops.sigmoid_cuda(self.linear1(x))
        x = self.linear2(x)
        return custom_ops.logsumexp_forward_cuda(x)
