"""kernelbench-eval: judge candidate kernels against PyTorch reference problems, in isolation.

The pipeline, one module a stage: discover -> compile -> (worker) -> evaluate/check -> record,
driven by `pipeline.run` and exposed by the `kbeval` command line in `cli`.
"""

__version__ = "0.1.0"
