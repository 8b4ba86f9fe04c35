"""`--backend ray`: compiles as Ray tasks on any node's free CPUs, evaluation lanes as Ray actors (one
GPU each, or one CPU for CPU runs), on a cluster whose nodes share no filesystem.

Why actors and not one task per evaluation: a lane keeps its problem's reference session open between
candidates (as a local lane does), which a stateless task could not. Each actor hosts the very `EvalLane`
of the local backend, so a candidate still runs in its own worker process, started by the actor.

What travels, and how (nothing assumes a shared filesystem):
- sources: the driver reads each candidate and problem and sends their bytes; a node writes them into a
  private temporary folder of its own;
- builds: each node builds into its own cache (its KBEVAL_CACHE_DIR, else the driver's --cache-dir path);
  a finished build returns to the driver as packed bytes (`artifacts`), a Ray object the driver owns and
  keys by the build's content key; a lane unpacks it into its node's cache only when that node does not
  hold the build yet;
- logs and baselines: they come back as bytes and the driver writes them into the run folder.

Faults: Ray retries a compile whose node died (and rebuilds a build whose bytes died with their node);
a lane whose node died is restarted elsewhere (by Ray, or replaced by the driver) and judges its
candidate again. Only the driver records
verdicts, once each, as they arrive, so a lost node costs only its work in flight and `--resume` works.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayError

from kernelbench_eval import artifacts
from kernelbench_eval.baselines import BaselineStore
from kernelbench_eval.compile import RECORD_NAME, Compiled, adopt, build_lock, compile_candidate
from kernelbench_eval.discover import Candidate, Problem
from kernelbench_eval.lanes import EvalLane, LaneConfig, LaneHandle, LaneResult, LaneSpec, Prepared
from kernelbench_eval.linux import keep_memory_private
from kernelbench_eval.models import Baseline, CompileRecord
from kernelbench_eval.process import PACKAGE_ROOT

MARK = 0.001  # of a placement resource, per task or lane: it picks the nodes, it never limits how many
RETRIES = 3  # a compile or a lane, after its node died
LANE_WAITS = [1, 2, 4, 8, 15, 30, 30, 30, 30, 30]  # s between calls to a lane being restarted (~3 min in all)


@dataclasses.dataclass
class RayCompiled(Compiled):
    built_on: str | None = None  # the node that built it (recorded as the verdict's `built_on`)


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
    return Path(env) if env else Path(driver_cache)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _read(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


@ray.remote(num_cpus=1, num_returns=2, max_retries=RETRIES)
def _compile_task(cand: Candidate, source: bytes, device: str, cache_dir: str, timeout: float
                  ) -> tuple[dict, bytes]:
    """Build on this node from the driver's bytes; return what the driver records, and the packed build."""
    os.environ.setdefault("MAX_JOBS", "1")  # one CPU per task: ninja must not spread over the node
    with tempfile.TemporaryDirectory(prefix="kbeval-src-") as tmp:
        path = Path(tmp) / cand.problem_id / cand.path.name
        _write(path, source)
        log = Path(tmp) / "compile.log"
        compiled = compile_candidate(dataclasses.replace(cand, path=path), device, node_cache(cache_dir), log,
                                     timeout)
        meta = {"record": compiled.record, "cached": compiled.cached, "build": str(compiled.build_dir),
                "node": node_label(), "log": _read(log)}
    packed = b""
    if compiled.record.ok:  # a failed build goes to no lane
        with build_lock(compiled.build_dir):
            packed = artifacts.pack(compiled.build_dir)
    return meta, packed


