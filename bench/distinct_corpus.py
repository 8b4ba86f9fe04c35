#!/usr/bin/env python3
"""Hundreds of distinct candidates across a hundred KernelBench problems, cold, against the compiler's floor
(issue 38, goal 2).

The corpus is generated, never committed: for each of `--problems` problems of a KernelBench export (levels
round-robin, `bench/kernelbench_selftest.py export`), `--per-problem` samples in KernelBench's flat generation
layout (`level_L_problem_P_sample_S_kernel.py`). Each sample is honest and its own build: the problem's reference
code, then a CUDA `load_inline` extension with a name and a kernel of its own that copies the model's float32
outputs (multiplied by 1.0, exact), so every sample compiles, loads and is judged like a real candidate.

Then, on the GPU machine:
1. the floor: one such extension built alone with plain `load_inline` (no harness, `MAX_JOBS=1`), its CPU
   seconds (the compilers' too) taken as what a build costs; the machine's cores allow `cores / cpu_s` builds a
   second, the floor a run's builds are measured against;
2. `kbeval run --device cuda` on the whole corpus, cold (fresh cache), `--no-compile-baseline` (a torch.compile
   baseline is a per-problem cost, cached across runs, not a candidate's), with its per-phase account
   (`RUN_DIR/phases.json`: builds, references, judging, idle).

Writes the `## Distinct candidates at scale` section of docs/benchmarks.md, the lines first:
`distinct400_cold_minutes:` (the run's wall) and `build_rate_vs_floor:` (builds per second over the build phase's
wall, against the floor), and raw numbers to $OUT/distinct_corpus.json.

    python3 bench/distinct_corpus.py --kb .kb/2025-01 --problems 100 --per-problem 4 --levels 1,2

A device call is limited to 10 minutes: with `--tree` (a git-ignored folder of the checkout, which the device keeps
between calls) a second call with the same arguments resumes the run where the first one's `--deadline` cut it,
and the section counts both sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchdoc import REPO, kbeval_env, machine_line, out_dir, run_bounded, tail, usable_cores, write_section

SECTION = "## Distinct candidates at scale"
_NUMBERED = re.compile(r"(\d+)_.*\.py")

EXTENSION = '''
import torch as _torch
from torch.utils.cpp_extension import load_inline as _load_inline

_CUDA_{tag} = r"""
#include <torch/extension.h>
__global__ void copy_{tag}(const float* __restrict__ x, float* __restrict__ y, long n, float s) {{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s;
}}
torch::Tensor scaled_copy(torch::Tensor x, double s) {{
    auto y = torch::empty_like(x);
    long n = x.numel();
    if (n > 0) copy_{tag}<<<(unsigned)((n + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n, (float)s);
    return y;
}}
"""
_ext_{tag} = _load_inline(name="kbd_{tag}", cpp_sources="torch::Tensor scaled_copy(torch::Tensor x, double s);",
                          cuda_sources=_CUDA_{tag}, functions=["scaled_copy"])


def _through_{tag}(out):
    if isinstance(out, _torch.Tensor) and out.is_cuda and out.dtype == _torch.float32 and out.is_contiguous():
        return _ext_{tag}.scaled_copy(out, 1.0)
    if isinstance(out, (tuple, list)):
        return type(out)(_through_{tag}(o) for o in out)
    return out


class ModelNew(Model):
    """The reference's own forward, its float32 outputs passed through this sample's own kernel."""

    def forward(self, *args):
        return _through_{tag}(super().forward(*args))
'''


def pick_problems(kb: Path, count: int, levels: list[int]) -> list[tuple[int, int, Path]]:
    """(level, number, file) of `count` problems, taken from the levels in turn, lowest numbers first."""
    queues = [sorted(((int(m.group(1)), p) for p in (kb / f"level{lv}").glob("*.py")
                      if (m := _NUMBERED.fullmatch(p.name))), key=lambda t: t[0]) for lv in levels]
    picked: list[tuple[int, int, Path]] = []
    while len(picked) < count and any(queues):
        for level, queue in zip(levels, queues, strict=True):
            if queue and len(picked) < count:
                number, path = queue.pop(0)
                picked.append((level, number, path))
    return picked


def cuda_source(tag: str) -> str:
    """The CUDA source of a sample's extension (what `nvcc_floor` builds alone)."""
    return EXTENSION.split('r"""', 1)[1].split('"""', 1)[0].format(tag=tag)


def candidate_source(problem_text: str, tag: str) -> str:
    """A sample: the problem's code, then its own extension and `ModelNew` (see the module's docstring)."""
    return problem_text.rstrip("\n") + "\n\n" + EXTENSION.format(tag=tag)


def write_corpus(kb: Path, out: Path, count: int, per_problem: int, levels: list[int]) -> int:
    """`out/problems/levelL/<file>` and `out/candidates/level_L_problem_P_sample_S_kernel.py`; the candidates."""
    written = 0
    for level, number, path in pick_problems(kb, count, levels):
        (out / "problems" / f"level{level}").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out / "problems" / f"level{level}" / path.name)
        (out / "candidates").mkdir(parents=True, exist_ok=True)
        for sample in range(per_problem):
            tag = f"l{level}p{number}s{sample}"
            name = f"level_{level}_problem_{number}_sample_{sample}_kernel.py"
            (out / "candidates" / name).write_text(candidate_source(path.read_text(), tag))
            written += 1
    if (kb / "NOTICE").exists():
        shutil.copyfile(kb / "NOTICE", out / "problems" / "NOTICE")
    return written


