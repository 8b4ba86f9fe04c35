"""The nvcc driver (`building/nvcc.py`): host and device passes side by side, nvcc's order for output and failure,
nvcc itself for any other shape. A stand-in nvcc and stand-in tools (no CUDA here) that would deadlock, fail or
build wrongly if the steps ran one after another, ran out of order, or lost the module id."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelbench_eval.building import compile as build_compile
from kernelbench_eval.building import nvcc

DRIVER = Path(nvcc.__file__)

FAKE_NVCC = textwrap.dedent("""\
    import os, sys
    args = sys.argv[1:]
    here = os.path.dirname(os.path.abspath(__file__))
    out = args[args.index("-o") + 1]
    src = os.path.abspath(next(a for a in args if a.endswith(".cu")))
    if "--dryrun" not in args:
        open(out, "w").write("plain nvcc")
        sys.exit(0)
    tmp = os.environ["TMPDIR"]
    p = lambda name: f"{tmp}/tmpxft_1_{name}"
    shape = os.environ.get("FAKE_SHAPE", "plain")
    lines = [f"TOOLS={here}", f"PATH={here}:{os.environ['PATH']}", "_SPACE_= "]
    lines += [f'gcc -E "{src}" -o "{p("cpp4.ii")}"',
              f'cudafe++ --orig_src_file_name "src.cu" --orig_src_path_name "{src}"'
              f' --gen_c_file_name "{p("cudafe1.cpp")}" --gen_module_id_file'
              f' --module_id_file_name "{p("module_id")}" "{p("cpp4.ii")}"',
              f'gcc -E "{src}" -o "{p("cpp1.ii")}"']
    if shape == "filter":
        lines.append("-- Filter Dependencies -- > x.d")
    lines += [f'"$TOOLS/cicc" --module_id_file_name "{p("module_id")}" "{p("cpp1.ii")}" -o "{p("ptx")}"',
              f'ptxas "{p("ptx")}" -o "{p("cubin")}"',
              f'fatbinary "--image3=kind=elf,sm=90,file={p("cubin")}" --embedded-fatbin="{p("fatbin.c")}"',
              f'rm {p("fatbin")}']
    if shape == "nvlink":
        lines.append(f'nvlink "{p("cubin")}" -o "{p("linked")}"')
    lines.append(f'gcc -c -x c++ "{p("cudafe1.cpp")}" -o "{out}"')
    sys.stderr.write("".join(f"#$ {line}\\n" for line in lines))
""")

# One script for every tool, by the name it is called under. cudafe++ waits for cicc to have started (so run one
# after another they deadlock); each reads the module id nobody may have generated but the driver.
FAKE_TOOL = textwrap.dedent("""\
    import os, sys, time
    tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
    tmp = os.environ["TMPDIR"]
    log = open(os.environ["FAKE_LOG"], "a")
    log.write(f"start {tool}\\n"); log.flush()
    import atexit; atexit.register(lambda: log.write(f"end {tool}\\n"))
    def opt(flag): return args[args.index(flag) + 1]
    def module_id():
        if "--gen_module_id_file" in args:
            return "generated-by-the-tool"
        return open(opt("--module_id_file_name")).read()
    if tool == "gcc" and "-E" in args:
        open(opt("-o"), "w").write(open(args[1]).read())
    elif tool == "cudafe++" and os.environ.get("FAKE_ALONE"):
        open(opt("--gen_c_file_name"), "w").write(f"host:{module_id()}\\n")
    elif tool == "cudafe++":
        for _ in range(600):
            if os.path.exists(f"{tmp}/cicc-started"):
                break
            time.sleep(0.1)
        else:
            sys.exit("cudafe++: cicc never ran beside it")
        if os.environ.get("FAKE_FAIL") == "cudafe++":
            sys.stderr.write("src.cu(1): error: host side broken\\n")
            sys.exit(2)
        print("cudafe++ says hello")
        open(opt("--gen_c_file_name"), "w").write(f"host:{module_id()}\\n")
    elif tool == "cicc":
        open(f"{tmp}/cicc-started", "w").close()
        if os.environ.get("FAKE_FAIL") == "cudafe++":
            time.sleep(3600)  # the driver must stop it once cudafe++ has failed
        open(opt("-o"), "w").write(f"device:{module_id()}\\n")
    elif tool == "ptxas":
        open(opt("-o"), "w").write(open(args[0]).read())
    elif tool == "fatbinary":
        cubin = args[0].split("file=")[1]
        open(args[1].split("=", 1)[1], "w").write(open(cubin).read())
    elif tool == "gcc" and "-c" in args:
        host = args[3]
        fatbin = os.path.join(os.path.dirname(host), "tmpxft_1_fatbin.c")  # included by the host code, unnamed
        open(opt("-o"), "w").write(open(host).read() + open(fatbin).read())
    else:
        sys.exit(f"unexpected {tool} {args}")
