"""The repository itself: what a clone carries. Large files belong in ``vvs/weights/`` (the shipped models, which
``vvs-export`` needs with no download); anything else that large is a stray output (a profiler trace, a bench run)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 5 * 2**20
ALLOWED = "vvs/weights/"


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name]


def test_no_large_tracked_file_outside_the_shipped_weights():
    large = [f"{name} ({(ROOT / name).stat().st_size / 2**20:.1f} MiB)" for name in tracked_files()
             if not name.startswith(ALLOWED) and (ROOT / name).is_file() and (ROOT / name).stat().st_size > LIMIT]
    assert not large, f"tracked files over 5 MiB outside {ALLOWED}: {', '.join(large)}"


def test_profiler_traces_are_ignored():
    # ONNX Runtime writes onnxruntime_profile__<date>.json into the working directory when profiling is on
    probe = "onnxruntime_profile__2026-01-01_00-00-00_000.json"
    result = subprocess.run(["git", "check-ignore", "-q", "--no-index", probe], cwd=ROOT)
    assert result.returncode == 0, f"{probe} is not ignored by .gitignore"
