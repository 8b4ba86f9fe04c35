"""nvcc with its host and device passes side by side where cores are idle: one `.cu` build in 0.7 of nvcc's time.

Why: nvcc runs its steps one after another, and for a `load_inline` source two of them parse all of torch's
headers: `cudafe++` (the host side) and `cicc` (the device side), each about a third of the unit's time, on
one core. The only thing `cicc` takes from `cudafe++` is the module id, a name unique to the translation unit
that both write into their symbols; nvcc lets `cudafe++` make it. Given one made here, in the same form
(`_<hash>_<n>_<file name>_<hash>`, from the source's path, bytes and flags), both read it and neither waits.

How: `nvcc --dryrun` with the same arguments lists the steps (and the variables they expect); they run here,
each once the steps whose intermediate files it names are done, and the last one (the host compile, which
includes the device binary) after all of them. A step starts beside another only while a core is idle
(`_Side`): with every core taken, two passes at once are slower than one after the other. Their output is
shown in nvcc's order, and a failure reports as nvcc would (the first failed step in that order, its exit
status); steps after it are stopped. Anything other than that plain shape (another tool, a step that is not a
command, intermediates outside its private temporary folder) goes to nvcc unchanged, so this never builds
differently, only sooner. Used through torch's `PYTORCH_NVCC` (`env`), so a build's command and files are
otherwise as torch writes them. Run as a script (`python -I nvcc.py [--side auto|always|never] <nvcc>
<args...>`): it imports nothing of the harness.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
KNOWN_TOOLS = frozenset({"cudafe++", "cicc", "ptxas", "fatbinary", "rm"})
MODULE_ID_GEN = "--gen_module_id_file"
MODE_VAR = "KBEVAL_NVCC"  # auto (default), always, never (steps through here, side by side or not), off (nvcc)
POLL_S = 0.25


@dataclass
class Step:
    words: list[str]
    tool: str
    files: set[str] = field(default_factory=set)  # intermediates (in the private folder) it reads or writes
    after: set[int] = field(default_factory=set)  # steps that must be done first


@dataclass
class Plan:
    env: dict[str, str]
    steps: list[Step]
    module_id_file: str
    module_id: str


@functools.cache
def env() -> dict[str, str]:
    """A build worker's variables that send torch's nvcc commands here; {} where torch finds no nvcc, or it is off.

    `TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES`: a build is made once for its content, so the header list
    nvcc would write for ninja (one more preprocessing pass, and a step this driver does not run) is never read.
    Both variables change the `build.ninja` torch writes, so a build is named by them (`tag`).
    """
    mode = os.environ.get(MODE_VAR, "auto").strip().lower()
    if mode not in ("auto", "always", "never"):
        return {}
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = Path(CUDA_HOME or "/nonexistent") / "bin" / "nvcc"
    if not nvcc.is_file():
        return {}
    driver = " ".join(shlex.quote(p) for p in (sys.executable, "-I", str(Path(__file__).resolve()), "--side", mode,
                                                str(nvcc)))
    return {"PYTORCH_NVCC": driver, "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "1"}


def tag() -> str:
    """A build folder's suffix for `env`'s setting ("" without it), so that no build is loaded under another."""
    chosen = env()
    if not chosen:
        return ""
    return "-n" + hashlib.sha256(repr(sorted(chosen.items())).encode()).hexdigest()[:8]


def plan(dryrun: str, private: str) -> Plan | None:
    """The steps of `nvcc --dryrun`'s listing and their order, or None for any shape other than the plain one."""
    variables: dict[str, str] = {}
    steps: list[Step] = []
    for line in dryrun.splitlines():
        if not line.startswith("#$ "):
            continue
        text = line[3:].strip()
        assigned = ASSIGNMENT.match(text)
        if assigned and not steps:
            variables[assigned[1]] = assigned[2].strip()
            continue
        try:
            words = shlex.split(text)
        except ValueError:
            return None
        if not words or assigned or any("$" in w for w in words[1:]):
            return None  # not a command, or one whose arguments a shell would expand: nvcc runs it
        words[0] = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: variables.get(m[1], os.environ.get(m[1], "")),
                          words[0])
        steps.append(Step(words, os.path.basename(words[0]), _intermediates(words, private)))
    return _ordered(variables, steps, private)


def _intermediates(words: list[str], private: str) -> set[str]:
    found: set[str] = set()
    for word in words:
        found.update(re.findall(re.escape(private) + r"/[^\s,=\"']+", word))
    return found


