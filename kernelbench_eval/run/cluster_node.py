"""The node side of `--backend ray`: the compile task and the lane actor, as they run on whichever node Ray
placed them, with that node's own build cache (`node_cache`) and nothing shared with the driver but what Ray
carries (see `ray_backend` for what travels, and how).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path

import ray

from kernelbench_eval.building import artifacts
from kernelbench_eval.building.compile import Compiled, build_lock, compile_candidate, warm_build, warmup_for
from kernelbench_eval.building.jitwarmup import WarmupSpec
from kernelbench_eval.building.relocate import relocate
from kernelbench_eval.building.signed import RECORD_NAME, adopt
from kernelbench_eval.discover.corpus import Candidate, Problem
from kernelbench_eval.isolation.linux import keep_memory_private
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.records import CompileRecord, Findings
from kernelbench_eval.run.lanes import EvalLane, LaneConfig, LaneResult, LaneSpec

RETRIES = 3  # a compile or a lane, after its node died


_label: str | None = None


def node_label() -> str:
    """This node as verdicts name it: its Ray node name (the IP, or `ray start --node-name`) and id prefix."""
    global _label
    if _label is None:
        node_id = ray.get_runtime_context().get_node_id()
        name = next((n.get("NodeName") for n in ray.nodes() if n.get("NodeID") == node_id), None)
        _label = f"{name}/{node_id[:8]}" if name else node_id[:8]
    return _label


def node_cache(driver_cache: str) -> Path:
    """This node's build cache: the KBEVAL_CACHE_DIR of its `ray start`, else the driver's --cache-dir path."""
    env = os.environ.get("KBEVAL_CACHE_DIR")
    return (Path(env) if env else Path(driver_cache)).expanduser().resolve()  # its workers run elsewhere


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def read(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def local_warmup(warm: WarmupSpec | None, problem_source: bytes, folder: Path) -> WarmupSpec | None:
    """The warm-up's spec with its problem at a path of this node (written from the driver's bytes)."""
    if warm is None:
        return None
    path = folder / warm.problem_sha256[:16] / warm.problem.name
    if not path.exists():
        write(path, problem_source)
    return dataclasses.replace(warm, problem=path, gpu=None)  # a lane's GPU is the one Ray gave its actor


@ray.remote(num_cpus=1, num_returns=2, max_retries=RETRIES)
def compile_task(cand: Candidate, source: bytes, device: str, cache_dir: str, timeout: float,
                  warm: WarmupSpec | None, problem_source: bytes) -> tuple[dict, bytes]:
    """Build on this node from the driver's bytes; return what the driver records, and the packed build.
    A CPU build is warmed up here; a CUDA one on its judging node (this task holds no GPU)."""
    os.environ.setdefault("MAX_JOBS", "1")  # one CPU per task: ninja must not spread over the node
    with tempfile.TemporaryDirectory(prefix="kbeval-src-") as tmp:
        path = Path(tmp) / cand.problem_id / cand.path.name
        write(path, source)
        log = Path(tmp) / "compile.log"
        compiled = compile_candidate(dataclasses.replace(cand, path=path), device, node_cache(cache_dir), log,
                                     timeout, local_warmup(warm, problem_source, Path(tmp) / "problems"),
                                     warm_here=device == "cpu")
        meta = {"record": compiled.record, "cached": compiled.cached, "build": str(compiled.build_dir),
                "node": node_label(), "log": read(log)}
    packed = b""
    if compiled.record.ok:  # a failed build goes to no lane
        with build_lock(compiled.build_dir):
            packed = artifacts.pack(compiled.build_dir)
    return meta, packed


class LaneActor:
    """One lane on whatever node Ray placed it, with a private folder for sources, logs and baselines."""

    def __init__(self, spec: LaneSpec, config: LaneConfig, cache_dir: str, baselines: bytes) -> None:
        keep_memory_private()  # expected outputs live here: candidates (same user) must not read them
        self.cache = node_cache(cache_dir)
        self.tmp = Path(tempfile.mkdtemp(prefix="kbeval-lane-"))
        self.baselines = self.tmp / "baselines.json"  # seeded from the driver's; new entries go back to it
        if baselines:
            self.baselines.write_bytes(baselines)
        gpus = ",".join(str(g) for g in ray.get_gpu_ids())
        label = f"ray:{node_label()}/cuda:{gpus}" if gpus else f"ray:{node_label()}/{spec.label}"
        self.lane = EvalLane(LaneSpec(label, spec.env), dataclasses.replace(config, baselines=self.baselines))
        self.problems: dict[str, Problem] = {}

    def node(self) -> str:
        return node_label()

    def evaluate(self, job: dict) -> dict:
        problem = self._problem(job["problem"], job["problem_source"])
        folder = self.tmp / "work" / problem.problem_id
        path, log, ref_log = folder / job["file"], folder / "candidate.eval.log", folder / "_reference.eval.log"
        write(path, job["source"])
        log.unlink(missing_ok=True)
        try:
            build = self._build(job["build"], job["packed"], job["record"])
            record, warmed = self._warm(job, build, path, log)
            if record.ok:
                result = self.lane.evaluate(problem, path, Compiled(record, build, job["cached"]), ref_log, log)
            else:
                result = LaneResult(Findings(status=record.status or "compile_error", error=record.error,
                                             lane=self.lane.spec.label))  # its warm-up failed on this lane
        finally:
            path.unlink(missing_ok=True)
        baseline = BaselineStore(self.baselines).get(result.baseline_key) if result.baseline_key else None
        return {"result": result, "log": read(log), "ref_log": read(ref_log), "record": record, "warmed": warmed,
                "node": node_label(), "baseline": baseline.model_dump(mode="json") if baseline else None}

    def _warm(self, job: dict, build: Path, path: Path, log: Path) -> tuple[CompileRecord, float]:
        """A CUDA build's warm-up, on this node's copy, once (`warm_build`); the seconds it took here."""
        record: CompileRecord = job["record"]
        cand = Candidate(job["problem"].problem_id, path.stem, path, "")
        if not record.ok or record.warmup_seconds is not None or warmup_for(cand, job["warm"]) is None:
            return record, 0.0
        warm = local_warmup(job["warm"], job["problem_source"], self.tmp / "warm")
        started = time.perf_counter()
        config = self.lane.config
        warmed = warm_build(cand, build, warm, config.settings.device, log, config.budgets.build)
        return warmed, time.perf_counter() - started

    def _problem(self, problem: Problem, source: bytes) -> Problem:
        """The problem at a path of this node, written once per source (an equal Problem keeps the session)."""
        key = f"{problem.source_sha256[:16]}/{problem.path.name}"
        if key not in self.problems:
            write(self.tmp / "problems" / key, source)
            self.problems[key] = dataclasses.replace(problem, path=self.tmp / "problems" / key)
        return self.problems[key]

    def _build(self, remote: str, packed: list[ray.ObjectRef], record: CompileRecord) -> Path:
        """The build in this node's cache; fetched (once per node, under the build's lock) only if absent,
        rewritten for this path (`relocate`), and signed with this node's key (the driver vouches for the
        bytes it built: `artifacts` checks them)."""
        build = self.cache / "builds" / Path(remote).name  # the name is the content key
        if (build / RECORD_NAME).exists():
            return build
        with build_lock(build, verify=False):
            if not (build / RECORD_NAME).exists():  # another lane of this node may have fetched it meanwhile
                made_at = artifacts.unpack(ray.get(packed[0]), build)
                relocate(build, made_at)
                adopt(build, record)
        return build

    def close(self) -> None:
        self.lane.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