""")


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    """A folder with the stand-in nvcc and its tools, and a source `src.cu` beside it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in [("nvcc", FAKE_NVCC), ("tool.py", FAKE_TOOL)]:
        (bin_dir / name).write_text(f"#!{sys.executable}\n{body}")
        (bin_dir / name).chmod(0o755)
    for tool in ("gcc", "cudafe++", "cicc", "ptxas", "fatbinary"):
        (bin_dir / tool).symlink_to(bin_dir / "tool.py")
    (tmp_path / "src.cu").write_text("__global__ void k() {}\n")
    return tmp_path


def drive(fake: Path, side: str = "always", **env: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-I", str(DRIVER), "--side", side, str(fake / "bin" / "nvcc"), "-c", "src.cu", "-o",
               "src.o"]
    (fake / "private").mkdir(exist_ok=True)
    environ = os.environ | {"TMPDIR": str(fake / "private"), "FAKE_LOG": str(fake / "order.log")} | env
    return subprocess.run(command, cwd=fake, env=environ, capture_output=True, text=True, timeout=120)


def test_host_and_device_passes_run_side_by_side_with_one_module_id(fake: Path) -> None:
    done = drive(fake)
    assert done.returncode == 0, done.stderr
    host, device = (fake / "src.o").read_text().splitlines()
    module_id = host.removeprefix("host:")
    assert device == f"device:{module_id}"  # both passes named the unit alike
    assert re.fullmatch(r"_[0-9a-f]{8}_6_src_cu_[0-9a-f]{8}", module_id)  # nvcc's form for "src.cu"
    assert "cudafe++ says hello" in done.stdout  # a step's output is passed on
    assert not list((fake / "private").glob("kbeval-nvcc-*"))  # its private folder is gone


def test_with_no_core_to_spare_the_steps_run_in_nvccs_order(fake: Path) -> None:
    done = drive(fake, side="never", FAKE_ALONE="1")
    assert done.returncode == 0, done.stderr
    tools = ["gcc", "cudafe++", "gcc", "cicc", "ptxas", "fatbinary", "gcc"]
    assert (fake / "order.log").read_text().split("\n")[:-1] == [f"{e} {t}" for t in tools for e in ("start", "end")]
    host, device = (fake / "src.o").read_text().splitlines()
    assert device.removeprefix("device:") == host.removeprefix("host:")


