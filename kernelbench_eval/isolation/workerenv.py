"""A worker's environment: what it may inherit from the harness, and what the harness adds.

Kept apart from `process` (which starts and talks to workers) because it needs neither torch nor a worker: the
CLI's entry point starts the fork server with it (`prestart`) before anything heavy is imported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kernelbench_eval.isolation import forkclient

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
ALLOWED_VARS = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR",
                          "CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH",
                          "MAX_JOBS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "KMP_BLOCKTIME",
                          "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                          "KBEVAL_LOG_CAP", "KBEVAL_FORKSERVER", "KBEVAL_CPUS", "KBEVAL_MEMORY_TRACE",
                          "KBEVAL_LOCK_WAIT", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
                          "VIRTUAL_ENV", "CONDA_PREFIX"})
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TORCH_", "TRITON_", "NCCL_", "CUDNN_", "NVCC_")

# OpenMP threads that spin while waiting at a barrier turn host load into huge, bimodal call times: when
# another process holds a core, a 0.07 ms call waits for a whole scheduler slice (measured: tiny SDPA, 2
# threads, 2 busy cores: median 23 ms with the default wait policy, 0.067 ms with PASSIVE), and the spinning
# shows as CPU use (the thread-count rule) and as wall time no call accounts for (the clock rule). The
# policy is read when the OpenMP runtime loads, so it must be in a worker's (and the fork server's)
# environment before torch is imported there; workers inherit the harness's environment. Set here, on import
# (no torch needed), so that a fork server started before the harness imports torch (`prestart`) has them.
QUIET_OPENMP = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
# And one malloc for every worker. glibc gives an allocation over its mmap threshold its own mapping (page faults
# at every touch, a munmap at every free) and raises the threshold when a process frees such a mapping, so two
# processes running one model held its temporaries differently by their pasts: on the CPU an identical copy of
# KernelBench's 94_MSELoss (2 MB temporaries) timed 0.36-0.44x against the checker, which had freed large buffers
# before. A fixed threshold (64 MB) and trim threshold keep every worker's allocations where a long-running
# process's would be; larger ones still get mappings of their own.
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def quiet_openmp(environ: dict[str, str] | os._Environ = os.environ) -> None:
    """Put QUIET_OPENMP and STEADY_MALLOC into `environ` (the harness's, which workers inherit) unless the user
    set them."""
    for name, value in (QUIET_OPENMP | STEADY_MALLOC).items():
        environ.setdefault(name, value)


quiet_openmp()


def worker_environment(extra: Mapping[str, str], token: str) -> dict[str, str]:
    """A worker's whole environment: the allow-listed harness variables, `extra`, the package path, `token`."""
    env = worker_env(os.environ) | dict(extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env[forkclient.TOKEN_VAR] = token
    return env


def prestart() -> None:
    """Start the fork server every worker of this harness will come from, now and in the background.

    Why: the server imports torch (seconds), and the first worker (a compile, or a lane's reference) used to
    wait for that. Started first thing, it imports while the harness imports, discovers and looks up its
    caches. The per-worker variables (`forkclient.FORK_SAFE_VARS`) do not choose the server, so this is the
    one every later worker is forked from (`forkclient.prestart`).
    """
    forkclient.prestart(worker_environment({}, forkclient.TOKEN_PLACEHOLDER))


def worker_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a worker may inherit from the harness: an allow-list, so no credential ever reaches one.

    Why: a candidate can read its whole environment (API keys, cloud tokens, the cache's location). It gets
    what running Python, torch and a compiler needs, nothing else; the harness adds its own (PYTHONPATH,
    the extension folder, the token) on top.
    """
    return {k: v for k, v in environ.items() if k in ALLOWED_VARS or k.startswith(ALLOWED_PREFIXES)}
