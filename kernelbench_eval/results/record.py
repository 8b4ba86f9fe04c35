"""Stage 5: write verdicts so that no crash of the harness ever tears or loses one.

`verdicts.jsonl` is append-only: each verdict is one `write` of one line, flushed to disk before the
next candidate starts. Everything else (the two-line files, the manifest, summaries) is written to a
temporary file and renamed into place, so a reader sees the old file or the new one, never half.

A candidate runs as the same user, so it could find and edit these files. The recorder keeps every
line it wrote in memory and notices any change it did not make (size, inode or change time, which no
user process can set back); the file is then restored and the change reported.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kernelbench_eval.records import RunManifest, Verdict
from kernelbench_eval.results.formatting import runtime
from kernelbench_eval.store.atomic import write_atomic

VERDICTS = "verdicts.jsonl"
MANIFEST = "run.json"


class ManifestMismatch(ValueError):
    """`--resume` of a run folder whose run.json is not the one the harness wrote (exit 2)."""


def _manifest_seal(cache_dir: Path, data: bytes) -> Path:
    """Where the harness marks a run.json it wrote: in the cache, named by a MAC of its bytes (`keys`).

    Keyed by content, not by the run folder's path, so a run folder copied elsewhere still resumes; named
    by the cache's key, so a candidate cannot mark a run.json of its own making.
    """
    from kernelbench_eval.store import keys
    digest = hashlib.sha256(data).hexdigest()
    return cache_dir / "runs" / keys.name_for(keys.load_key(cache_dir), digest)


def seal_manifest(cache_dir: Path, run_dir: Path) -> None:
    """Remember the run.json just written, outside the run folder (candidates can find and edit that)."""
    write_atomic(_manifest_seal(cache_dir, (run_dir / MANIFEST).read_bytes()), f"{run_dir.resolve()}\n")


def check_manifest(cache_dir: Path, run_dir: Path, manifest: RunManifest, problems: Path | None = None,
                   candidates: Path | None = None) -> None:
    """Refuse a resume of a run.json the harness did not write, or that disagrees with the command line.

    Why: run.json lives in the run folder, which candidates can find and edit (point problems_dir at a
    forged copy, then kill the harness so that it is resumed).
    """
    if not _manifest_seal(cache_dir, (run_dir / MANIFEST).read_bytes()).exists():
        raise ManifestMismatch(f"{run_dir / MANIFEST} is not one this harness wrote (changed since, or another "
                               "--cache-dir); refusing to resume")
    if manifest.run_id != run_dir.name:
        raise ManifestMismatch(f"{run_dir}: run.json names run {manifest.run_id!r}; refusing to resume")
    for given, recorded, what in ((problems, manifest.problems_dir, "problems"),
                                  (candidates, manifest.candidates_dir, "candidates")):
        if given is not None and given.resolve() != Path(recorded).resolve():
            raise ManifestMismatch(f"{run_dir}: --{what} {given} is not the run's {recorded}; refusing to resume")


def two_lines(verdict: Verdict) -> str:
    return f"Evaluation: {verdict.correct}\nRuntime: {runtime(verdict.runtime_ms)}\n"


class RunRecorder:
    """Owns one run directory: the manifest, the verdict log and the per-candidate files."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.verdicts_path = run_dir / VERDICTS
        self._lines: list[bytes] = []
        self._stamp: tuple[int, int, int] | None = None

    def write_manifest(self, manifest: RunManifest) -> None:
        write_atomic(self.run_dir / MANIFEST, manifest.model_dump_json(indent=2))

    def read_manifest(self) -> RunManifest | None:
        path = self.run_dir / MANIFEST
        return RunManifest.model_validate_json(path.read_text()) if path.exists() else None

    def log_path(self, problem: str, candidate: str, stage: str) -> Path:
        return self.run_dir / "logs" / problem / f"{candidate}.{stage}.log"

    def append(self, verdict: Verdict) -> None:
        line = (verdict.model_dump_json() + "\n").encode()
        fd = os.open(self.verdicts_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._lines.append(line)
        self._stamp = _stamp(self.verdicts_path)
        write_atomic(self.run_dir / verdict.problem / f"{verdict.candidate}.txt", two_lines(verdict))

    def tampered(self) -> bool:
        """True (after restoring it) when `verdicts.jsonl` changed since our last write."""
        if _stamp(self.verdicts_path) == self._stamp:
            return False
        current = self.verdicts_path.read_bytes() if self.verdicts_path.exists() else b""
        ours = b"".join(self._lines)
        if current == ours and self.verdicts_path.exists():
            self._stamp = _stamp(self.verdicts_path)
            return False
        write_atomic(self.verdicts_path, ours.decode())
        self._stamp = _stamp(self.verdicts_path)
        return True

    def finalize(self, manifest: RunManifest) -> bool:
        """Restore anything altered, and rewrite the manifest and every two-line file from memory."""
        altered = self.tampered()
        path = self.run_dir / MANIFEST
        text = manifest.model_dump_json(indent=2)
        if not path.exists() or path.read_text(errors="replace") != text:
            altered = altered or path.exists()
            self.write_manifest(manifest)
        for line in self._lines:
            verdict = Verdict.model_validate_json(line)
            path = self.run_dir / verdict.problem / f"{verdict.candidate}.txt"
            write_atomic(path, two_lines(verdict))
        return altered

    def load(self) -> list[Verdict]:
        """Every complete verdict line; a torn last line (the harness died mid-write) is dropped."""
        if not self.verdicts_path.exists():
            return []
        raw = self.verdicts_path.read_bytes()
        verdicts, complete = [], raw.endswith(b"\n")
        lines = raw.split(b"\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                verdicts.append(Verdict.model_validate_json(line))
            except ValueError:
                if i == len(lines) - 1 and not complete:
                    continue
                raise
        if not complete:  # rewrite without the torn tail so the next append starts on a fresh line
            write_atomic(self.verdicts_path, "".join(v.model_dump_json() + "\n" for v in verdicts))
        self._lines = [(v.model_dump_json() + "\n").encode() for v in verdicts]
        if complete:
            self._lines = [line + b"\n" for line in raw.split(b"\n") if line.strip()]
        self._stamp = _stamp(self.verdicts_path)
        return verdicts


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_ctime_ns
