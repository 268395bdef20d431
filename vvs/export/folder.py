"""An engine folder's transaction, for every family's exporter: the folder is built under a temporary name and
renamed into place at the end, so an interrupted export never leaves a half-written folder behind (and never
destroys a previous one until the new one is complete).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import onnxscript
import torch
from safetensors import SafetensorError

import vvs
from vvs.engines.manifest import FORMAT, MANIFEST
from vvs.errors import VVSError
from vvs.export.onnx_export import OPSET
from vvs.files import follow_umask
from vvs.output import process_alive


def tool_versions() -> dict:
    return {"vvs": vvs.__version__, "torch": torch.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "onnxscript": onnxscript.__version__,
            "numpy": np.__version__, "opset": OPSET, "exporter": "torch.onnx.export(dynamo=True)"}


@contextmanager
def folder_transaction(out_dir: Path, force: bool):
    """A temporary folder beside ``out_dir`` to write an engine folder into; swapped into place when the block
    ends, removed (and ``out_dir`` left as it was) when it raises."""
    check_out_dir(out_dir, force)
    remove_stale_work(out_dir.parent, out_dir.name)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.vvs-export-{os.getpid()}-", dir=out_dir.parent))
    try:
        yield work
        follow_umask(work)
        _replace_dir(work, out_dir)
    except (OSError, SafetensorError) as err:  # a full disk, a folder that vanished: nothing was replaced
        shutil.rmtree(work, ignore_errors=True)
        raise VVSError(f"{out_dir}: export failed while writing ({getattr(err, 'strerror', None) or err}); the "
                       "folder was left as it was") from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def check_out_dir(out_dir: Path, force: bool) -> None:
    """What may be at ``--out``: nothing, an empty folder, or (with ``force``) an engine folder. An export never
    deletes what it did not create."""
    parent = out_dir.parent
    cwd = Path.cwd().resolve()
    if out_dir == cwd or out_dir in cwd.parents:
        raise VVSError(f"{out_dir}: is the folder vvs-export runs in (or holds it); choose a new --out, e.g. "
                       "--out engines")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise VVSError(f"{out_dir}: cannot write here (is {parent} an existing, writable folder?)")
    if not out_dir.exists():
        return
    if out_dir.is_symlink() or not out_dir.is_dir():
        raise VVSError(f"{out_dir}: exists and is not a folder; choose another --out")
    if not any(out_dir.iterdir()):
        return
    if not is_engine_folder(out_dir):
        raise VVSError(f"{out_dir}: exists and is not an engine folder; choose another --out")
    if not force:
        raise VVSError(f"{out_dir}: an engine folder is already there; pass --force to replace it")


def is_engine_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a vvs engine folder of any format (``--force`` replaces a folder exported by an
    earlier version too)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and str(manifest.get("format")).startswith(FORMAT.rsplit("/", 1)[0] + "/")


def remove_stale_work(parent: Path, name: str) -> None:
    """Remove what exports into ``parent/name`` that were killed left behind (their process is gone)."""
    for path in parent.glob(f".{name}.vvs-export-*"):
        pid = path.name[len(f".{name}.vvs-export-"):].split("-")[0]
        if pid.isdigit() and not process_alive(int(pid)) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
    old = parent / f".{name}.old"
    if old.is_dir() and (old / MANIFEST).is_file():
        shutil.rmtree(old, ignore_errors=True)


def _replace_dir(new: Path, target: Path) -> None:
    """Swap ``new`` into place: the old engine folder is renamed aside first and removed only once the new one is
    in place."""
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
        os.replace(new, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, target)
