"""Render report.html in headless Chromium: its script runs without error and every candidate is in the DOM."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from test_report import fixture_verdicts, write_run

from kernelbench_eval.results.report import write_default_reports


def chromium_binary() -> str | None:
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


CHROMIUM = chromium_binary()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary")


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.fixture
def report_html(tmp_path: Path) -> Path:
    run = write_run(tmp_path / "run", fixture_verdicts())
    page = next(p for p in write_default_reports(run) if p.name == "report.html")
    return page


def test_report_renders_in_chromium(report_html: Path, tmp_path: Path) -> None:
    url = report_html.resolve().as_uri()
    shot = tmp_path / "shot.png"
    result = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,900", url)
    assert shot.exists(), result.stderr[-2000:]
    assert shot.stat().st_size > 10_000
    assert "Uncaught" not in result.stderr, result.stderr[-2000:]

    dom = chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # the page's script sets this title as its last statement: an error thrown before it leaves the title unset
    assert "<title>kbeval report ok</title>" in dom.stdout, dom.stderr[-2000:]
    for v in fixture_verdicts():
        assert f">{v.candidate}<" in dom.stdout
    assert "Uncaught" not in dom.stderr, dom.stderr[-2000:]
