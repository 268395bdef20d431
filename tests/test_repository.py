"""The repository itself: what a clone carries. Large files belong in ``vvs/weights/`` (the shipped models, which
``vvs-export`` needs with no download); anything else that large is a stray output (a profiler trace, a bench run)."""
from __future__ import annotations

import re
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


# A machine's own absolute paths: a checkout (``/work/...``), a home directory (``/home/<user>/``, ``/Users/<user>/``,
# ``/root/``) or pytest's per-user temporary base (``/tmp/pytest-of-<user>``). The lookbehind keeps a URL's path
# (``github.com/x/work/``) and a relative one (``runs/work/``) out; ``/tmp/<name>`` in a documented command is fine.
MACHINE_PATH = re.compile(r"(?<![\w.~/-])(?:/work/|/home/[a-z_][\w.-]*/|/Users/[A-Za-z][\w.-]*/|/root/)"
                          r"|/tmp/pytest-of-")


def text_of(name: str) -> str | None:
    path = ROOT / name
    if not path.is_file() or path.stat().st_size > LIMIT:
        return None
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def test_no_tracked_file_names_a_machines_absolute_path():
    this = Path(__file__).resolve().relative_to(ROOT).as_posix()
    found = []
    for name in tracked_files():
        text = None if name == this else text_of(name)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            match = MACHINE_PATH.search(line)
            if match:
                found.append(f"{name}:{number}: ...{line[max(0, match.start() - 30):match.end() + 30]}...")
    assert not found, "tracked files name a machine's absolute path:\n" + "\n".join(found[:20])


def test_the_pattern_for_machine_paths():
    for bad in ["engine /work/main/engines", "at /home/alice/vvs", "/root/.cache/x", "/tmp/pytest-of-bob/pytest-3/",
                "(/Users/ann/ckpt)"]:
        assert MACHINE_PATH.search(bad), bad
    for good in ["--work runs/peers", "https://github.com/a/work/b", "/tmp/site", "/usr/bin/time -v", "~/work/x",
                 "$HF_HOME/hub", "docs/home/page"]:
        assert not MACHINE_PATH.search(good), good


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces to hyphens, a
    repeated heading numbered from -1."""
    seen: dict[str, int] = {}
    anchors = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(2).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_relative_links_in_tracked_markdown_resolve():
    # a section moved between docs/performance.md and its history page must take the links to it along
    broken = []
    anchors: dict[Path, set[str]] = {}
    for name in tracked_files():
        if not name.endswith(".md") or not (ROOT / name).is_file():
            continue
        text = re.sub(r"```.*?```", "", (ROOT / name).read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            file = ((ROOT / name).parent / path).resolve() if path else (ROOT / name).resolve()
            if not file.exists():
                broken.append(f"{name}: {target} (no such file)")
            elif anchor and file.suffix == ".md":
                if file not in anchors:
                    anchors[file] = heading_anchors(file)
                if anchor not in anchors[file]:
                    broken.append(f"{name}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)
