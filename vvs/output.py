"""Writing what ``vvs-run`` produces: PNGs, a grid per mode, statistics JSON, token ids, a summary table.

Every file is written under a temporary name and renamed, so an interrupted run leaves no half-written file. A
run's images go to a staging folder inside ``--out`` and move into place only when the run ends, so an earlier run
that ``--overwrite`` replaces stays whole until the new one is complete, and an index never names a missing file.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image

from vvs.errors import VVSError
from vvs.memory import describe_peak, peak_resident_bytes
from vvs.runtime.stats import aggregate


def slug(prompt: str, length: int = 40) -> str:
    """A file-name part from a prompt: its first words, lower-case ASCII letters and digits joined by '-'."""
    words = re.findall(r"[a-z0-9]+", prompt.lower())
    return "-".join(words)[:length].strip("-") or "prompt"


def atomic_write(path: Path, write) -> None:
    """``write(tmp)`` then rename onto ``path``. The temporary name is unique to this process, so two writers never
    share one; a write that fails (a full disk) leaves ``path`` as it was and says so in one line."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:
        raise VVSError(f"{path}: could not be written ({err.strerror or err}); it was left as it was") from None
    finally:
        tmp.unlink(missing_ok=True)


def check_output_file(flag: str, path: Path) -> None:
    """A path we may replace: a new name or a regular file — never a folder, a device or a symbolic link."""
    if path.is_symlink():
        raise VVSError(f"option {flag} {path}: is a symbolic link; give the path of a regular file")
    if path.exists() and not path.is_file():
        raise VVSError(f"option {flag} {path}: exists and is not a regular file (a folder or a device); "
                       "give a file path")
    ensure_writable_dir(path.parent)


def save_png(image: Image.Image, path: Path) -> None:
    atomic_write(path, lambda tmp: image.save(tmp, format="PNG"))


