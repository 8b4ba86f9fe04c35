"""Two identical copies of every candidate in one run: do their speedups agree, and do their intervals say so?

Issue 13's target for honest intervals: identical sources judged in one `kbeval run` (each in its own process,
its own allocations, its own place in the schedule) get speedups within 5 % of each other for kernels of
50 µs and more (10 % at about 20 µs), and each speedup lies inside the other copy's 95 % interval.

The corpus: the seed corpus's candidates that `candidates/SEEDS.md` expects to be `ok` on this device (the
others have no speedup to compare), plus small kernels written here (`SMALL`: SiLU at about 20 µs and 100 µs,
a row softmax at about 50 µs, a linear layer at about 100 µs on an H100), each as a pure-PyTorch candidate and,
for SiLU, a `load_inline` kernel. Every candidate is written twice (`NAME__a.py`, `NAME__b.py`, same bytes: one
build, two verdicts). One `kbeval run`, stopped at `--deadline` (what it recorded by then is reported).

    python3 bench/identical.py                            # on the GPU machine: ~5 min on an H100, cold
    python bench/identical.py --device cpu --dry-run      # anywhere: the whole pipeline, tiny, on the CPU

Writes the `## Identical copies (H100)` section of docs/benchmarks.md (`--out-md`; a dry run writes none
unless given one) and, when OUT is set, $OUT/identical.json (raw), $OUT/identical.md (the section) and
$OUT/identical.log (the run's output).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import tempfile
from pathlib import Path

from benchdoc import REPO, kbeval_env, machine_line, out_dir, run_bounded, tail, write_section

SECTION_CUDA = "## Identical copies (H100)"
SECTION_CPU = "## Identical copies (CPU dry run)"
COPIES = ("a", "b")
LONG_MS = 0.05  # kernels this long or longer: the 5 % target; shorter ones (about 20 µs here): 10 %
TARGETS = {True: 0.05, False: 0.10}

# Small problems: (id, sizes on the GPU, sizes for a dry run, source with {sizes}); sizes avoid the seed
# problems' names (batch_size, ...) so `--smoke` never resizes them.
PROBLEM_HEAD = '"""{doc} (written by bench/identical.py)."""\n\nimport torch\nimport torch.nn as nn\n\n\n'
SILU = PROBLEM_HEAD + """class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.silu(x)


{sizes}


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
"""
SOFTMAX = SILU.replace("torch.nn.functional.silu(x)", "torch.softmax(x, dim=1)")
LINEAR = PROBLEM_HEAD + """class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.fc = nn.Linear(features, features)

    def forward(self, x):
        return self.fc(x)


{sizes}


def get_inputs():
    return [torch.randn(rows, features)]


def get_init_inputs():
    return [features]
