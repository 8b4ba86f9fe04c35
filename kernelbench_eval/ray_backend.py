"""`--backend ray`: compiles as Ray tasks on CPU workers, evaluation lanes as Ray actors holding one GPU each.

Why actors and not one task per evaluation: a lane keeps its problem's reference session open between
candidates (as a local lane does), which a stateless task could not. Each actor hosts the very `EvalLane`
of the local backend, so a candidate still runs in its own worker process, started by the actor; the
driver (this process) records each verdict as it arrives, so a Ray run resumes like a local one.

What it needs of a cluster: the problems, candidates, run folder and build cache (`--cache-dir`) at the
same paths on every node (a shared filesystem), since tasks read candidates and write logs and builds
where the driver names them. Ray gives an actor with `num_gpus=1` its own CUDA_VISIBLE_DEVICES, which the
lane's workers inherit.
"""

from __future__ import annotations

import os
from pathlib import Path

import ray

from kernelbench_eval.compile import Compiled, compile_candidate
from kernelbench_eval.discover import Candidate, Problem
from kernelbench_eval.lanes import EvalLane, LaneConfig, LaneHandle, LaneResult, LaneSpec
from kernelbench_eval.linux import keep_memory_private
from kernelbench_eval.process import PACKAGE_ROOT


@ray.remote(num_cpus=1)
def _compile_task(cand: Candidate, device: str, cache_dir: Path, log: Path, timeout: float) -> Compiled:
    os.environ.setdefault("MAX_JOBS", "1")  # one CPU per task: ninja must not spread over the node
    return compile_candidate(cand, device, cache_dir, log, timeout)


class _LaneActor:
    """One lane on whatever node and GPU Ray placed it; its label says which."""

    def __init__(self, spec: LaneSpec, config: LaneConfig) -> None:
        keep_memory_private()  # expected outputs live here: candidates (same user) must not read them
        where = ray.get_runtime_context().get_node_id()[:8]
        gpus = ",".join(str(g) for g in ray.get_gpu_ids())
        label = f"ray:{where}/cuda:{gpus}" if gpus else f"ray:{where}/{spec.label}"
        self.lane = EvalLane(LaneSpec(label, spec.env), config)

    def evaluate(self, problem: Problem, path: Path, compiled: Compiled, ref_log: Path, log: Path) -> LaneResult:
        return self.lane.evaluate(problem, path, compiled, ref_log, log)

    def close(self) -> None:
        self.lane.close()


class _RemoteLane:
    """The driver's handle on one lane actor: blocking calls, so `schedule.drive` treats it as a local lane."""

    def __init__(self, actor: ray.actor.ActorHandle) -> None:
        self.actor = actor

    def evaluate(self, problem: Problem, path: Path, compiled: Compiled, ref_log: Path, log: Path) -> LaneResult:
        return ray.get(self.actor.evaluate.remote(problem, path, compiled, ref_log, log))

    def close(self) -> None:
        try:
            ray.get(self.actor.close.remote(), timeout=60)
        finally:
            ray.kill(self.actor)


class RayBackend:
    name = "ray"

    def __init__(self, address: str | None) -> None:
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:  # address None starts a local instance; "auto" or ray://... joins a cluster
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": str(PACKAGE_ROOT)}})

    def compile(self, cand: Candidate, device: str, cache_dir: Path, log: Path, timeout: float) -> Compiled:
        return ray.get(_compile_task.remote(cand, device, cache_dir, log, timeout))

    def lanes(self, config: LaneConfig, gpus: list[str] | None, count: int | None) -> list[LaneHandle]:
        """One actor per lane: for CUDA, one per GPU of the cluster (or `count`), each holding one GPU.

        `gpus` names GPUs of this host, which means nothing on a cluster: Ray picks each actor's GPU.
        """
        if config.settings.device == "cuda":
            count = count or int(ray.cluster_resources().get("GPU", 0))
            if count < 1:
                raise RuntimeError("the Ray cluster has no GPU for a CUDA run")
            actor = ray.remote(num_gpus=1, num_cpus=1)(_LaneActor)
            return [_RemoteLane(actor.remote(LaneSpec(f"cuda:{n}"), config)) for n in range(count)]
        actor = ray.remote(num_cpus=1)(_LaneActor)
        return [_RemoteLane(actor.remote(LaneSpec(f"cpu:{n}"), config)) for n in range(count or 1)]

    def close(self) -> None:
        if self._owns_ray:
            ray.shutdown()