def grid_image(images: torch.Tensor, columns: int | None = None, pad: int = 2) -> Image.Image:
    """``images [n, 3, H, W]`` in [0, 1] -> one PIL image, row-major."""
    n, _, h, w = images.shape
    cols = columns or math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    canvas = torch.ones(3, rows * (h + pad) + pad, cols * (w + pad) + pad)
    for i, img in enumerate(images):
        r, c = divmod(i, cols)
        canvas[:, pad + r * (h + pad) : pad + r * (h + pad) + h, pad + c * (w + pad) : pad + c * (w + pad) + w] = img
    arr = (canvas.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    return Image.fromarray(np.ascontiguousarray(arr))


def ensure_writable_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".vvs-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise VVSError(f"{path}: cannot write output there ({err.strerror or err}); choose another folder") from None


RUN_INDEX = ".vvs-run.json"  # the files a run wrote to its --out folder, so --overwrite removes exactly those
STAGING = ".vvs-run-staging"  # a run's files until it ends


class Batch(NamedTuple):
    mode: str
    files: list[str]  # its images' file names in the staging folder
    records: list[dict]  # their --stats-json entries
    generation: object  # the Pipeline's Generation


@contextlib.contextmanager
def signals_held():
    """Ctrl-C and SIGTERM wait until the block ends: a second signal must not stop a move into place halfway (the
    index is replaced last; files moved before it would belong to no run)."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class RunWriter:
    """Everything a ``vvs-run`` writes. Every path is checked when it is constructed, before any work: ``out``
    must be empty (or ``overwrite`` given: the earlier run's files are replaced when this one ends) and no other
    run may be writing there; statistics and token files go only to new paths or regular files.

    :meth:`finish` moves the run into place. An interrupted run (:meth:`keep_finished`) keeps its finished images
    in an empty folder, and leaves an earlier run untouched; :meth:`close` discards whatever was not moved."""

    def __init__(self, out: Path, stats_json: str | None, save_tokens: str | None, overwrite: bool = False,
                 weight_bytes: int | None = None):
        self.out = Path(out)
        self.stats_json = Path(stats_json) if stats_json else None
        self.weight_bytes = weight_bytes  # the engine folder's, which the report sets the peak memory against
        self.save_tokens = Path(save_tokens) if save_tokens else None
        for flag, extra in (("--stats-json", self.stats_json), ("--save-tokens", self.save_tokens)):
            if extra is not None:
                if extra.resolve() == self.out.resolve():
                    raise VVSError(f"option {flag} {extra}: is the --out folder; give a file path")
                check_output_file(flag, extra)
        if self.stats_json is not None and self.stats_json == self.save_tokens:
            raise VVSError("options --stats-json and --save-tokens name the same file; give two paths")
        if self.out.exists() and not self.out.is_dir():
            raise VVSError(f"option --out {self.out}: exists and is not a folder; choose another --out")
        ensure_writable_dir(self.out)
        self.lock = self.out / ".vvs-run.lock"
        self._take_lock()
        try:
            self.earlier = self._earlier_run(overwrite)
            self.staging = self.out / STAGING
            shutil.rmtree(self.staging, ignore_errors=True)  # left by a run that was killed (we hold the lock)
            self.staging.mkdir()
        except BaseException:
            self.lock.unlink(missing_ok=True)
            raise
        # one append per batch, so that an interruption keeps a batch whole or not at all, and the index,
        # statistics and tokens always agree
        self.batches: list[Batch] = []
        self.grids: list[str] = []

    def _take_lock(self) -> None:
        for _ in range(2):
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    owner = int(self.lock.read_text() or 0)
                except (OSError, ValueError):
                    owner = 0
                if owner and process_alive(owner):
                    raise VVSError(f"option --out {self.out}: another vvs-run (pid {owner}) is writing there; "
                                   "wait for it or choose another --out") from None
                self.lock.unlink(missing_ok=True)  # left by a run that was killed
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return
        raise VVSError(f"option --out {self.out}: could not take {self.lock.name}; remove it if no run is active")

    def _earlier_run(self, overwrite: bool) -> list[str] | None:
        """The files of the run already in ``out`` (None when the folder is empty)."""
        present = [p for p in self.out.iterdir() if p.name not in (self.lock.name, STAGING)]
        if not present:
            return None
        if not overwrite:
            raise VVSError(f"option --out {self.out}: already holds files (an earlier run?); pass --overwrite to "
                           "replace that run's files, or choose another folder")
        try:
            earlier = json.loads((self.out / RUN_INDEX).read_text()).get("files", [])
        except (OSError, ValueError, AttributeError):
            earlier = []
        return [name for name in earlier if isinstance(name, str) and "/" not in name and not name.startswith(".")]

    def add(self, mode: str, start: int, conditions: list, result, names: list[str] | None) -> None:
        """One batch of a mode's images, the first being image ``start`` of the run; a condition is a class id or
        a prompt."""
        files, records = [], []
        for i, (img, condition, s) in enumerate(zip(result.pil_images(), conditions, result.stats), start):
            if isinstance(condition, str):
                name, record = slug(condition), {"prompt": condition}
            else:
                name = names[condition] if names else f"class{condition}"
                record = {"class": condition, "class_name": name}
                name = re.sub(r"[^A-Za-z0-9_-]+", "_", name)  # "great white shark" -> great_white_shark
            files.append(f"{mode}_{i:03d}_{name}.png")
            save_png(img, self.staging / files[-1])
            records.append({"mode": mode, "index": i, **record, **s.to_dict()})
        self.batches.append(Batch(mode, files, records, result))

    def grid(self, mode: str) -> None:
        images = torch.cat([b.generation.images for b in self.batches if b.mode == mode])
        save_png(grid_image(images), self.staging / f"{mode}_grid.png")
        self.grids.append(f"{mode}_grid.png")

    @property
    def written(self) -> list[str]:
        return [name for b in self.batches for name in b.files] + self.grids

    def finish(self, backend: str) -> None:
        with signals_held():
            self._report(backend)
            self._move_into_place()
        self.close()

    def keep_finished(self, backend: str) -> None:
        """After an interruption: the finished images stay, with their table, statistics and tokens, unless they
        would replace an earlier run."""
        if self.earlier is None and self.written:
            with signals_held():
                self._report(backend)
                self._move_into_place()

    def _report(self, backend: str) -> None:
        """The table of the images generated, and the --stats-json and --save-tokens files."""
        rows = [f"{'mode':8} {'images':>6} {'TPF':>6} {'target fwd/img':>15} {'skipped/img':>12} "
                f"{'accept len':>10} {'accepted':>9} {'s/img':>8}"]
        by_mode: dict[str, list] = {}
        for b in self.batches:
            by_mode.setdefault(b.mode, []).extend(b.generation.stats)
        summary = {}
        for mode, stats in by_mode.items():
            agg = aggregate(stats)
            summary[mode] = agg
            n = agg["images"]
            rows.append(f"{mode:8} {n:6d} {agg['tokens_per_target_forward']:6.2f} {agg['target_forwards'] / n:15.1f} "
                        f"{agg['skipped_verifications'] / n:12.1f} {agg['mean_accept_length']:10.2f} "
                        f"{'-' if agg['acceptance_rate'] is None else format(agg['acceptance_rate'], '.1%'):>9} "
                        f"{agg['seconds_per_image']:8.3f}")
        print("\n".join(rows))
        print(f"backend {backend}; {describe_peak(self.weight_bytes)}; images and grids in {self.out}/"
              + (f", statistics in {self.stats_json}" if self.stats_json else ""))
        if self.stats_json:
            images = [record for b in self.batches for record in b.records]
            payload = {"backend": backend, "peak_resident_bytes": peak_resident_bytes(),
                       "weight_bytes": self.weight_bytes, "images": images,
                       "aggregate": summary[next(iter(summary))] if len(summary) == 1 else summary}
            atomic_write(self.stats_json, lambda tmp: tmp.write_text(json.dumps(payload, indent=1) + "\n"))
        if self.save_tokens:
            arr = torch.cat([b.generation.tokens for b in self.batches]).numpy()
            def write(tmp: Path) -> None:
                with open(tmp, "wb") as f:
                    np.save(f, arr)

            atomic_write(self.save_tokens, write)

    def _move_into_place(self) -> None:
        """The earlier run's index goes first and this run's comes last, so no index ever names a missing file."""
        (self.out / RUN_INDEX).unlink(missing_ok=True)
        for name in set(self.earlier or []) - set(self.written):
            (self.out / name).unlink(missing_ok=True)
        for name in self.written:
            os.replace(self.staging / name, self.out / name)
        index = {"files": self.written}
        atomic_write(self.out / RUN_INDEX, lambda tmp: tmp.write_text(json.dumps(index, indent=1) + "\n"))

    def close(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self.lock.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