class _LaneActor:
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

    def evaluate(self, job: dict) -> dict:
        problem = self._problem(job["problem"], job["problem_source"])
        build = self._build(job["build"], job["packed"], job["record"])
        folder = self.tmp / "work" / problem.problem_id
        path, log, ref_log = folder / job["file"], folder / "candidate.eval.log", folder / "_reference.eval.log"
        _write(path, job["source"])
        log.unlink(missing_ok=True)
        try:
            result = self.lane.evaluate(problem, path, Compiled(job["record"], build, job["cached"]), ref_log, log)
        finally:
            path.unlink(missing_ok=True)
        baseline = BaselineStore(self.baselines).get(result.baseline_key) if result.baseline_key else None
        return {"result": result, "log": _read(log), "ref_log": _read(ref_log),
                "baseline": baseline.model_dump(mode="json") if baseline else None}

    def _problem(self, problem: Problem, source: bytes) -> Problem:
        """The problem at a path of this node, written once per source (an equal Problem keeps the session)."""
        key = f"{problem.source_sha256[:16]}/{problem.path.name}"
        if key not in self.problems:
            _write(self.tmp / "problems" / key, source)
            self.problems[key] = dataclasses.replace(problem, path=self.tmp / "problems" / key)
        return self.problems[key]

    def _build(self, remote: str, packed: list[ray.ObjectRef], record: CompileRecord) -> Path:
        """The build in this node's cache; fetched (once per node, under the build's lock) only if absent, and
        signed with this node's key (the driver vouches for the bytes it built: `artifacts` checks them)."""
        build = self.cache / "builds" / Path(remote).name  # the name is the content key
        if (build / RECORD_NAME).exists():
            return build
        with build_lock(build, verify=False):
            if not (build / RECORD_NAME).exists():  # another lane of this node may have fetched it meanwhile
                artifacts.unpack(ray.get(packed[0]), build)
                adopt(build, record)
        return build

    def close(self) -> None:
        self.lane.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class _RemoteLane:
    """The driver's handle on one lane actor: blocking calls, so `schedule.drive` treats it as a local lane.

    A lane whose node is lost is retried here, not only by Ray: while Ray restarts the actor elsewhere its
    calls fail as unavailable, and once its restarts are spent it is dead and replaced by a new actor.
    """

    def __init__(self, backend: RayBackend, make: Callable[[], ray.actor.ActorHandle], baselines: Path) -> None:
        self.backend, self.make, self.baselines = backend, make, baselines
        self.actor = make()
        self.held: list[str] = []  # the problem its actor judged last (its reference is open there)

    def evaluate(self, problem: Problem, path: Path, compiled: Compiled, ref_log: Path, log: Path) -> LaneResult:
        job = {"problem": problem, "problem_source": self.backend.source(problem.path), "file": path.name,
               "source": self.backend.source(path), "build": str(compiled.build_dir), "record": compiled.record,
               "cached": compiled.cached, "packed": [self.backend.packed[compiled.build_dir.name]]}
        try:  # the build as a list: Ray leaves it unfetched, the lane fetches it only if its node lacks it
            reply = self._call(job)
        finally:
            self.backend.release(compiled.build_dir.name)
        self.held = [problem.problem_id]
        _write(log, reply["log"])
        _write(ref_log, reply["ref_log"])
        if reply["baseline"]:  # measured (or read) in the lane's copy: the driver's file is the run's
            BaselineStore(self.baselines).put(Baseline.model_validate(reply["baseline"]))
        return reply["result"]

    def prepare(self, problem: Problem, ref_log: Path) -> Prepared | None:
        """Nothing ahead of time: the actor opens a problem with its first candidate (a reference opened early
        there would need its log and baselines shipped back on a call of their own)."""
        return None

    def holds(self) -> list[str]:
        return self.held

    def _call(self, job: dict) -> dict:
        for wait in LANE_WAITS:
            try:
                return ray.get(self.actor.evaluate.remote(job))
            except ActorDiedError:
                self.actor = self.make()  # wherever Ray finds room: the lost evaluation runs again there
            except ActorUnavailableError:
                time.sleep(wait)  # being restarted on another node
        return ray.get(self.actor.evaluate.remote(job))

    def close(self) -> None:
        try:
            ray.get(self.actor.close.remote(), timeout=60)
        except RayError:
            pass  # a lane lost with its node has nothing left to close
        finally:
            ray.kill(self.actor)


class RayBackend:
    name = "ray"

    def __init__(self, address: str | None, cache_dir: Path, build_resource: str | None = None,
                 judge_resource: str | None = None) -> None:
        """`build_resource`/`judge_resource`: custom node resources (`ray start --resources`) that place
        compiles and lanes on the nodes declaring them; by default compiles go anywhere, lanes to GPUs."""
        self.cache_dir, self.build_resource, self.judge_resource = str(cache_dir), build_resource, judge_resource
        self.packed: dict[str, ray.ObjectRef] = {}  # build name -> its packed bytes, owned here
        self._uses: dict[str, int] = {}  # evaluations still to come per build: its bytes are freed after
        self._sources: dict[Path, bytes] = {}
        self._lock = threading.Lock()
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:  # address None starts a local instance; "auto" or ray://... joins a cluster
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": str(PACKAGE_ROOT)}})

    def release(self, build: str) -> None:
        with self._lock:
            self._uses[build] -= 1
            if not self._uses[build]:
                del self._uses[build], self.packed[build]

    def source(self, path: Path) -> bytes:
        """A file's bytes as first read: a lane judges the very bytes that were built."""
        with self._lock:
            if path not in self._sources:
                self._sources[path] = path.read_bytes()
            return self._sources[path]

    def compile(self, cand: Candidate, device: str, cache_dir: Path, log: Path, timeout: float) -> Compiled:
        task = _compile_task.options(**_placement(self.build_resource))
        meta_ref, packed = task.remote(cand, self.source(cand.path), device, str(cache_dir), timeout)
        meta = ray.get(meta_ref)
        _write(log, meta["log"])
        build = Path(meta["build"])
        if meta["record"].ok:  # a failed build goes to no lane
            with self._lock:  # two problems' identical sources share one build
                self.packed[build.name] = packed
                self._uses[build.name] = self._uses.get(build.name, 0) + 1
        return RayCompiled(meta["record"], build, meta["cached"], built_on=meta["node"])

    def lanes(self, config: LaneConfig, gpus: list[str] | None, count: int | None) -> list[LaneHandle]:
        """One actor per lane: for CUDA, one per GPU of the cluster (or `count`), each holding one GPU.

        `gpus` names GPUs of this host, which means nothing on a cluster: Ray picks each actor's GPU.
        """
        options = {"num_cpus": 1, "max_restarts": RETRIES, "max_task_retries": RETRIES,
                   **_placement(self.judge_resource)}
        if config.settings.device == "cuda":
            count = count or int(ray.cluster_resources().get("GPU", 0))
            if count < 1:
                raise RuntimeError("the Ray cluster has no GPU for a CUDA run")
            options["num_gpus"] = 1
        actor = ray.remote(_LaneActor).options(**options)
        baselines = _read(config.baselines)

        def make(n: int) -> Callable[[], ray.actor.ActorHandle]:
            spec = LaneSpec(f"{config.settings.device}:{n}")
            return lambda: actor.remote(spec, config, self.cache_dir, baselines)

        return [_RemoteLane(self, make(n), config.baselines) for n in range(count or 1)]

    def close(self) -> None:
        self.packed.clear()
        if self._owns_ray:
            ray.shutdown()


def _placement(resource: str | None) -> dict:
    return {"resources": {resource: MARK}} if resource else {}
