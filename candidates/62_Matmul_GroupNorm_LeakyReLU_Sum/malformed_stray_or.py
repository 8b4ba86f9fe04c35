# Seed 001_e045c2a568772a60.txt, solution 2 ("Empty or malformed (e.g., `or` typo)").
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: load_error. The seed shows no code for this one, only that it was malformed with a stray
# `or`; here a stray `or` stands where the rest of forward() should be, so Python cannot even parse the
# file (SyntaxError).

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, num_groups, eps=1e-5, negative_slope=0.01):
        super().__init__()
        self.fc = nn.Linear(input_size, hidden_size)
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=hidden_size, eps=eps)
        self.leaky_relu = nn.LeakyReLU(negative_slope=negative_slope)

    def forward(self, x):
        x = self.fc(x)
        or
        return x