"""
SMALL = {
    # fp32 bytes read + written at ~3 TB/s, plus ~7 µs of launch and event overhead (docs/benchmarks.md)
    "silu_20us": ("SiLU, 5.2M floats: about 20 us on an H100", {"rows": 4096, "cols": 1280}, SILU),
    "silu_100us": ("SiLU, 33.6M floats: about 100 us on an H100", {"rows": 4096, "cols": 8192}, SILU),
    "softmax_50us": ("Row softmax, 16.8M floats: about 50 us on an H100", {"rows": 8192, "cols": 2048}, SOFTMAX),
    "linear_100us": ("Linear 2048 -> 2048 on 512 rows, fp32: about 100 us on an H100",
                     {"rows": 512, "features": 2048}, LINEAR),
}
DRY_SIZES = {"silu_20us": {"rows": 64, "cols": 256}, "silu_100us": {"rows": 128, "cols": 512},
             "softmax_50us": {"rows": 64, "cols": 256}, "linear_100us": {"rows": 16, "features": 128}}

CANDIDATE_HEAD = "# bench/identical.py: {doc}\nimport torch\nimport torch.nn as nn\n"
PY_CANDIDATES = {  # problem: (candidate name, what it is, forward's body)
    "silu_20us": ("py_x_sigmoid", "x * sigmoid(x), two kernels", "        return x * torch.sigmoid(x)\n"),
    "silu_100us": ("py_x_sigmoid", "x * sigmoid(x), two kernels", "        return x * torch.sigmoid(x)\n"),
    "softmax_50us": ("py_spelled_out", "softmax spelled out: max, exp, sum, divide",
                     "        e = torch.exp(x - x.amax(dim=1, keepdim=True))\n"
                     "        return e / e.sum(dim=1, keepdim=True)\n"),
    "linear_100us": ("py_matmul_add", "x @ W.T + b: a matmul and an add",
                     "        return x @ self.fc.weight.T + self.fc.bias\n"),
}
CUDA_SILU = CANDIDATE_HEAD.format(doc="SiLU as one CUDA kernel (load_inline)") + r'''
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__global__ void silu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = x[i];
        y[i] = v / (1.f + __expf(-v));
    }
}

torch::Tensor silu_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "silu_cuda: expected a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t n = xc.numel();
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 132 * 64);
    silu_kernel<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""
ext = load_inline(name="kbeval_bench_silu", cpp_sources="torch::Tensor silu_cuda(torch::Tensor x);",
                  cuda_sources=cuda_source, functions=["silu_cuda"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.silu_cuda(x)
'''
CPP_SILU = CANDIDATE_HEAD.format(doc="SiLU as one C++ loop (load_inline), for dry runs") + r'''
from torch.utils.cpp_extension import load_inline

KBEVAL_DEVICES = ["cpu"]
cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor silu_cpu(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat, "silu_cpu: expected float32 on the CPU");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t i = 0, n = xc.numel(); i < n; ++i) out[i] = in[i] / (1.f + std::exp(-in[i]));
    return y;
}
"""
ext = load_inline(name="kbeval_bench_silu_cpu", cpp_sources=cpp_source, functions=["silu_cpu"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.silu_cpu(x)
'''


def py_candidate(pid: str) -> str:
    _, doc, body = PY_CANDIDATES[pid]
    init = ("    def __init__(self, features):\n        super().__init__()\n"
            "        self.fc = nn.Linear(features, features)\n\n") if pid.startswith("linear") else ""
    return CANDIDATE_HEAD.format(doc=doc) + "\n\nclass ModelNew(nn.Module):\n" + init + \
        "    def forward(self, x):\n" + body


def write_small(tree: Path, device: str, dry: bool) -> int:
    """The small problems and their candidates (two copies each); returns the number of distinct candidates."""
    count = 0
    for pid, (doc, sizes, template) in SMALL.items():
        sizes = DRY_SIZES[pid] if dry else sizes
        text = template.format(doc=doc, sizes="\n".join(f"{k} = {v}" for k, v in sizes.items()))
        (tree / "problems" / f"{pid}.py").write_text(text)
        cands = {PY_CANDIDATES[pid][0]: py_candidate(pid)}
        if pid.startswith("silu"):
            cands["cuda_silu" if device == "cuda" else "cpp_silu"] = CUDA_SILU if device == "cuda" else CPP_SILU
        for name, source in cands.items():
            write_copies(tree / "candidates" / pid, name, source)
            count += 1
    return count


def write_copies(folder: Path, stem: str, source: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for copy in COPIES:
        (folder / f"{stem}__{copy}.py").write_text(source)


def expected_ok(seeds_md: Path) -> set[tuple[str, str]]:
    """(problem number, candidate file) of every candidate SEEDS.md expects to be `ok`."""
    found = set()
    for line in seeds_md.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        named = re.fullmatch(r"`([\w.]+\.py)`", cells[1]) if len(cells) > 2 else None
        if named and any(c == "ok" or c.startswith("ok (") for c in cells[2:]):
            found.add((cells[0], named.group(1)))
    return found


def runs_on(source: str, device: str) -> bool:
    """The harness's own static rule (README, Contracts): declared devices, else CUDA code means CUDA only."""
    declared = re.search(r"^KBEVAL_DEVICES\s*=\s*\[([^\]]*)\]", source, re.MULTILINE)
    if declared:
        return device in re.findall(r"['\"](\w+)['\"]", declared.group(1))
    needs_cuda = bool(re.search(r"cuda_sources|__global__|import triton|triton\.jit", source))
    return device == "cuda" or not needs_cuda


def write_seeds(tree: Path, device: str, only: list[str], limit: int | None, every: bool) -> int:
    """Seed candidates expected `ok` that run on `device` (round robin over problems up to `limit`), twice each."""
    ok = expected_ok(REPO / "candidates" / "SEEDS.md")
    per_problem: dict[str, list[Path]] = {}
    for folder in sorted(p for p in (REPO / "candidates").iterdir() if p.is_dir()):
        if only and folder.name not in only:
            continue
        picks = [c for c in sorted(folder.glob("*.py"))
                 if (every or (folder.name.split("_")[0], c.name) in ok) and runs_on(c.read_text(), device)]
        if picks:
            per_problem[folder.name] = picks
    order = [lst[i] for i in range(max(map(len, per_problem.values()), default=0))
             for lst in per_problem.values() if i < len(lst)]
    chosen = order[:limit] if limit is not None else order
    for cand in chosen:
        problem = next((REPO / "problems").rglob(f"{cand.parent.name}.py"))
        shutil.copyfile(problem, tree / "problems" / problem.name)
        write_copies(tree / "candidates" / cand.parent.name, cand.stem, cand.read_text())
    return len(chosen)


def pair_rows(verdicts: list[dict]) -> list[dict]:
    """One row per candidate: both copies' numbers, their relative difference and mutual interval containment."""
    pairs: dict[tuple[str, str], dict[str, dict]] = {}
    for v in verdicts:
        stem, _, copy = v["candidate"].rpartition("__")
        if copy in COPIES:
            pairs.setdefault((v["problem"], stem), {})[copy] = v
    rows = []
    for (problem, stem), got in sorted(pairs.items()):
        a, b = got.get("a"), got.get("b")
        row: dict = {"problem": problem, "candidate": stem,
                     "status": [x["status"] if x else "missing" for x in (a, b)],
                     "error": [x.get("error") if x else None for x in (a, b)]}
        timed = a and b and a.get("speedup_vs_eager") and b.get("speedup_vs_eager") and \
            a.get("speedup_vs_eager_ci") and b.get("speedup_vs_eager_ci")
        if timed:
            sa, sb = a["speedup_vs_eager"], b["speedup_vs_eager"]
            ca, cb = a["speedup_vs_eager_ci"], b["speedup_vs_eager_ci"]
            kernel_ms = statistics.fmean([a["runtime_ms"], b["runtime_ms"]])
            target = TARGETS[kernel_ms >= LONG_MS]
            ra, rb = (rerun(x) or c for x, c in ((a, ca), (b, cb)))
            row.update(runtime_ms=[a["runtime_ms"], b["runtime_ms"]], ref_ms=[a["ref_runtime_ms"], b["ref_runtime_ms"]],
                       speedup=[sa, sb], ci=[ca, cb], rerun=[ra, rb], kernel_ms=kernel_ms,
                       rel_diff=max(sa, sb) / min(sa, sb) - 1,
                       a_in_b=cb[0] <= sa <= cb[1], b_in_a=ca[0] <= sb <= ca[1],
                       a_in_b_rerun=rb[0] <= sa <= rb[1], b_in_a_rerun=ra[0] <= sb <= ra[1], target=target,
                       attempts=[(x.get("timing") or {}).get("attempts") for x in (a, b)])
            row["met"] = row["rel_diff"] <= target and row["a_in_b_rerun"] and row["b_in_a_rerun"]
        rows.append(row)
    return rows


def rerun(verdict: dict) -> tuple[float, float] | None:
    """The verdict's rerun interval (where another session of the same source lands, 95 %), if it has one."""
    interval = (verdict.get("timing") or {}).get("speedup_rerun_interval")
    return tuple(interval) if interval else None


def table(rows: list[dict]) -> list[str]:
    out = ["| problem | candidate | statuses | candidate ms (a / b) | speedup a [95 % interval] {rerun} | "
           "speedup b [95 % interval] {rerun} | difference | in each other's interval | in each other's rerun "
           "interval | target | met |",
           "|---|---|---|---:|---|---|---:|:-:|:-:|---:|:-:|"]
    for r in rows:
        statuses = " / ".join(r["status"])
        if "speedup" not in r:
            out.append(f"| {r['problem']} | {r['candidate']} | {statuses} | - | - | - | - | - | - | - | - |")
            continue
        ms = " / ".join(f"{x:.4g}" for x in r["runtime_ms"])
        s = [f"{x:.3f} [{c[0]:.3f}, {c[1]:.3f}] {{{q[0]:.3f}, {q[1]:.3f}}}"
             for x, c, q in zip(r["speedup"], r["ci"], r["rerun"], strict=True)]

        def both(a_in_b: bool, b_in_a: bool) -> str:
            missed = [name for name, inside in (("a", a_in_b), ("b", b_in_a)) if not inside]
            return f"**{' and '.join(missed)} outside**" if missed else "yes"

        out.append(f"| {r['problem']} | {r['candidate']} | {statuses} | {ms} | {s[0]} | {s[1]} | "
                   f"{r['rel_diff']:.1%} | {both(r['a_in_b'], r['b_in_a'])} | "
                   f"{both(r['a_in_b_rerun'], r['b_in_a_rerun'])} | {r['target']:.0%} | "
                   f"{'yes' if r['met'] else '**no**'} |")
    return out


def verdict_lines(rows: list[dict]) -> list[str]:
    """Pass or miss against each target, with the worst case named."""
    timed = [r for r in rows if "speedup" in r]
    out = []
    us = f"{LONG_MS * 1000:.0f} us"
    for long_kernel, what in ((True, f"kernels >= {us}"), (False, f"kernels < {us}")):
        group = [r for r in timed if (r["kernel_ms"] >= LONG_MS) == long_kernel]
        if not group:
            out.append(f"- {what}: no timed pair.")
            continue
        within = [r for r in group if r["rel_diff"] <= TARGETS[long_kernel]]
        worst = max(group, key=lambda r: r["rel_diff"])
        out.append(f"- {'PASS' if len(within) == len(group) else 'MISS'}: {what}, speedups within "
                   f"{TARGETS[long_kernel]:.0%} of each other: {len(within)} of {len(group)} pairs (worst "
                   f"{worst['problem']}/{worst['candidate']}, {worst['rel_diff']:.1%}).")
    mutual = [r for r in timed if r["a_in_b_rerun"] and r["b_in_a_rerun"]]
    out.append(f"- {'PASS' if timed and len(mutual) == len(timed) else 'MISS'}: each speedup inside the other copy's "
               f"95 % rerun interval: {len(mutual)} of {len(timed)} pairs.")
    inside = [r for r in timed if r["a_in_b"] and r["b_in_a"]]
    one_way = sum(r["a_in_b"] + r["b_in_a"] for r in timed)
    out.append(f"- For comparison, inside the other's 95 % confidence interval (83 % each way if those are honest): "
               f"{len(inside)} of {len(timed)} pairs, {one_way} of {2 * len(timed)} one-way.")
    untimed = [r for r in rows if "speedup" not in r]
    if untimed:
        out.append("- Not timed (no pair to compare): " + ", ".join(
            f"{r['problem']}/{r['candidate']} ({' / '.join(r['status'])})" for r in untimed) + ".")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes and smoke timing (for the CPU)")
    parser.add_argument("--jobs", type=int, help="parallel compiles (default: kbeval's, the CPU count)")
    parser.add_argument("--problem", action="append", default=[], help="only these seed problems (repeatable)")
    parser.add_argument("--limit", type=int, help="at most this many seed candidates (default: all; dry run: 1)")
    parser.add_argument("--all-seeds", action="store_true", help="every seed candidate for the device, not only "
                                                                 "those SEEDS.md expects to be ok")
    parser.add_argument("--no-seeds", action="store_true", help="only the small kernels")
    parser.add_argument("--no-small", action="store_true", help="only the seed corpus")
    parser.add_argument("--timing-budget", help="kbeval's --timing-budget (default: kbeval's)")
    parser.add_argument("--deadline", type=float, default=320, help="seconds before the run is stopped (default 320)")
    parser.add_argument("--out-md", type=Path, help="Markdown file to (re)write the section in "
                                                    "(default: docs/benchmarks.md; a dry run: none)")
    parser.add_argument("--section", help="section title (default: by device)")
    parser.add_argument("--workdir", type=Path, help="keep problems, candidates and results here")
    args = parser.parse_args()
    tree = args.workdir or Path(tempfile.mkdtemp(prefix="kbeval-identical-"))
    for sub in ("problems", "candidates"):
        shutil.rmtree(tree / sub, ignore_errors=True)
        (tree / sub).mkdir(parents=True)
    limit = args.limit if args.limit is not None else (1 if args.dry_run else None)
    seeds = 0 if args.no_seeds else write_seeds(tree, args.device, args.problem, limit, args.all_seeds)
    small = 0 if args.no_small else write_small(tree, args.device, args.dry_run)
    if not seeds + small:
        raise SystemExit("identical.py: nothing to judge (check --problem, --no-seeds, --no-small)")
    run_args = ["run", "--device", args.device, "--problems", str(tree / "problems"), "--candidates",
                str(tree / "candidates"), "--out", str(tree / "results"), "--run-id", "identical",
                "--no-compile-baseline"]
    run_args += ["--jobs", str(args.jobs)] if args.jobs else []
    run_args += ["--timing-budget", args.timing_budget] if args.timing_budget else []
    run_args += ["--smoke"] if args.dry_run else []
    shutil.rmtree(tree / "results" / "identical", ignore_errors=True)
    out = out_dir()
    log = (out or tree) / "identical.log"
    print(f"identical.py: {seeds} seed and {small} small candidates, each twice, in {tree}", flush=True)
    rc, wall = run_bounded(run_args, kbeval_env(), log, args.deadline)
    path = tree / "results" / "identical" / "verdicts.jsonl"
    verdicts = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    print(tail(log, 4000), flush=True)
    rows = pair_rows(verdicts)
    stopped = f" stopped at the {args.deadline:.0f} s deadline" if rc is None else (f" exit {rc}" if rc else "")
    command = "python3 bench/identical.py" + (f" --device {args.device}" if args.device != "cuda" else "") + (
        " --dry-run" if args.dry_run else "") + (f" --limit {args.limit}" if args.limit is not None else "") + "".join(
        f" --problem {p}" for p in args.problem) + (f" --timing-budget {args.timing_budget}" if args.timing_budget
                                                     else "")
    title = args.section or (SECTION_CUDA if args.device == "cuda" else SECTION_CPU)
    text = "\n".join([
        title, "",
        machine_line(args.device), "",
        f"`{command}`: one `kbeval run --device {args.device} --no-compile-baseline"
        + (" --smoke" if args.dry_run else "") + "` over "
        f"{seeds} seed-corpus candidates (those `candidates/SEEDS.md` expects to be `ok` here) and {small} small "
        "kernels written by the bench, every candidate present twice with the same bytes (one build, two "
        f"verdicts, each in its own process); {len(verdicts)} verdicts in {wall:.0f} s{stopped}. *Difference*: "
        "larger speedup over smaller, minus 1. [95 % confidence interval], {95 % rerun interval: where another "
        "session's speedup lands}. *In each other's (rerun) interval*: each copy's speedup inside the other "
        f"copy's. Target (issue 13): within 5 % for candidates of {LONG_MS * 1000:.0f} µs and more, 10 % below "
        "(the ~20 µs kernels), and each inside the other's rerun interval.", "",
        *table(rows), "", *verdict_lines(rows), ""])
    print(text, flush=True)
    md = args.out_md or (None if args.dry_run else REPO / "docs" / "benchmarks.md")
    if md:
        write_section(md, title, text)
    if out:
        (out / "identical.md").write_text(text)
        raw = {"command": command, "rc": rc, "wall_s": wall, "seeds": seeds, "small": small, "pairs": rows,
               "verdicts": [{k: v.get(k) for k in ("problem", "candidate", "status", "error", "runtime_ms",
                                                   "ref_runtime_ms", "speedup_vs_eager", "speedup_vs_eager_ci",
                                                   "runtime_stats", "ref_runtime_stats", "timing", "lane",
                                                   "device_name", "wall_seconds", "compile_seconds")}
                            for v in verdicts]}
        (out / "identical.json").write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