def _ordered(variables: dict[str, str], steps: list[Step], private: str) -> Plan | None:
    if len(steps) < 3:
        return None
    host, last = steps[0].tool, steps[-1]
    cudafe = [s for s in steps if s.tool == "cudafe++"]
    cicc = [s for s in steps if s.tool == "cicc"]
    if (any(s.tool not in KNOWN_TOOLS | {host} for s in steps) or last.tool != host or "-c" not in last.words
            or len(cudafe) != 1 or not cicc):
        return None
    ids = {_option(s.words, "--module_id_file_name") for s in cudafe + cicc}
    id_file = ids.pop() if len(ids) == 1 else None
    if (id_file is None or not id_file.startswith(private + "/") or MODULE_ID_GEN not in cudafe[0].words
            or any(MODULE_ID_GEN in s.words for s in cicc)):
        return None
    source = _option(cudafe[0].words, "--orig_src_path_name")
    name = _option(cudafe[0].words, "--orig_src_file_name")
    try:
        content = Path(source or "").read_bytes()
    except OSError:
        return None
    cudafe[0].words.remove(MODULE_ID_GEN)  # it reads the id made here, as cicc does
    kept: list[Step] = []
    for step in steps:
        if step.tool == "rm":  # nvcc's own cleanup of its intermediates: the whole private folder goes at the end
            if not all(w.startswith(private + "/") for w in step.words[1:]):
                return None
            continue
        step.files.discard(id_file)
        if not step.files and step is not last:
            return None  # its intermediates are somewhere else (--keep-dir and the like): nvcc decides
        kept.append(step)
    for j, step in enumerate(kept):
        step.after = set(range(j)) if step is last else {i for i in range(j) if kept[i].files & step.files}
    words = (w.replace(private, "") for s in kept for w in s.words)  # the private folder's name is random
    digest = hashlib.sha256("\0".join([str(source), *words]).encode() + content)
    mangled = re.sub(r"[^A-Za-z0-9_]", "_", name or "")
    module_id = f"_{digest.hexdigest()[:8]}_{len(mangled)}_{mangled}_{digest.hexdigest()[8:16]}"
    return Plan(variables, kept, id_file, module_id)


def _option(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words[:-1] else None


class _Side:
    """Whether a ready step may start beside one already running: `always`, `never`, or `auto`: while a core is
    idle (two readings in a row, POLL_S apart). Why auto: where every core is taken (many builds at once) two
    passes side by side only share the cores, less well than one after another (docs/benchmarks.md, "vs
    KernelBench, 64 distinct candidates"); where cores are idle (one build, the last builds of a run) they halve."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._idle_at: float | None = None  # when the last reading found a core idle

    def allows(self) -> bool:
        if self.mode != "auto":
            return self.mode == "always"
        now, before = time.monotonic(), self._idle_at
        self._idle_at = now if idle_cores() >= 1 else None
        return self._idle_at is not None and before is not None and now - before <= 2 * POLL_S


def idle_cores() -> int:
    """This process's cores less the threads that want one now (/proc/loadavg's fourth field counts them, this
    process among them); 0 where that cannot be read."""
    try:
        wanting = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return 0
    return len(os.sched_getaffinity(0)) - (wanting - 1)


def run(plan: Plan, environ: dict[str, str], side: _Side) -> int:
    """Run the steps as their order (and `side`) allows; pass their output on in nvcc's order; nvcc's status."""
    folder = Path(plan.module_id_file).parent
    Path(plan.module_id_file).write_text(plan.module_id)
    env = environ | plan.env
    running: dict[int, tuple[int, subprocess.Popen[bytes]]] = {}  # pid -> (step, process)
    status: dict[int, int] = {}
    failed = len(plan.steps)  # the first failed step in nvcc's order; none after it is started or kept
    shown = 0
    while shown <= min(failed, len(plan.steps) - 1):
        busy = {i for i, _ in running.values()}
        ready = [i for i, step in enumerate(plan.steps[:failed + 1])
                 if i not in status and i not in busy and all(status.get(d) == 0 for d in step.after)]
        while ready and (not running or side.allows()):
            i = ready.pop(0)
            with open(folder / f"{i}.out", "wb") as out, open(folder / f"{i}.err", "wb") as err:
                proc = subprocess.Popen(plan.steps[i].words, env=env, stdout=out, stderr=err)
            running[proc.pid] = (i, proc)
        if not running:  # cannot happen (every step's order is on earlier ones): say so rather than pass
            sys.stderr.write("kbeval nvcc: no step can start\n")
            return 1
        pid, wait_status = os.waitpid(-1, os.WNOHANG if ready else 0)  # a step held back: look again soon
        if pid == 0:
            time.sleep(POLL_S)
            continue
        if pid not in running:
            continue
        i, proc = running.pop(pid)
        proc.returncode = status[i] = os.waitstatus_to_exitcode(wait_status)
        if status[i] != 0 and i < failed:
            failed = i
            for j, later in running.values():
                if j > i:
                    later.kill()
        while shown in status and shown <= failed:
            sys.stdout.buffer.write((folder / f"{shown}.out").read_bytes())
            sys.stdout.flush()
            sys.stderr.buffer.write((folder / f"{shown}.err").read_bytes())
            sys.stderr.flush()
            shown += 1
    for _, proc in running.values():
        proc.wait()
    if failed < len(plan.steps):
        return status[failed] if status[failed] > 0 else 1
    return 0


def main(argv: list[str]) -> int:
    """`[--side auto|always|never] <nvcc> <nvcc's arguments>`."""
    mode, rest = (argv[1], argv[2:]) if argv[:1] == ["--side"] else ("auto", argv)
    nvcc, args, side = rest[0], rest[1:], _Side(mode)
    private = tempfile.mkdtemp(prefix="kbeval-nvcc-")
    try:
        environ = dict(os.environ) | {"TMPDIR": private}
        dry = subprocess.run([nvcc, "--dryrun", *args], env=environ, capture_output=True, text=True)
        steps = plan(dry.stderr, private) if dry.returncode == 0 else None
        if steps is not None:
            return run(steps, environ, side)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    os.execv(nvcc, [nvcc, *args])  # not the plain shape: nvcc itself


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
