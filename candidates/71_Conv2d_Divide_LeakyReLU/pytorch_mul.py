# Seed 003_85427ec2b4df6295.txt, the pure-PyTorch solution.
# Seed verdict: Evaluation True, Runtime 6.07 ms (vs about 4.5 ms for the fused CUDA kernels).
# Expected: ok, but slower than the fused kernels: conv, then x.mul_(1 / divisor) in place, then
# F.leaky_relu, i.e. two elementwise passes over the conv output instead of one. No compiled code, so it
# runs on CPU as well.

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, divisor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.divisor = divisor

    def forward(self, x):
        x = self.conv(x)
        x.mul_(1.0 / self.divisor)
        return F.leaky_relu(x, negative_slope=0.01)
