"""Which GPUs: `--gpus` and CUDA_VISIBLE_DEVICES are the same kind of list (indices or UUIDs, by commas), so
they are parsed here, one way, and a worker is pinned to its GPU here."""

from __future__ import annotations

import os
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
