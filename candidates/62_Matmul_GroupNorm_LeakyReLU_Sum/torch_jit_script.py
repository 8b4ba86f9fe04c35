# Seed 001_e045c2a568772a60.txt, second "Kernel:" block (MyTorchJIT; not in the seed's analysis list),
# copied verbatim below (trailing spaces trimmed).
# Seed verdict: Evaluation False, Runtime -1.0.
# Expected: load_error. The file imports torch but not torch.nn, so `class MyTorchJIT(nn.Module)` raises
# NameError while the module is imported; and even with the import there is no ModelNew (and the
# function computes (x + 3)^2 + (x + 3), which has nothing to do with this problem).

import torch

def my_torch_jit(input):
    a = input + 3
    b = a * a
    c = b + a
    return c

class MyTorchJIT(nn.Module):
    def __init__(self):
        super(MyTorchJIT, self).__init__()
        self.my_func = torch.jit.script(my_torch_jit)

    def forward(self, x):
        return self.my_func(x)
