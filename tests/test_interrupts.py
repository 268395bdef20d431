"""Interrupting a command as a user does: Ctrl-C (SIGINT) and SIGTERM while images are being generated, in a real
subprocess. The process exits 130 / 143 with one line, never aborts inside a native call, keeps the images it
finished in an empty folder, and leaves an earlier run that --overwrite was replacing exactly as it was."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RUN = [sys.executable, "-c", "from vvs.cli import run_main; run_main()"]


def start_run(folder: Path, out: Path, *extra: str) -> subprocess.Popen:
    args = ["--engine", str(folder), "--mode", "ar", "--num-images", "400", "--batch-size", "1", "--threads", "1",
            "--out", str(out), *extra]
    return subprocess.Popen(RUN + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def interrupt_when_images_exist(proc: subprocess.Popen, out: Path, sig: int, count: int = 3) -> tuple[int, str]:
    """Send ``sig`` once ``count`` images of this run are finished (in its staging folder)."""
    deadline = time.monotonic() + 120
    while len(list((out / ".vvs-run-staging").glob("*.png"))) < count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run produced no images"
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_an_interrupted_run_keeps_its_finished_images(tiny_folder, tmp_path, sig, code, word):
    out = tmp_path / "out"
    proc = start_run(tiny_folder, out)
    returncode, err = interrupt_when_images_exist(proc, out, sig)
    assert returncode == code, err
    assert err.strip().splitlines()[-1] == f"vvs-run: {word}"
    assert "Traceback" not in err and "terminate called" not in err
    index = json.loads((out / ".vvs-run.json").read_text())["files"]
    assert len(index) >= 3 and sorted(index) == sorted(p.name for p in out.glob("*.png"))
    assert not (out / ".vvs-run-staging").exists() and not (out / ".vvs-run.lock").exists()


def test_an_interrupted_overwrite_leaves_the_earlier_run_as_it_was(tiny_folder, tmp_path):
    out = tmp_path / "out"
    first = subprocess.run(RUN + ["--engine", str(tiny_folder), "--mode", "ar", "--num-images", "2", "--threads", "1",
                                  "--out", str(out)], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    before = snapshot(out)
    proc = start_run(tiny_folder, out, "--overwrite", "--seed", "7")
    returncode, err = interrupt_when_images_exist(proc, out, signal.SIGINT)
    assert returncode == 130, err
    assert snapshot(out) == before
    assert not (out / ".vvs-run-staging").exists() and not (out / ".vvs-run.lock").exists()
