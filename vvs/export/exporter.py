"""``vvs-export``: a model bundle -> an engine folder (four ONNX graphs, tables, manifest).

The ``draft_tree`` graph is built for the decoding defaults' tree shape; :func:`export_tree` adds other shapes
to a folder on demand (``vvs-bench --tune`` and ``--sweep`` try several).

The folder is built under a temporary name and renamed into place at the end, so an interrupted export never
leaves a half-written folder behind (and never destroys a previous one until the new one is complete).
"""
from __future__ import annotations

import copy
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
from safetensors.torch import save_file
from tqdm import tqdm

import vvs
from vvs.engines.manifest import (CALIBRATION, FORMAT, MANIFEST, TABLES, TORCH_WEIGHTS, file_record, graph_spec,
                                  read_manifest)
from vvs.errors import VVSError
from vvs.export.graphs import build_graphs, draft_tree_graph
from vvs.files import follow_umask
from vvs.export.onnx_export import OPSET, export_graph
from vvs.export.spec import DTYPES, GraphSpec, draft_tree_spec, graph_specs
from vvs.models.bundle import ModelBundle
from vvs.models.drafter import DrafterConfig
from vvs.models.gpt import GPTConfig
from vvs.models.layers import cast_floating
from vvs.models.loading import load_drafter, load_gpt, save_model
from vvs.output import process_alive
from vvs.runtime.neighbours import nearest_codes
from vvs.runtime.options import DecodeOptions, TreeShape

# the dtype of everything that is not quantized: int8 is W8A8 Q/DQ linears in an otherwise fp16 graph
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "int8": torch.float16}


def export_folder(bundle: ModelBundle, out_dir: Path, precision: str = "fp32", max_draft_top_k: int = 10,
                  neighbours: int | None = None, decoding_defaults: dict | None = None,
                  extra_model_info: dict | None = None, progress: bool = True, force: bool = False,
                  text_encoder: tuple | None = None) -> dict:
    """Export ``bundle`` into ``out_dir``; returns the manifest. ``neighbours``: LANTERN neighbours stored per
    code (default: the decoding defaults' ``lantern_k``). ``text_encoder``: a t2i target's ``transformers`` T5
    encoder and tokenizer (:func:`vvs.text.export.load_text_encoder`), exported as the ``text_encode`` graph."""
    if precision not in PRECISIONS:
        raise VVSError(f"option precision={precision!r}: choose one of {', '.join(PRECISIONS)}")
    defaults = DecodeOptions().updated(**(decoding_defaults or {}))
    if defaults.draft_top_k > max_draft_top_k:
        raise VVSError(f"default draft_top_k={defaults.draft_top_k} exceeds max_draft_top_k={max_draft_top_k}")
    vocab = bundle.target.config.vocab_size
    k_nn = min(neighbours or defaults.lantern_k, vocab - 1)
    out_dir = Path(out_dir).resolve()
    with folder_transaction(out_dir, force) as work:
        source = bundle  # what the torch backend will load (int8: the fp32 models plus the calibration)
        if PRECISIONS[precision] != torch.float32:
            bundle = copy.deepcopy(bundle)  # casting happens in place; leave the caller's models as they were
            if precision == "fp16":
                source = bundle
        if precision == "int8":
            from vvs.calib.int8 import calibrate, int8_bundle

            bundle = int8_bundle(bundle, calibrate(bundle, work / CALIBRATION))
        act = "float16" if PRECISIONS[precision] == torch.float16 else "float32"
        specs = graph_specs(bundle.target.config, bundle.drafter.config, bundle.vq.config, defaults.tree, act)
        graphs = build_graphs(bundle.target, bundle.drafter, bundle.vq, defaults.tree)
        for module in graphs.values():
            cast_floating(module, PRECISIONS[precision])
        files: list[Path] = []
        entries = {}
        steps = tqdm(list(specs), desc="export", unit="graph", disable=not progress, dynamic_ncols=True)
        for name in steps:
            steps.set_postfix_str(name)
            written = export_graph(graphs[name], specs[name], work / f"{name}.onnx", vocab,
                                   bundle.target.config.max_positions - 1)
            onnx.checker.check_model(str(written[0]))
            files += written
            entries[name] = {"file": written[0].name, "spec": specs[name].to_dict()}
        entries["draft_tree"]["tree"] = list(defaults.tree)
        if text_encoder is not None:
            from vvs.text.export import export_text_encoder

            entries["text_encode"], written = export_text_encoder(*text_encoder, work, bundle.target.config.cls_token_num)
            files += written
        tables = {"codebook": bundle.vq.quantize.codebook().detach().float().contiguous(),
                  "neighbours": nearest_codes(bundle.vq.quantize.codebook().detach(), k_nn)}
        if bundle.target.config.model_type == "t2i":
            tables["null_condition"] = bundle.target.cls_embedding.uncond_embedding.detach().float().contiguous()
        save_file(tables, work / TABLES)
        files.append(work / TABLES)
        # the torch weights too, so one folder serves every backend (and TensorRT rebuilds need only the ONNX)
        for name, model, kind in (("target", source.target, "gpt"), ("drafter", source.drafter, "drafter"),
                                  ("vq", source.vq, "vq")):
            files.append(save_model(model, work / TORCH_WEIGHTS[name], kind))
        if precision == "int8":
            files.append(work / CALIBRATION)
        manifest = {
            "format": FORMAT,
            "model": {
                "family": "llamagen",
                "target": bundle.target.config.to_dict(),
                "drafter": bundle.drafter.config.to_dict(),
                "vq": bundle.vq.config.to_dict(),
                **(extra_model_info or {}),
            },
            "precision": precision,
            "max_draft_top_k": max_draft_top_k,
            "graphs": entries,
            "tables": {"file": TABLES, "neighbours_per_code": k_nn},
            "decoding_defaults": defaults.to_dict(),
            "versions": tool_versions(),
            "files": {p.relative_to(work).as_posix(): file_record(p) for p in files},
        }
        if text_encoder is not None:
            from vvs.text.export import TOKENIZER

            manifest["text"] = {"tokenizer": TOKENIZER, "encoder": text_encoder[0].config.name_or_path or "T5"}
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


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
    except OSError as err:  # a full disk, a folder that vanished: nothing was replaced
        shutil.rmtree(work, ignore_errors=True)
        raise VVSError(f"{out_dir}: export failed while writing ({err.strerror or err}); the folder was left as it "
                       "was") from None
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
    try:
        read_manifest(out_dir)
    except VVSError:
        raise VVSError(f"{out_dir}: exists and is not an engine folder; choose another --out") from None
    if not force:
        raise VVSError(f"{out_dir}: an engine folder is already there; pass --force to replace it")


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


