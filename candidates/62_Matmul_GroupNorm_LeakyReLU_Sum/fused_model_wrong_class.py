# Seed 001_e045c2a568772a60.txt, solution 5 (FusedModel), copied verbatim below (trailing spaces trimmed).
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: load_error. The maths is right (fc -> GroupNorm on an (N, C, 1, 1) view -> LeakyReLU ->
# * 2.0 instead of x + x) and the parameters are made in the same order as Model's, but the class is
# called FusedModel: the file defines no ModelNew, so there is nothing for the harness to build.

import torch
import torch.nn as nn

class FusedModel(nn.Module):
    def __init__(self, input_size, hidden_size, num_groups, eps=1e-5, negative_slope=0.01):
        super().__init__()
        self.fc = nn.Linear(input_size, hidden_size)
        self.gn = nn.GroupNorm(num_groups, hidden_size, eps=eps)
        self.lrelu = nn.LeakyReLU(negative_slope)
        self.register_buffer('scale', torch.tensor(2.0)) # For element-wise addition (x + x is scaling by 2)

    def forward(self, x):
        x = self.fc(x)
        # GroupNorm expects input of shape (N, C, ...)
        # Since Linear's output is (N, C), we can view it as (N, C, 1, 1) to match GroupNorm's requirements
        x = self.gn(x.view(x.size(0), self.fc.out_features, 1, 1)).view(x.size(0), self.fc.out_features)
        x = self.lrelu(x)
        # The element-wise addition x + x can be replaced with a multiplication by 2 for better performance
        x = x * self.scale
        return x
