"""Fast checks of the pure pieces: comparison, record keeping, discovery, option parsing."""

from __future__ import annotations

import os
import time

import pytest
import torch

from kernelbench_eval.discover.corpus import declared_devices, discover, source_problem
from kernelbench_eval.measured import TimingStats
from kernelbench_eval.messages import TensorMeta
from kernelbench_eval.records import RunManifest, RunSettings, Verdict
from kernelbench_eval.results.formatting import runtime as format_runtime
from kernelbench_eval.results.record import RunRecorder
from kernelbench_eval.worker.check import compare_outputs


def meta(t) -> TensorMeta:
    return TensorMeta(type_name=type(t).__qualname__, exact_tensor=type(t) is torch.Tensor, device=str(t.device),
                      dtype=str(t.dtype), shape=list(t.shape))


def compare(expected: torch.Tensor, got, got_meta=None, atol=1e-2, rtol=1e-2):
    return compare_outputs([expected], [meta(expected)], [got], [got_meta or meta(got)], atol, rtol)


def test_equal_outputs_pass_with_zero_difference():
    x = torch.rand(4, 5)
    result = compare(x, x.clone())
    assert result.passed and result.max_abs_diff == 0.0


def test_difference_within_tolerance_passes_and_is_reported():
    x = torch.ones(10)
    result = compare(x, x + 0.015)  # 0.015 <= 0.01 + 0.01 * 1
    assert result.passed and result.max_abs_diff == pytest.approx(0.015, rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_differences_at_atol_pass_and_the_next_value_up_fails(dtype):
    """Where every difference is within atol the tolerance bound is not computed (it is never below atol): the
    boundary must be exactly the kernel's, in the output's dtype."""
    atol = torch.tensor(0.01, dtype=dtype)
    x = torch.zeros(1000, dtype=dtype)
    assert compare(x, x + atol, atol=0.01, rtol=0.5).passed
    y = x + atol
    y[7] = torch.nextafter(atol, torch.tensor(1.0, dtype=dtype))
    result = compare(x, y, atol=0.01, rtol=0.5)
    assert not result.passed and "1/1000 values outside" in result.error and "at (7,)" in result.error


def test_difference_outside_tolerance_names_the_worst_element():
    x = torch.zeros(3, 4)
    y = x.clone()
    y[2, 1] = 0.5
    result = compare(x, y)
    assert not result.passed
    assert "1/12 values outside" in result.error and "at (2, 1)" in result.error and "got 0.5" in result.error


def test_shape_that_only_broadcasts_fails():
    x = torch.rand(3, 4)
    result = compare(x, x.unsqueeze(0))
    assert not result.passed and "shape" in result.error


def test_dtype_must_match_exactly():
    x = torch.rand(3)
    result = compare(x, x.double())
    assert not result.passed and "dtype torch.float64, expected torch.float32" in result.error


def test_subclass_output_is_rejected():
    class Sneaky(torch.Tensor):
        pass

    x = torch.rand(3)
    sneaky = x.clone().as_subclass(Sneaky)
    result = compare(x, sneaky)
    assert not result.passed and "Sneaky" in result.error


def test_nan_where_reference_has_none_fails_even_with_huge_tolerance():
    x = torch.rand(5)
    y = x.clone()
    y[3] = float("nan")
    result = compare(x, y, atol=1e9, rtol=1e9)
    assert not result.passed and "NaN" in result.error and "(3,)" in result.error


def test_matching_nan_and_inf_are_fine_but_wrong_sign_inf_fails():
    x = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare(x, x.clone()).passed
    y = torch.tensor([1.0, float("nan"), float("-inf")])
    assert not compare(x, y).passed


def test_wrong_number_of_outputs_fails():
    x = torch.rand(2)
    result = compare_outputs([x], [meta(x)], [x, x], [meta(x), meta(x)], 1e-2, 1e-2)
    assert not result.passed and "returned 2 outputs, expected 1" in result.error


def test_format_runtime_matches_the_seeds():
    assert format_runtime(13.6123) == "13.6"
    assert format_runtime(4.4912) == "4.49"
    assert format_runtime(30.84) == "30.8"
    assert format_runtime(1234.5) == "1230"
    assert format_runtime(0.012345) == "0.0123"
    assert format_runtime(-1.0) == "-1.0"


def test_timing_stats_from_samples():
    stats = TimingStats.from_samples([4.0, 1.0, 3.0, 2.0, 100.0])
    assert stats.median_ms == 3.0 and stats.min_ms == 1.0 and stats.max_ms == 100.0 and stats.calls == 5
    assert stats.iqr_ms == pytest.approx(2.0)


def test_settings_key_changes_with_anything_that_changes_a_verdict():
    base = RunSettings(device="cpu")
    assert base.key() == RunSettings(device="cpu").key()
    assert base.key() != RunSettings(device="cpu", atol=1e-3).key()
    assert base.key() != RunSettings(device="cpu", dims={"batch_size": 2}).key()


def _verdict(name: str) -> Verdict:
    return Verdict(run_id="r", problem="p", candidate=name, source_sha256="0" * 64, settings_key="k",
                   device="cpu", torch_version="t", status="ok")


def test_recorder_drops_a_torn_last_line_and_keeps_the_rest(tmp_path):
    recorder = RunRecorder(tmp_path)
    recorder.append(_verdict("a"))
    recorder.append(_verdict("b"))
    with open(recorder.verdicts_path, "a") as handle:
        handle.write(_verdict("c").model_dump_json()[:30])  # the harness died mid-write
    assert [v.candidate for v in recorder.load()] == ["a", "b"]
    recorder.append(_verdict("c"))
    assert [v.candidate for v in recorder.load()] == ["a", "b", "c"]
    assert (tmp_path / "p" / "a.txt").read_text() == "Evaluation: False\nRuntime: -1.0\n"


def test_recorder_notices_and_undoes_changes_it_did_not_make(tmp_path):
    recorder = RunRecorder(tmp_path)
    recorder.append(_verdict("a"))
    assert not recorder.tampered()
    ours = recorder.verdicts_path.read_bytes()
    forged = _verdict("a").model_copy(update={"status": "ok", "correct": True}).model_dump_json()
    with open(recorder.verdicts_path, "a") as handle:  # what a candidate appending a fake verdict does
        handle.write(forged + "\n")
    assert recorder.tampered() and recorder.verdicts_path.read_bytes() == ours
    recorder.verdicts_path.write_bytes(ours.replace(b'"correct":false', b'"correct":true '))  # same size
    assert recorder.tampered() and recorder.verdicts_path.read_bytes() == ours
    (tmp_path / "p" / "a.txt").write_text("Evaluation: True\nRuntime: 0.001\n")
    manifest = RunManifest(run_id="r", settings=RunSettings(device="cpu"), problems_dir="p", candidates_dir="c",
                           torch_version="t", created_at="now")
    recorder.write_manifest(manifest)
    assert not recorder.finalize(manifest)
    assert (tmp_path / "p" / "a.txt").read_text() == "Evaluation: False\nRuntime: -1.0\n"


def test_recorder_refuses_a_corrupt_line_in_the_middle(tmp_path):
    recorder = RunRecorder(tmp_path)
    recorder.verdicts_path.write_text("not json\n" + _verdict("a").model_dump_json() + "\n")
    with pytest.raises(ValueError):
        recorder.load()


def test_source_problems_are_one_clear_line():
    assert "empty" in source_problem(b"  \n")
    assert "not UTF-8" in source_problem(b"x = '\xff\xfe'")
    assert "MiB limit" in source_problem(b"#" * (3 * 1024 * 1024))
    assert source_problem(b"import torch\n") is None


def test_declared_devices():
    assert declared_devices("KBEVAL_DEVICES = ['cpu']\n") == ("cpu",)
    assert declared_devices("load_inline(name='x', cpp_sources=a, cuda_sources=b)") == ("cuda",)
    assert declared_devices("import torch\n") is None


def test_discover_pairs_candidates_and_reports_problems(tmp_path):
    """In a KernelBench tree (two or more level folders at the top) ids are qualified by level; a stem seen twice
    outside them is still one problem, the second ignored with a warning."""
    for folder, text in (("level1", "# p1"), ("level2", "# another p1"), ("other", "# p1 once more"),
                         ("zz", "# a duplicate id")):
        (tmp_path / "problems" / folder).mkdir(parents=True)
        (tmp_path / "problems" / folder / "p1.py").write_text(text)
    (tmp_path / "candidates" / "level1" / "p1").mkdir(parents=True)
    (tmp_path / "candidates" / "level1" / "p1" / "a.py").write_text("class ModelNew: pass\n")
    (tmp_path / "candidates" / "level1" / "p1" / "bad.py").write_bytes(b"\xff\xfe")
    (tmp_path / "candidates" / "orphan").mkdir()
    found = discover(tmp_path / "problems", tmp_path / "candidates")
    assert list(found.problems) == ["level1/p1", "level2/p1", "p1"]
    assert found.problems["p1"].path.parent.name == "other"
    assert [c.candidate_id for c in found.candidates] == ["a", "bad"]
    assert found.candidates[0].invalid is None and "not UTF-8" in found.candidates[1].invalid
    assert any("already defined" in w for w in found.warnings)
    assert any("orphan" in w for w in found.warnings)


# -- one home per idea: options, statuses, numbers, GPUs, /proc ------------------------------------------


def _help(*args: str) -> str:
    from typer.testing import CliRunner

    from kernelbench_eval.cli.app import app

    result = CliRunner().invoke(app, [*args, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def test_run_and_eval_declare_every_shared_option_and_selftest_profile_their_share():
    import dataclasses

    from kernelbench_eval.cli.options import JudgeOptions

    flags = {f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(JudgeOptions)}
    run_help, eval_help = _help("run"), _help("eval")
    for flag in flags.values():
        assert flag in run_help and flag in eval_help, flag
    profile_help = _help("profile")
    assert all(flags[n] in profile_help for n in ("device", "precision", "dim", "threads", "timeout", "cache_dir"))
    assert "--atol" not in profile_help and "untimed calls before the profiled one" in profile_help
    selftest_help = _help("selftest")
    assert "also time torch.compile baselines" in selftest_help and "--precision" not in selftest_help


def test_help_texts_show_the_defaults_and_smoke_values_that_apply():
    import re

    from kernelbench_eval.run.plan import DEFAULTS, SMOKE

    text = " ".join(_help("run").split())
    for name in ("trials", "reps", "max_reps", "warmup", "warmup_seconds", "timing_budget"):
        flag = "--" + name.replace("_", "-")
        found = re.search(re.escape(flag) + r" <\w+> [^\[]*\[default: ([\d.]+); --smoke: ([\d.]+)\]", text)
        assert found, flag
        assert (float(found[1]), float(found[2])) == (DEFAULTS[name], SMOKE[name]), flag


def test_judge_options_make_the_settings_a_run_records():
    from kernelbench_eval.cli.options import JudgeOptions

    settings = JudgeOptions(device="cpu", threads=1, smoke=True, trials=3, precision="fp16").settings([], [])
    assert (settings.trials, settings.reps, settings.compile_baseline) == (3, 10, False)  # typed wins over smoke
    assert (settings.precision, settings.atol) == ("fp16", 1e-2)
    assert JudgeOptions(trials=3, smoke=True, dim=["n=2"]).typed_settings() == ["--trials", "--dim", "--smoke"]
    with pytest.raises(ValueError, match="--tolerance"):
        JudgeOptions(device="cpu", tolerance="loose").settings([], [])


def test_every_status_has_one_look_and_counts_are_by_name():
    from kernelbench_eval import statuses
    assert set(statuses.LOOK) == set(statuses.STATUSES)
    assert set(Verdict.model_fields["status"].annotation.__args__) == set(statuses.STATUSES)
    assert statuses.counts(["ok", "timeout", "ok"]) == {"ok": 2, "timeout": 1}
    assert statuses.colour("from_a_newer_harness") == statuses.UNKNOWN_LOOK[1]


def test_missing_numbers_print_as_nothing_or_the_placeholder():
    from kernelbench_eval.results.formatting import number

    assert number(1.2345, ".2f", "x") == "1.23x"
    assert number(None, ".2f") == number(float("nan"), ".2f") == number(-1.0, ".4g") == ""
    assert number(None, ".3f", missing="-") == "-"


def test_gpu_lists_parse_one_way():
    from kernelbench_eval.isolation import gpus
    assert gpus.parse(" 0, GPU-ab12 ,,") == ["0", "GPU-ab12"]
    assert gpus.parse(None) == gpus.parse("") == []
    assert gpus.visible({"CUDA_VISIBLE_DEVICES": "1,2"}) == ["1", "2"] and gpus.visible({}) == []
    assert gpus.visible(gpus.pinned_to("3")) == ["3"]


def test_proc_reads_this_process():
    import os

    from kernelbench_eval.isolation import linux
    spent = sum(range(2_000_000))  # some CPU time to account
    assert spent and linux.cpu_time_ms(os.getpid()) > 0
    assert linux.cpu_time_ms(2**22 + 1) == 0.0  # no such process (above the largest pid Linux hands out)
    start, end = linux.environment_block()
    assert 0 < start < end
    assert set(linux.open_fds()) >= {0, 1, 2}
    assert linux.exists(os.getpid())


def test_a_process_carrying_a_worker_token_is_found_and_killed():
    import subprocess
    import sys

    from kernelbench_eval.isolation.forkclient import TOKEN_VAR
    from kernelbench_eval.isolation.reaping import kill_marked

    def sleeper(token: str) -> subprocess.Popen[bytes]:
        """A process carrying `token` that has said it is up (nothing here depends on how fast it starts)."""
        proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                                env={TOKEN_VAR: token, "PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        return proc

    stray, bystander = sleeper("unit-test-token"), sleeper("another-token")
    try:
        kill_marked("unit-test-token")
        assert stray.wait(timeout=300) == -9  # SIGKILL'd; the bound only keeps a broken kill from hanging CI
        assert bystander.poll() is None
    finally:
        for proc in (stray, bystander):
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


def test_killing_marked_processes_scans_again_until_none_is_left(monkeypatch: pytest.MonkeyPatch):
    """A marked process that forks while a scan runs (or is mid-exec) shows only to the next scan: the child
    born after the first scan is killed too, and a bystander never."""
    import signal

    from kernelbench_eval.isolation import linux, reaping
    from kernelbench_eval.isolation.forkclient import TOKEN_VAR

    marked, other = f"{TOKEN_VAR}=tok".encode(), f"{TOKEN_VAR}=else".encode()
    alive = {101: marked, 102: other}
    born = iter([{103: marked}])  # 101's child, forked while the first scan ran

    def scan():
        yield from list(alive.items())
        alive.update(next(born, {}))

    killed: list[int] = []

    def kill(pid: int, sig: int) -> None:
        assert sig == signal.SIGKILL
        killed.append(pid)
        alive.pop(pid, None)

    monkeypatch.setattr(linux, "environments", scan)
    monkeypatch.setattr(reaping.os, "kill", kill)
    reaping.kill_marked("tok")
    assert sorted(killed) == [101, 103] and 102 in alive


def test_polling_a_pipe_stops_once_there_is_something_to_read_or_when_its_time_is_up():
    """`linux.poll_readable`: how a woken candidate waits for its timed call, and the harness for a timed call's
    reply where it has a core of its own; it returns as soon as the pipe is readable, or after its time."""
    from kernelbench_eval.isolation.linux import poll_readable

    read, write = os.pipe()
    try:
        assert not poll_readable(read, 0.01)  # nothing comes: it gives up (and the caller then sleeps on it)
        os.write(write, b'{"op": "time"}\n')
        started = time.monotonic()
        assert poll_readable(read, 120)
        assert time.monotonic() - started < 60  # it saw the line, not the end of its 120 s
    finally:
        os.close(read)
        os.close(write)
