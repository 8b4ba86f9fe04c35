"""The builds' precompiled header (`building/pch.py`), on a stand-in `torch/extension.h` small enough to precompile in
a second: made and signed by the harness, found by gcc through a build worker's CPATH, and refused when anything
in its folder is not what the harness made. (The real header, through `load_inline`: tests/test_gpu.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kernelbench_eval.building import pch
from kernelbench_eval.containment import SandboxRecord
from kernelbench_eval.isolation import landlock, sandbox
from kernelbench_eval.store import keys

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

PROBE = "#define KBEVAL_PCH_PROBE 7\n#include <torch/extension.h>\n"  # what the stand-in header is made from
MAIN = ("#include <torch/extension.h>\n#ifdef KBEVAL_PCH_PROBE\nint main() { return KBEVAL_PCH_PROBE + stand_in(); }\n"
        "#else\nint main() { return stand_in(); }\n#endif\n")  # 7 only when the precompiled header was read


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pch.PchRecord:
    """A record as `discover` would give, for a small `torch/extension.h` under an -isystem folder (as torch's)."""
    system = tmp_path / "system" / "torch"
    system.mkdir(parents=True)
    (system / "extension.h").write_text("#pragma once\n#include <vector>\ninline int stand_in() { return 0; }\n")
    record = pch.PchRecord(torch_version="test", cxx="g++", cxx_version="test",
                           cflags=f"-isystem {tmp_path / 'system'} -fPIC -std=c++17", post_cflags="", header=PROBE)
    monkeypatch.setattr(pch, "discover", lambda with_cuda, env: record)
    monkeypatch.delenv("CPATH", raising=False)
    monkeypatch.delenv(pch.DIR_VAR, raising=False)
    return record


def build_and_run(tmp_path: Path, record: pch.PchRecord, extra: list[str] | None = None) -> int:
    """Compile MAIN as a build would (the record's flags, this process's CPATH) and run it: its exit status."""
    source, binary = tmp_path / "main.cpp", tmp_path / "main"
    source.write_text(MAIN)
    subprocess.run(["g++", *record.cflags.split(), *(extra or []), str(source), "-o", str(binary)], check=True,
                   env=dict(os.environ))
    return subprocess.run([str(binary)]).returncode


def entered(folder: Path, monkeypatch: pytest.MonkeyPatch, landlock_fs: bool) -> None:
    """What a build worker does with the folder the harness named, given what its sandbox held."""
    monkeypatch.setenv(pch.DIR_VAR, str(folder))
    pch.enter(SandboxRecord(landlock_fs=landlock_fs))


def test_the_harness_made_header_is_read_through_cpath(tmp_path: Path, stand_in: pch.PchRecord,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    folder = pch.prepare(tmp_path / "cache", with_cuda=False, make=True)
    assert folder is not None and sorted(p.name for p in folder.iterdir()) == [pch.RECORD, "torch"]
    assert build_and_run(tmp_path, stand_in) == 0  # no CPATH: the header itself
    entered(folder, monkeypatch, landlock_fs=True)
    assert os.environ["CPATH"] == str(folder) and pch.DIR_VAR not in os.environ
    assert build_and_run(tmp_path, stand_in) == 7  # the precompiled one
    # other flags than it was made with: gcc reads the header itself, silently, and the build still works
    assert build_and_run(tmp_path, stand_in, ["-O2"]) == 0


def test_a_worker_that_could_rewrite_it_does_not_use_it(tmp_path: Path, stand_in: pch.PchRecord,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = pch.prepare(tmp_path / "cache", with_cuda=False, make=True)
    assert folder is not None
    monkeypatch.setenv("CPATH", "/user/includes")
    entered(folder, monkeypatch, landlock_fs=False)
    assert os.environ["CPATH"] == "/user/includes" and pch.DIR_VAR not in os.environ
    entered(folder, monkeypatch, landlock_fs=True)  # a user's CPATH stays, after the harness's folder
    assert os.environ["CPATH"] == f"{folder}{os.pathsep}/user/includes"


@pytest.mark.parametrize("tamper", ["gch_bytes", "planted_header", "forged_record", "link"])
def test_a_folder_not_as_the_harness_made_it_is_refused_and_made_again(tmp_path: Path, stand_in: pch.PchRecord,
                                                                       tamper: str) -> None:
    cache = tmp_path / "cache"
    folder = pch.prepare(cache, with_cuda=False, make=True)
    assert folder is not None and pch.verified(folder, keys.load_key(cache), stand_in.key())
    if tamper == "gch_bytes":  # a trojan compiled in: same size, other bytes
        with (folder / pch.GCH).open("r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 1]))
    elif tamper == "planted_header":  # found on CPATH before torch's own headers
        (folder / "torch" / "all.h").write_text("#error trojan\n")
    elif tamper == "forged_record":  # digest of a replaced header, record rewritten without the key
        stored = json.loads((folder / pch.RECORD).read_text())
        stored["record"]["gch_sha256"] = "0" * 64
        (folder / pch.RECORD).write_text(json.dumps(stored))
    else:  # the folder swapped for a link to one the candidate controls
        elsewhere = tmp_path / "elsewhere"
        folder.rename(elsewhere)
        folder.symlink_to(elsewhere)
    assert not pch.verified(folder, keys.load_key(cache), stand_in.key())
    assert pch.prepare(cache, with_cuda=False, make=False) is None  # not used, not made: none
    again = pch.prepare(cache, with_cuda=False, make=True)
    assert again == folder and not folder.is_symlink() and pch.verified(folder, keys.load_key(cache), stand_in.key())
    assert not (folder / "torch" / "all.h").exists()


def test_a_header_is_made_once_per_flag_set(tmp_path: Path, stand_in: pch.PchRecord,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    first = pch.prepare(cache, with_cuda=False, make=True)
    made = (first / pch.GCH).stat().st_mtime_ns
    assert pch.prepare(cache, with_cuda=False, make=True) == first and (first / pch.GCH).stat().st_mtime_ns == made
    other = stand_in.model_copy(update={"cflags": stand_in.cflags + " -O2"})
    monkeypatch.setattr(pch, "discover", lambda with_cuda, env: other)
    second = pch.prepare(cache, with_cuda=False, make=True)
    assert second is not None and second != first and sorted(p.name for p in (cache / "pch").iterdir()) == sorted(
        [first.name, second.name])


def test_the_mode_and_landlock_decide_whether_builds_use_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pch.MODE_VAR, raising=False)
    monkeypatch.delenv(sandbox.OFF_VAR, raising=False)
    assert not pch.wanted("cpu")  # auto: CUDA builds only
    monkeypatch.setenv(pch.MODE_VAR, "off")
    assert not pch.wanted("cuda")
    monkeypatch.setenv(pch.MODE_VAR, "on")
    assert pch.wanted("cpu") == (landlock.abi() > 0)
    monkeypatch.setenv(sandbox.OFF_VAR, "landlock")  # candidates could rewrite it: never used
    assert not pch.wanted("cpu") and not pch.wanted("cuda")


def test_plan_makes_one_only_when_later_builds_will_use_it(tmp_path: Path, stand_in: pch.PchRecord,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    if landlock.abi() == 0:
        pytest.skip("no Landlock here: builds never use a header")
    monkeypatch.delenv(sandbox.OFF_VAR, raising=False)
    monkeypatch.setenv(pch.MODE_VAR, "auto")
    cache = tmp_path / "cache"
    pch.plan(cache, "cuda", builds=4, at_once=16)  # every build starts before it could be ready
    assert pch.wait(cache, "cuda", 120) is None and pch.env(cache, "cuda") == {}
    pch.plan(cache, "cuda", builds=40, at_once=16)
    folder = pch.wait(cache, "cuda", 300)
    assert folder is not None and pch.env(cache, "cuda") == {pch.DIR_VAR: str(folder)}
    assert pch.env(cache, "cpu") == {}  # a CPU build's flags are another set


def test_discover_reads_load_inlines_own_main_cpp_flags(tmp_path: Path) -> None:
    """The flags come from the `build.ninja` torch writes, less the extension's name (which differs per build)."""
    record = pch.discover(False, pch._build_env())
    assert "-DTORCH_API_INCLUDE_EXTENSION_H" in record.cflags and "-isystem" in record.cflags
    assert "TORCH_EXTENSION_NAME" not in record.cflags and record.cxx and record.cxx_version
