"""kernelbench-eval: judge candidate kernels against PyTorch reference problems, in isolation.

The pipeline: discover -> compile -> judge (`judge/`: check, then time; the workers' side in `worker*.py`
and `exchange.py`) -> record -> report, driven by `pipeline.run` and exposed by the `kbeval` command line
in `cli`.
"""

__version__ = "0.1.0"