_FLOOR_CHILD = '''
import os, resource, sys, time
from torch.utils.cpp_extension import load_inline
src = sys.stdin.read()
started = time.monotonic()
load_inline(name="kbd_floor", cpp_sources="torch::Tensor scaled_copy(torch::Tensor x, double s);",
            cuda_sources=src, functions=["scaled_copy"], build_directory=sys.argv[1])
used = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(time.monotonic() - started, sum(u.ru_utime + u.ru_stime for u in used))
'''


def nvcc_floor(work: Path) -> dict[str, float]:
    """One sample's extension built alone by plain `load_inline` (`MAX_JOBS=1`, a fresh folder): its wall and CPU
    seconds (compilers included), and the builds a second the machine's cores allow at that cost."""
    build = work / "floor"
    build.mkdir(parents=True, exist_ok=True)
    cuda = cuda_source("floor")
    env = dict(os.environ, MAX_JOBS="1", TORCH_EXTENSIONS_DIR=str(work / "torch_ext"))
    proc = subprocess.run([sys.executable, "-c", _FLOOR_CHILD, str(build)], input=cuda, capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"the floor's build failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    wall_s, cpu_s = map(float, proc.stdout.split()[-2:])
    cores = usable_cores()
    return {"wall_s": round(wall_s, 2), "cpu_s": round(cpu_s, 2), "cores": cores,
            "builds_per_s": round(cores / cpu_s, 4)}


def run_kbeval(tree: Path, jobs: int, deadline: float) -> dict:
    """The cold run over the corpus, or its continuation (`--resume`) where an earlier call started it: its wall
    over every session, its statuses, its per-phase account (each session's, and their sum)."""
    run_dir = tree / "results" / "cold"
    if (run_dir / "run.json").exists():  # an earlier device call began it: finish it (its verdicts are kept)
        args = ["run", "--resume", str(run_dir), "--jobs", str(jobs)]
    else:
        args = ["run", "--device", "cuda", "--problems", str(tree / "problems"), "--candidates",
                str(tree / "candidates"), "--out", str(tree / "results"), "--run-id", "cold", "--no-compile-baseline",
                "--jobs", str(jobs)]
    rc, wall = run_bounded(args, kbeval_env(tree / "cache"), tree / "kbeval.log", deadline)
    verdicts, sessions = read_run(run_dir)
    statuses = dict(Counter(v["status"] for v in verdicts))
    errors = Counter(v["error"][:300] for v in verdicts if v["status"] != "ok" and v.get("error"))  # a corpus
    # that fails says why, the commonest first
    return {"rc": rc, "wall_s": round(sum(x.get("wall_s", 0.0) for x in sessions) or wall, 1),
            "sessions": len(sessions), "verdicts": len(verdicts), "statuses": statuses,
            "phases": _summed(sessions), "log_tail": tail(tree / "kbeval.log", 1500),
            "errors": errors.most_common(5)}


def read_run(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """A run's verdicts and its sessions' per-phase accounts (`phases.json`), as far as it got."""
    path, phases = run_dir / "verdicts.jsonl", run_dir / "phases.json"
    verdicts = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return verdicts, json.loads(phases.read_text())["sessions"] if phases.exists() else []


def corpus_arguments(parser: argparse.ArgumentParser, problems: int, per_problem: int) -> None:
    """The options that say which corpus to generate (`write_corpus`)."""
    parser.add_argument("--kb", type=Path, required=True, help="a KernelBench export (levelN/<id>.py)")
    parser.add_argument("--problems", type=int, default=problems)
    parser.add_argument("--per-problem", type=int, default=per_problem)
    parser.add_argument("--levels", default="1,2")


def _summed(sessions: list[dict]) -> dict:
    """The sessions' accounts added up (a run finished by `--resume` in a second device call has two)."""
    total: dict = {"running_s": {}, "done": {}, "idle_s": 0.0, "bound": None}
    for one in sessions:
        for phase, seconds in (one.get("running_s") or {}).items():
            total["running_s"][phase] = round(total["running_s"].get(phase, 0.0) + seconds, 3)
        for phase, finished in (one.get("done") or {}).items():
            total["done"][phase] = total["done"].get(phase, 0) + finished
        total["idle_s"] = round(total["idle_s"] + (one.get("idle_s") or 0.0), 3)
    if total["running_s"]:
        total["bound"] = max(total["running_s"], key=lambda p: total["running_s"][p])
    return total


def section(run: dict, floor: dict, count: int, problems: int, command: str) -> tuple[str, dict]:
    """The section and its lines. The minutes line is written only for a corpus judged whole; a run a deadline cut
    says how far it got, and the rate its finished builds had (never the candidates it was given over its time)."""
    build_s = (run["phases"].get("running_s") or {}).get("build") or 0.0
    built = (run["phases"].get("done") or {}).get("build", 0)
    rate = built / build_s if build_s and built else None
    numbers: dict[str, object] = {}
    if run["verdicts"] >= count:
        numbers[f"distinct{count}_cold_minutes"] = round(run["wall_s"] / 60, 2)
    else:
        numbers["distinct_cold_partial"] = f"{run['verdicts']}/{count} judged in {run['wall_s'] / 60:.2f} min"
    numbers["build_rate_vs_floor"] = round(rate / floor["builds_per_s"], 3) if rate else float("nan")
    lines = [SECTION, "", "```", *(f"{k}: {v}" for k, v in numbers.items()), "```", "",
             machine_line("cuda"), f"Command: `{command}`. {count} distinct candidates over {problems} problems, "
             f"cold, `--no-compile-baseline`; {run['verdicts']} judged, in {run['sessions']} session(s) (a second "
             "one resumes what a device call's limit cut; the wall is their sum).", "",
             "| what | figure |", "|---|---|",
             f"| kbeval wall, cold | {run['wall_s']} s ({run['verdicts']} verdicts: "
             + ", ".join(f"{n} {s}" for s, n in sorted(run["statuses"].items())) + ") |",
             f"| per-phase account (s running: build, reference, judge; idle) | "
             f"{run['phases'].get('running_s')}; idle {run['phases'].get('idle_s')}; bound: "
             f"{run['phases'].get('bound')} |",
             f"| builds finished, and per second over the build phase | {built}, {f'{rate:.3g}' if rate else '-'} |",
             f"| the floor: one plain `load_inline` build alone | {floor['wall_s']} s wall, {floor['cpu_s']} CPU s; "
             f"{floor['cores']} cores allow {floor['builds_per_s']:.3g} builds/s |", ""]
    return "\n".join(lines), numbers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_arguments(parser, problems=100, per_problem=4)
    parser.add_argument("--jobs", type=int, default=usable_cores())
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds the kbeval run may take")
    parser.add_argument("--generate-only", type=Path, help="write the corpus here and stop")
    parser.add_argument("--tree", type=Path, help="keep the corpus, cache and run here; run again with the same "
                        "--tree to finish a run a device call's time limit cut (`kbeval run --resume`)")
    parser.add_argument("--out-md", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.generate_only:
        print(write_corpus(args.kb, args.generate_only, args.problems, args.per_problem, levels), "candidates")
        return
    tree = (args.tree or Path(tempfile.mkdtemp(prefix="kbeval-distinct-"))).resolve()
    if (tree / "floor.json").exists():  # a second device call: the same corpus, its run resumed
        floor = json.loads((tree / "floor.json").read_text())
        count = len(list((tree / "candidates").glob("*.py")))
    else:
        count = write_corpus(args.kb, tree, args.problems, args.per_problem, levels)
        floor = nvcc_floor(tree)
        (tree / "floor.json").write_text(json.dumps(floor))
    started = time.monotonic()
    run = run_kbeval(tree, args.jobs, args.deadline)
    run["bench_wall_s"] = round(time.monotonic() - started, 1)
    command = " ".join(["python3 bench/distinct_corpus.py", *sys.argv[1:]])
    text, numbers = section(run, floor, count, args.problems, command)
    write_section(args.out_md, SECTION, text)
    raw = {"floor": floor, "run": run, "numbers": numbers, "candidates": count}
    if (out := out_dir()) is not None:
        (out / "distinct_corpus.json").write_text(json.dumps(raw, indent=1))
        (out / "distinct_section.md").write_text(text)
    print(text)
    print(json.dumps(numbers))


if __name__ == "__main__":
    main()
