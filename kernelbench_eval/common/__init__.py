"""What both sides of the process boundary use, without process state of its own: the exchange's layout and how
outputs are carved from it (`exchange`, `carve`), precision modes, the memory plan, statistics, launch accounting
(`launches`, `marks`), KernelBench's timing method's constants and readings (`kbmethod`), the CUDA runtime calls
torch does not expose (`cudart`). Imports neither `judge/` nor `worker/`.
"""
