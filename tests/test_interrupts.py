"""Interrupting a command as a user does: Ctrl-C (SIGINT) and SIGTERM while images are being generated, in a real
subprocess. The process exits 130 / 143 with one line, never aborts inside a native call, keeps the images it
finished in an empty folder, and leaves an earlier run that --overwrite was replacing exactly as it was; vvs-serve
answers the request it is decoding before it stops."""
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


def test_vvs_serve_drains_in_flight_requests_when_interrupted(tiny_folder):
    """Ctrl-C on vvs-serve (a real Ray instance in a subprocess): the request being decoded still gets its 200 (it
    was cut off before), and the process exits 130 with one line."""
    import socket
    import threading
    import urllib.error
    import urllib.request

    pytest.importorskip("ray", reason="the serve extra is installed by the test set-up")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-c", "from vvs.cli import serve_main; serve_main()", "--engine",
                             str(tiny_folder), "--port", str(port), "--max-batch", "1", "--threads", "1",
                             "--grace-s", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/healthz", timeout=2).read()
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert proc.poll() is None and time.monotonic() < deadline, "vvs-serve did not come up"
                time.sleep(0.3)

        def post(classes):
            body = json.dumps({"conditions": classes, "mode": "sd", "decode": False}).encode()
            request = urllib.request.Request(url + "/v1/generate", data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    return response.status
            except urllib.error.HTTPError as err:
                return err.code

        answer = {}
        start = time.monotonic()
        worker = threading.Thread(target=lambda: answer.update(status=post([i % 10 for i in range(64)]),
                                                               seconds=time.monotonic() - start))
        worker.start()
        time.sleep(1.0)
        signalled = time.monotonic() - start
        proc.send_signal(signal.SIGINT)
        worker.join(120)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert answer["status"] == 200 and answer["seconds"] > signalled, answer
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "vvs-serve: interrupted"
    assert "Traceback" not in err