TREES = "trees"  # draft_tree graphs of other tree shapes, exported on demand
TREE_INDEX = "index.json"  # in TREES: the size and sha256 of every file exported there


def export_tree(folder: Path, manifest: dict, tree: TreeShape) -> tuple[Path, GraphSpec]:
    """The ``draft_tree`` graph of ``tree`` for an engine folder, exported once from the folder's own torch
    weights into its ``trees/`` subfolder (named after those weights' sha256, so a re-exported folder never picks
    up a stale graph). Each use checks the graph against the size and sha256 recorded when it was exported, as a
    folder's own files are checked; a graph that fails (truncated, edited) is exported again."""
    folder = Path(folder)
    weights = "".join(manifest["files"][TORCH_WEIGHTS[m]]["sha256"][:8] for m in ("target", "drafter"))
    path = folder / TREES / f"draft_tree-{tree.name}-{weights}.onnx"
    target = GPTConfig(**manifest["model"]["target"])
    act = graph_spec(manifest, "draft_tree").inputs[0].dtype
    spec = draft_tree_spec(target, DrafterConfig(**manifest["model"]["drafter"]), tree, act)
    if not _recorded_intact(path):
        gpt = load_gpt(folder / TORCH_WEIGHTS["target"])
        module = draft_tree_graph(gpt, load_drafter(folder / TORCH_WEIGHTS["drafter"], gpt.config), tree)
        cast_floating(module, DTYPES[act])
        try:
            _record(path.parent, export_graph(module, spec, path, target.vocab_size, target.max_positions - 1))
        except OSError as err:
            raise VVSError(f"{path}: cannot write the draft_tree graph for tree {tree.name} ({err.strerror or err}); "
                           "make the engine folder writable, or export it with this tree as a default") from None
    return path, spec


def _tree_index(trees: Path) -> dict:
    try:
        index = json.loads((trees / TREE_INDEX).read_text())
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}


def _recorded_intact(path: Path) -> bool:
    """``path`` and its external data exist with the size and sha256 recorded when they were exported."""
    files = _tree_index(path.parent).get(path.name)
    if not isinstance(files, dict) or path.name not in files:
        return False
    for name, record in files.items():
        f = path.parent / name
        try:
            if f.stat().st_size != record["bytes"] or file_record(f)["sha256"] != record["sha256"]:
                return False
        except (OSError, TypeError, KeyError):
            return False
    return True


def _record(trees: Path, files: list[Path]) -> None:
    index = _tree_index(trees)
    index[files[0].name] = {p.name: file_record(p) for p in files}
    tmp = trees / f".{TREE_INDEX}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(index, indent=1) + "\n")
    os.replace(tmp, trees / TREE_INDEX)


def write_defaults(folder: Path, defaults: dict, tuning: dict | None = None) -> None:
    """Replace the folder's default decoding options (``vvs-bench --tune``, which also records what it predicted
    and measured under ``tuning``); only the manifest changes."""
    path = Path(folder) / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["decoding_defaults"] = DecodeOptions().updated(**defaults).to_dict()
    if tuning is not None:
        manifest["tuning"] = tuning
    tmp = path.with_name(MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, path)
