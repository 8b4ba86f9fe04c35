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
  hold the build yet, rewritten for its path there (`relocate`: no rebuild), and signed with that node's key;
  the driver knows which nodes hold which build, and a lane prefers candidates whose build its node holds
  (`has_build`, used by `schedule`);
- Triton warm-ups (`warmup.py`) need the GPU a compile task does not hold: a CUDA build is warmed up on the
  judging node, under the build's lock, before its first evaluation there (`compile.warm_build`); its time
  is added to the verdict's compile time;
- logs and baselines: they come back as bytes and the driver writes them into the run folder.

Faults: Ray retries a compile whose node died (and rebuilds a build whose bytes died with their node);
a lane whose node died is restarted elsewhere (by Ray, or replaced by the driver) and judges its
candidate again. Only the driver records
verdicts, once each, as they arrive, so a lost node costs only its work in flight and `--resume` works.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayError

from kernelbench_eval.building.compile import Compiled
from kernelbench_eval.building.jitwarmup import WarmupSpec
from kernelbench_eval.discover.corpus import Candidate, Problem
from kernelbench_eval.isolation.workerenv import PACKAGE_ROOT
from kernelbench_eval.judge.baselines import BaselineStore
from kernelbench_eval.records import Baseline
from kernelbench_eval.run.cluster_node import RETRIES, LaneActor, compile_task, read, write
from kernelbench_eval.run.lanes import LaneConfig, LaneHandle, LaneResult, LaneSpec, Prepared

MARK = 0.001  # of a placement resource, per task or lane: it picks the nodes, it never limits how many
LANE_WAITS = [1, 2, 4, 8, 15, 30, 30, 30, 30, 30]  # s between calls to a lane being restarted (~3 min in all)


@dataclasses.dataclass
class RayCompiled(Compiled):
    built_on: str | None = None  # the node that built it (recorded as the verdict's `built_on`)
    warmed_in_lane: float = 0.0  # seconds of the warm-up a lane ran (`compile.warm_build`): compile time too


class _RemoteLane:
    """The driver's handle on one lane actor: blocking calls, so `schedule.drive` treats it as a local lane.

    A lane whose node is lost is retried here, not only by Ray: while Ray restarts the actor elsewhere its
    calls fail as unavailable, and once its restarts are spent it is dead and replaced by a new actor.
    """

    def __init__(self, backend: RayBackend, make: Callable[[], ray.actor.ActorHandle], baselines: Path) -> None:
        self.backend, self.make, self.baselines = backend, make, baselines
        self._start()

    def _start(self) -> None:
        self.actor = self.make()
        self.node: str | None = None  # learnt from its replies (the node may change when Ray restarts it)
        self._asked = self.actor.node.remote()  # answered once Ray has placed it: never waited for
        self.held: list[str] = []  # the problem its actor judged last (its reference is open there)

    def has_build(self, compiled: Compiled) -> bool:
        """Whether this lane's node already holds the build (made or fetched there): no fetch to judge it."""
        if self.node is None and self._asked is not None and ray.wait([self._asked], timeout=0)[0]:
            with contextlib.suppress(RayError):
                self.node = ray.get(self._asked)
            self._asked = None
        return self.node is not None and self.backend.node_has(compiled.build_dir.name, self.node)

    def evaluate(self, problem: Problem, path: Path, compiled: Compiled, ref_log: Path, log: Path) -> LaneResult:
        job = {"problem": problem, "problem_source": self.backend.source(problem.path), "file": path.name,
               "source": self.backend.source(path), "build": str(compiled.build_dir), "record": compiled.record,
               "cached": compiled.cached, "packed": [self.backend.packed[compiled.build_dir.name]],
               "warm": self.backend.warm.get(compiled.build_dir.name)}
        try:  # the build as a list: Ray leaves it unfetched, the lane fetches it only if its node lacks it
            reply = self._call(job)
            self.node = reply["node"]
            self.backend.placed(compiled.build_dir.name, self.node)
        finally:
            self.backend.release(compiled.build_dir.name)
        self.held = [problem.problem_id]
        compiled.record = reply["record"]  # a warm-up here (`_LaneActor._warm`) may have changed it
        if isinstance(compiled, RayCompiled):
            compiled.warmed_in_lane += reply["warmed"]
        write(log, reply["log"])
        write(ref_log, reply["ref_log"])
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
                self._start()  # wherever Ray finds room: the lost evaluation runs again there
            except ActorUnavailableError:
                self.node = None
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
        self.warm: dict[str, WarmupSpec] = {}  # build name -> its warm-up's inputs, for a lane that owes it one
        self._where: dict[str, set[str]] = {}  # build name -> the nodes holding it (built or fetched there)
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
                self.warm.pop(build, None)

    def placed(self, build: str, node: str) -> None:
        with self._lock:
            self._where.setdefault(build, set()).add(node)

    def node_has(self, build: str, node: str) -> bool:
        with self._lock:
            return node in self._where.get(build, ())

    def source(self, path: Path) -> bytes:
        """A file's bytes as first read: a lane judges the very bytes that were built."""
        with self._lock:
            if path not in self._sources:
                self._sources[path] = path.read_bytes()
            return self._sources[path]

    def compile(self, cand: Candidate, device: str, cache_dir: Path, log: Path, timeout: float,
                warm: WarmupSpec | None = None) -> Compiled:
        task = compile_task.options(**_placement(self.build_resource))
        problem = self.source(warm.problem) if warm else b""
        meta_ref, packed = task.remote(cand, self.source(cand.path), device, str(cache_dir), timeout, warm, problem)
        meta = ray.get(meta_ref)
        write(log, meta["log"])
        build = Path(meta["build"])
        if meta["record"].ok:  # a failed build goes to no lane
            with self._lock:  # two problems' identical sources share one build
                self.packed[build.name] = packed
                self._uses[build.name] = self._uses.get(build.name, 0) + 1
                self._where.setdefault(build.name, set()).add(meta["node"])
                if warm is not None:  # a lane runs a warm-up the compile task could not (`LaneActor._warm`)
                    self.warm[build.name] = warm
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
        actor = ray.remote(LaneActor).options(**options)
        baselines = read(config.baselines)

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
