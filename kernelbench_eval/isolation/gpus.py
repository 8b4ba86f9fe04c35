"""Which GPUs: `--gpus` and CUDA_VISIBLE_DEVICES are the same kind of list (indices or UUIDs, by commas), so
they are parsed here, one way, and a worker is pinned to its GPU here; and what the harness reads of a GPU from
outside every worker (its SM clock)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

VISIBLE = "CUDA_VISIBLE_DEVICES"


def parse(text: str | None) -> list[str]:
    """`"0, 1"` -> `["0", "1"]`; empty items dropped, None or "" is no GPU named."""
    return [gpu.strip() for gpu in (text or "").split(",") if gpu.strip()]


def visible(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The GPUs CUDA_VISIBLE_DEVICES names; [] when it is unset (then every GPU is visible) or empty."""
    return parse(environ.get(VISIBLE))


def pinned_to(gpu: str) -> dict[str, str]:
    """The environment that shows a worker only `gpu`."""
    return {VISIBLE: gpu}


def sm_clock_mhz(gpu: str | None = None) -> int | None:
    """The SM clock of `gpu` (an index or UUID, as in CUDA_VISIBLE_DEVICES) from nvidia-smi, read by the
    harness (a candidate cannot fake it)."""
    index = (parse(gpu) or visible() or ["0"])[0]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", index],
                             capture_output=True, text=True, timeout=10).stdout
        return int(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
