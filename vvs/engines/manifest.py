"""The engine folder: graphs, tables and ``manifest.json``, and its validation.

``manifest.json`` records the model configs, each graph's file and I/O spec, the precision, the sha256 and size
of every file, the tool versions, and the default decoding options. Loading checks all of it; any missing,
truncated, edited or mismatched file is a one-line :class:`EngineFolderError` naming the file.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import onnx

from vvs.errors import VVSError
from vvs.export.spec import GraphSpec
from vvs.runtime.options import DecodeOptions, MAROptions, OptionsError

FORMAT = "vvs-engine-folder/1"
MANIFEST = "manifest.json"
TABLES = "tables.safetensors"
CALIBRATION = "calibration.safetensors"  # int8 folders: the activation statistics the Q/DQ scales came from
TORCH_WEIGHTS = {"target": "torch_target.safetensors", "drafter": "torch_drafter.safetensors",
                 "vq": "torch_vq.safetensors"}


class EngineFolderError(VVSError):
    pass


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_record(path: Path) -> dict:
    return {"sha256": sha256(path), "bytes": path.stat().st_size}


def read_manifest(folder: Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise EngineFolderError(f"{folder}: no such engine folder (create one with vvs-export)")
    path = folder / MANIFEST
    if not path.is_file():
        raise EngineFolderError(f"{path}: missing; {folder} is not an engine folder (create one with vvs-export)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise EngineFolderError(f"{path}: not valid JSON ({err}); re-export the folder") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise EngineFolderError(f"{path}: format {manifest.get('format') if isinstance(manifest, dict) else None!r} "
                                f"is not {FORMAT!r}; re-export with this version of vvs")
    for key in ("model", "graphs", "files", "precision", "decoding_defaults"):
        if key not in manifest:
            raise EngineFolderError(f"{path}: has no {key!r} entry; re-export the folder")
    if not isinstance(manifest["decoding_defaults"], dict):
        raise EngineFolderError(f"{path}: decoding_defaults is not a mapping; fix the file or re-export the folder")
    options = MAROptions if is_mar(manifest) else DecodeOptions
    try:
        options.from_dict(manifest["decoding_defaults"])
    except OptionsError as err:
        raise EngineFolderError(f"{path}: decoding_defaults: {err}; fix the file or re-export the folder") from None
    return manifest


def is_mar(manifest: dict) -> bool:
    """A folder of a MAR-style continuous-token model (:mod:`vvs.engines.mar`), not a LlamaGen one."""
    return isinstance(manifest.get("model"), dict) and manifest["model"].get("family") == "mar"


def referenced_files(manifest: dict) -> list[str]:
    """Every file the manifest points at: graphs, tables, and the plans of each TensorRT flavour."""
    names = [g["file"] for g in manifest["graphs"].values()]
    if not is_mar(manifest):
        names.append(manifest.get("tables", {}).get("file", TABLES))
    for key in ("tensorrt", "tensorrt-rtx"):
        names += [e["file"] for e in manifest.get(key, {}).get("engines", {}).values()]
    return names


def verify_files(folder: Path, manifest: dict, names: list[str] | None = None) -> None:
    """Every listed file exists with the recorded size and sha256; every file asked for (default: every file the
    manifest points at) is listed."""
    for name in names if names is not None else referenced_files(manifest):
        if name not in manifest["files"]:
            raise EngineFolderError(f"{Path(folder) / name}: not in the manifest's file list, so it cannot be "
                                    "checked (edited manifest?); re-export the folder")
    for name, record in manifest["files"].items():
        if names is not None and name not in names:
            continue
        path = Path(folder) / name
        if not path.is_file():
            raise EngineFolderError(f"{path}: missing from the engine folder; re-export it with vvs-export")
        size = path.stat().st_size
        if size != record["bytes"]:
            raise EngineFolderError(f"{path}: {size} bytes but the manifest records {record['bytes']} "
                                    "(truncated or replaced); re-export the folder")
        if sha256(path) != record["sha256"]:
            raise EngineFolderError(f"{path}: contents differ from the manifest's sha256 (edited?); re-export the folder")


def graph_spec(manifest: dict, name: str) -> GraphSpec:
    return GraphSpec.from_dict(manifest["graphs"][name]["spec"])


ONNX_DTYPES = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
               "int64": onnx.TensorProto.INT64, "bool": onnx.TensorProto.BOOL}


def check_onnx_matches_spec(path: Path, spec: GraphSpec) -> None:
    """The graph's inputs/outputs have the spec's names, dtypes and static dimensions."""
    model = onnx.load(str(path), load_external_data=False)
    for kind, values, specs in (("input", model.graph.input, spec.inputs), ("output", model.graph.output, spec.outputs)):
        got = [v.name for v in values]
        if got != [t.name for t in specs]:
            raise EngineFolderError(f"{path}: {kind}s {got} do not match the manifest's {[t.name for t in specs]}")
        for value, t in zip(values, specs):
            tt = value.type.tensor_type
            if tt.elem_type != ONNX_DTYPES[t.dtype]:
                raise EngineFolderError(f"{path}: {kind} {t.name} has ONNX type {tt.elem_type}, the manifest says {t.dtype}")
            dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tt.shape.dim]
            static = [(a, w) for a, w in enumerate(t.shape) if isinstance(w, int)]
            if len(dims) != len(t.shape) or any(dims[a] != w for a, w in static):
                raise EngineFolderError(f"{path}: {kind} {t.name} has shape {dims}, the manifest says {list(t.shape)}")


def engine_set(backend: str, folder: Path, manifest: dict, graphs: dict, device):
    """The :class:`EngineSet` of a folder's graphs: configs, tables and defaults from the manifest."""
    import torch
    from safetensors.torch import load_file

    from vvs.engines.base import EngineSet
    from vvs.models.gpt import GPTConfig

    from vvs.runtime.options import TreeShape

    tables = load_file(Path(folder) / manifest["tables"]["file"])
    act = next(t for t in graphs["target_verify"].spec.inputs if t.name == "past_kv").dtype
    engines = EngineSet(
        backend=backend,
        target=GPTConfig(**manifest["model"]["target"]),
        drafter_layers=manifest["model"]["drafter"]["num_hidden_layers"],
        graphs=graphs,
        codebook=tables["codebook"].to(device),
        device=device,
        dtype=torch.float16 if act == "float16" else torch.float32,
        max_draft_top_k=manifest["max_draft_top_k"],
        null_condition=tables.get("null_condition"),
        neighbour_table=tables["neighbours"].to(device),
        default_options=manifest["decoding_defaults"],
    )
    engines.trees[TreeShape(*manifest["graphs"]["draft_tree"]["tree"])] = graphs["draft_tree"]
    return engines
