"""`results/baselines.json`: each problem's eager and torch.compile times, measured once per machine.

Compiling a reference with torch.compile takes tens of seconds, so its time is kept, keyed by the
problem's source hash, the device name, the torch version and the timing settings, and reused by every
later run with the same key. Several runs may share the file: updates merge under a lock.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

from kernelbench_eval.models import Baseline
from kernelbench_eval.record import write_atomic

FILE_NAME = "baselines.json"


class BaselineStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, key: str) -> Baseline | None:
        entry = self._read().get(key)
        return Baseline.model_validate(entry) if entry else None

    def put(self, baseline: Baseline) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f".{self.path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = self._read()
            entries[baseline.key()] = baseline.model_dump(mode="json")
            write_atomic(self.path, json.dumps(entries, indent=1, sort_keys=True))

    def _read(self) -> dict[str, dict]:
        if not self.path.exists():
            return {}
        try:
            return json.loads(self.path.read_text())
        except ValueError:  # a damaged cache is only a cache: measure again
            return {}
