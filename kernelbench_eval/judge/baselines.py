"""`results/baselines.json`: each problem's eager and torch.compile times, measured once per machine.

Compiling a reference with torch.compile takes tens of seconds, so its time is kept, keyed by the
problem's source hash, the device name, the torch version and the timing settings, and reused by every
later run with the same key. Several runs may share the file: updates merge under a lock.

A candidate runs as the same user and can write this file. Every entry the harness stores carries an
HMAC (`keys`, key in the cache dir, never given to a worker) over its content; an entry without a valid
one is ignored (measured again and overwritten), so a baseline never comes from a candidate's process.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kernelbench_eval.records import Baseline
from kernelbench_eval.store import keys, locks
from kernelbench_eval.store.atomic import write_atomic

FILE_NAME = "baselines.json"
MAC = "mac"
_MINE: dict[str, dict[str, dict]] = {}
_key_dir: Path | None = None  # the run's cache dir (set by the pipeline); else $KBEVAL_CACHE_DIR or ~/.cache


def use_key_dir(cache_dir: Path) -> None:
    global _key_dir
    _key_dir = cache_dir


def _key() -> bytes:
    env = os.environ.get("KBEVAL_CACHE_DIR")
    return keys.load_key(_key_dir or (Path(env) if env else Path.home() / ".cache" / "kernelbench-eval"))


class BaselineStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.key = _key()
        # entries this process wrote or verified, to restore if something forges them; shared by every store
        # of this file in the process, so the run's `repair` restores what its lanes measured
        self._mine: dict[str, dict] = _MINE.setdefault(str(path.resolve()), {})

    def get(self, key: str) -> Baseline | None:
        entry = self._read().get(key)
        if not isinstance(entry, dict):
            return None
        content = {k: v for k, v in entry.items() if k != MAC}
        if not keys.verify(self.key, content, entry.get(MAC)):
            return None  # not written by a harness holding this cache's key: measured again
        try:
            baseline = Baseline.model_validate(content)
        except ValueError:
            return None  # a damaged entry is measured again
        if baseline and baseline.key() != key:
            return None
        if entry:
            self._mine[key] = entry
        return baseline

    @contextmanager
    def claim(self, key: str) -> Iterator[None]:
        """Held while one baseline is measured, so that it is measured once by all who want it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tag = hashlib.sha256(key.encode()).hexdigest()[:16]
        with locks.hold(self.path.with_name(f".{self.path.name}.{tag}.lock")):
            yield

    def adopt(self, key: str) -> None:
        """Count an entry another process of this run wrote (a lane) as this run's, so `repair` keeps it."""
        self.get(key)

    def put(self, baseline: Baseline) -> None:
        content = baseline.model_dump(mode="json")
        self._mine[baseline.key()] = content | {MAC: keys.sign(self.key, content)}
        self._merge()

    def repair(self) -> bool:
        """Rewrite this run's entries if the file lost or changed them (another run's additions are kept)."""
        if not self._mine:
            return False
        current = self._read() if self.path.exists() else {}
        if all(current.get(k) == v for k, v in self._mine.items()) and self._parses():
            return False
        self._merge()
        return True

    def _merge(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with locks.hold(self.path.with_name(f".{self.path.name}.lock")):
            entries = {**self._read(), **self._mine}
            write_atomic(self.path, json.dumps(entries, indent=1, sort_keys=True))

    def _parses(self) -> bool:
        try:
            json.loads(self.path.read_text())
            return True
        except (OSError, ValueError):
            return False

    def _read(self) -> dict[str, dict]:
        if not self.path.exists():
            return {}
        try:
            entries = json.loads(self.path.read_text())
        except ValueError:  # a damaged cache is only a cache: measure again
            return {}
        return entries if isinstance(entries, dict) else {}