def test_auto_starts_a_second_step_only_while_a_core_is_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([3, 0, 2, 2, 1])
    monkeypatch.setattr(nvcc, "idle_cores", lambda: next(readings))
    side = nvcc._Side("auto")
    assert [side.allows() for _ in range(5)] == [False, False, False, True, True]  # two idle readings in a row
    clock = iter([100.0, 100.0 + 10 * nvcc.POLL_S, 100.0 + 11 * nvcc.POLL_S])
    monkeypatch.setattr(nvcc.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(nvcc, "idle_cores", lambda: 2)
    side = nvcc._Side("auto")
    assert [side.allows() for _ in range(3)] == [False, False, True]  # a reading from long ago does not count
    assert nvcc._Side("always").allows() and not nvcc._Side("never").allows()


def test_a_failed_step_reports_as_nvcc_and_stops_the_later_ones(fake: Path) -> None:
    done = drive(fake, FAKE_FAIL="cudafe++")  # cicc sleeps for an hour unless stopped
    assert done.returncode == 2
    assert "host side broken" in done.stderr
    assert not (fake / "src.o").exists()


@pytest.mark.parametrize("shape", ["filter", "nvlink"])
def test_any_other_shape_is_left_to_nvcc(fake: Path, shape: str) -> None:
    done = drive(fake, FAKE_SHAPE=shape)
    assert done.returncode == 0, done.stderr
    assert (fake / "src.o").read_text() == "plain nvcc"


def test_plan_orders_steps_by_the_intermediates_they_share(fake: Path) -> None:
    private = str(fake / "private")
    listing = subprocess.run([str(fake / "bin" / "nvcc"), "--dryrun", "-c", "src.cu", "-o", "src.o"], cwd=fake,
                             env=os.environ | {"TMPDIR": private}, capture_output=True, text=True, check=True).stderr
    plan = nvcc.plan(listing, private)
    assert plan is not None
    tools = [s.tool for s in plan.steps]
    assert tools == ["gcc", "cudafe++", "gcc", "cicc", "ptxas", "fatbinary", "gcc"]  # nvcc's rm dropped
    after = [s.after for s in plan.steps]
    assert after[:6] == [set(), {0}, set(), {2}, {3}, {4}]  # two chains: host 0-1, device 2-5
    assert after[6] == set(range(6))  # the host compile includes the device binary: after everything
    assert "--gen_module_id_file" not in plan.steps[1].words
    assert plan.steps[3].words[0] == str(fake / "bin" / "cicc")  # "$TOOLS/cicc" from nvcc's own variables
    keep_elsewhere = listing.replace(private, str(fake / "kept"))
    assert nvcc.plan(keep_elsewhere, private) is None  # intermediates outside its folder: nvcc runs them


def test_builds_are_named_by_the_nvcc_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The setting changes the `build.ninja` torch writes, so a build made without it is never loaded with it."""
    from kernelbench_eval.discover.corpus import Candidate

    candidate = Candidate(problem_id="p", candidate_id="c", path=tmp_path / "c.py", source_sha256="ab" * 32)
    monkeypatch.setattr(nvcc, "env", lambda: {})
    plain = build_compile.build_dir(tmp_path, candidate, "cuda")
    assert "PYTORCH_NVCC" not in build_compile.extension_env(plain)
    monkeypatch.setattr(nvcc, "env", lambda: {"PYTORCH_NVCC": "python3 -I nvcc.py /cuda/bin/nvcc",
                                              "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "1"})
    driven = build_compile.build_dir(tmp_path, candidate, "cuda")
    assert driven != plain and driven.name.startswith(plain.name + "-n")
    assert build_compile.extension_env(driven)["PYTORCH_NVCC"].endswith("/cuda/bin/nvcc")


CUDA_NVCC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
REAL_NVCC = str(CUDA_NVCC) if CUDA_NVCC.is_file() else shutil.which("nvcc")
UNIT = """
namespace { __device__ int twice(int x) { return 2 * x; } }  // internal: its name carries the module id
__global__ void double_it(int* p) { p[threadIdx.x] = twice(p[threadIdx.x]); }
void launch(int* p) { double_it<<<1, 32>>>(p); }
"""


@pytest.mark.skipif(REAL_NVCC is None, reason="needs nvcc")
def test_real_nvcc_unit_builds_alike_through_the_driver(tmp_path: Path) -> None:
    """Against the real toolchain: the driver's object has nvcc's symbols, but for the module id and temporary
    names, so the plain shape is what this nvcc lists, and the id made here is taken by both passes."""
    symbols = {}
    for way in ("nvcc", "driver"):
        folder = tmp_path / way
        folder.mkdir()
        (folder / "unit.cu").write_text(UNIT)
        prefix = [] if way == "nvcc" else [sys.executable, "-I", str(DRIVER), "--side", "always"]
        done = subprocess.run([*prefix, REAL_NVCC, "-gencode=arch=compute_90,code=sm_90", "-c", "unit.cu", "-o",
                               "unit.o"], cwd=folder, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        listing = subprocess.run(["nm", str(folder / "unit.o")], capture_output=True, text=True, check=True).stdout
        ids = set(re.findall(r"_[0-9a-f]{8}_7_unit_cu_[0-9a-f]{8}", listing))
        assert len(ids) == 1  # one module id, in the internal names and the registration alike
        listing = listing.replace(ids.pop(), "ID")
        symbols[way] = sorted(re.sub(r"tmpxft_[0-9a-f]+_[0-9a-f]+_\d+", "TMP", line) for line in listing.splitlines())
    assert symbols["driver"] == symbols["nvcc"]
    private = tmp_path / "private"
    private.mkdir()
    listing = subprocess.run([REAL_NVCC, "--dryrun", "-gencode=arch=compute_90,code=sm_90", "-c", "unit.cu", "-o",
                              "unit.o"], cwd=tmp_path / "driver", env=os.environ | {"TMPDIR": str(private)},
                             capture_output=True, text=True, check=True).stderr
    plan = nvcc.plan(listing, str(private))
    assert plan is not None  # this nvcc's listing has the plain shape: the driver ran it, not nvcc
    tools = [s.tool for s in plan.steps]
    cudafe, cicc = tools.index("cudafe++"), tools.index("cicc")
    assert cudafe not in plan.steps[cicc].after and cicc not in plan.steps[cudafe].after  # side by side


def test_the_setting_follows_kbeval_nvcc_and_needs_an_nvcc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch.utils.cpp_extension as cpp_extension

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    for mode, wanted in [("auto", True), ("never", True), ("off", False), ("bogus", False)]:
        monkeypatch.setenv("KBEVAL_NVCC", mode)
        nvcc.env.cache_clear()
        chosen = nvcc.env()
        assert bool(chosen) == wanted, mode
        if wanted:
            assert f"--side {mode} {tmp_path}/bin/nvcc" in chosen["PYTORCH_NVCC"]
            assert chosen["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] == "1"
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)  # torch finds no CUDA: nvcc's own command, as before
    monkeypatch.setenv("KBEVAL_NVCC", "auto")
    nvcc.env.cache_clear()
    assert nvcc.env() == {} and nvcc.tag() == ""
    nvcc.env.cache_clear()
