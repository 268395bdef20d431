"""The engine folder: graphs, tables and ``manifest.json``, and its validation.

``manifest.json`` records the model configs, each graph's file and I/O spec, the precision, the sha256 and size
of every file, the tool versions, and the default decoding options. Its structure is declared once
(:data:`MANIFEST_SCHEMA`, a JSON Schema) and checked at load together with the model configs, so a wrong shape is
one error naming the field before any work. Loading then checks the files; any missing, truncated, edited or
mismatched file is a one-line :class:`EngineFolderError` naming the file.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import jsonschema
import onnx

from vvs.errors import VVSError
from vvs.export.spec import GraphSpec
from vvs.families.registry import FAMILIES, family_of
from vvs.runtime.options import OptionsError

FORMAT = "vvs-engine-folder/2"
MANIFEST = "manifest.json"
TABLES = "tables.safetensors"
CALIBRATION = "calibration.safetensors"  # int8 folders: the activation statistics the Q/DQ scales came from
TORCH_WEIGHTS = {"target": "torch_target.safetensors", "drafter": "torch_drafter.safetensors",
                 "vq": "torch_vq.safetensors"}  # LlamaGen folders' (MAR's: vvs.families.mar.engines)


class EngineFolderError(VVSError):
    pass


# What a graph's matrices are stored as: float32, float16 / bfloat16 (such folders, and int8 folders' graphs other
# than the target's), w8a8-static (SmoothQuant's per-channel int8 weights and calibrated int8 activations as Q/DQ,
# int8 folders' target graphs), int8 / int4 / int4-head8 (weight-only: ONNX Runtime's block-wise MatMulNBits in a
# float32 graph; int4-head8: int4 but the output head int8), or w8a8 (int8 weights per channel times activations
# quantised per row in the graph, through MatMulInteger: vvs.export.row_int8)
GRAPH_WEIGHTS = ("fp32", "fp16", "bf16", "w8a8-static", "int8", "int4", "int4-head8", "w8a8")
WEIGHT_ONLY = ("int8", "int4", "int4-head8")
REWRITTEN = (*WEIGHT_ONLY, "w8a8")  # written by rewriting a float32 graph's MatMuls (vvs-export --weights)
KERNEL = {**dict.fromkeys(WEIGHT_ONLY, "MatMulNBits"), "w8a8": "MatMulInteger"}  # ONNX Runtime's, by format
W8A8_GRAPHS = ("target_prefill", "target_verify")  # what --precision int8 quantizes


def graph_weights(manifest: dict, name: str) -> str:
    """The storage of graph ``name``'s matrices; folders exported before graphs recorded it say so through their
    precision (and a draft_tree's ``weights``, recorded from the start)."""
    if manifest["precision"] == "int8":  # recorded as "w8a8" before the per-row format took that name
        return "w8a8-static" if name in W8A8_GRAPHS else "fp16"
    recorded = manifest["graphs"][name].get("weights")
    return manifest["precision"] if recorded is None else recorded


# a file of the folder: a relative path without ".." components
_NAME = {"type": "string", "pattern": r"^[^/\\]+(/[^/\\]+)*$", "not": {"pattern": r"(^|/)\.\.(/|$)"}}
_COUNT = {"type": "integer", "minimum": 1}
_TENSOR = {"type": "object", "required": ["name", "dtype", "shape"], "properties": {
    "name": {"type": "string"}, "dtype": {"enum": ["float32", "float16", "int64", "bool"]},
    "shape": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1}]}}}}
_SPEC = {"type": "object", "required": ["name", "inputs", "outputs"], "properties": {
    "name": {"type": "string"}, "inputs": {"type": "array", "items": _TENSOR},
    "outputs": {"type": "array", "items": _TENSOR}}}
# where an option's checkpoint came from when it named a Hugging Face hub id (vvs.models.hub)
_SOURCE = {"type": "object", "required": ["repo", "revision", "commit"], "properties": {
    "repo": {"type": "string", "pattern": "^[^/]+/[^/]+$"}, "revision": {"type": "string"},
    "commit": {"type": "string", "pattern": "^[0-9a-f]{40}$"}, "path": {"type": "string"}}}
_PLANS = {"type": "object", "required": ["engines"], "properties": {"engines": {
    "type": "object", "additionalProperties": {"type": "object", "required": ["file", "profiles"], "properties": {
        "file": _NAME, "profiles": {"type": "array", "items": {"type": "object"}}}}}}}
MANIFEST_SCHEMA = {
    "type": "object",
    "required": ["format", "model", "precision", "graphs", "decoding_defaults", "files"],
    "properties": {
        "format": {"const": FORMAT},
        "model": {"type": "object", "required": ["family", "target"], "properties": {
            "family": {"enum": list(FAMILIES)},
            "target": {"type": "object"}, "drafter": {"type": "object"}, "draft": {"type": "object"},
            "vq": {"type": "object"}, "tokenizer": {"type": "object", "required": ["kind", "scale"]},
            "image_size": _COUNT, "classes": {"type": "array", "items": {"type": "string"}}}},
        "precision": {"enum": ["fp32", "fp16", "bf16", "int8"]},
        "max_draft_top_k": _COUNT,
        "graphs": {"type": "object", "minProperties": 1, "additionalProperties": {
            "type": "object", "required": ["file", "spec"], "properties": {
                "file": _NAME, "spec": _SPEC, "weights": {"enum": list(GRAPH_WEIGHTS)},
                "tree": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 3, "maxItems": 3}}}},
        "tables": {"type": "object", "required": ["file"], "properties": {
            "file": _NAME, "neighbours_per_code": {"type": "integer", "minimum": 0}}},
        "decoding_defaults": {"type": "object"},
        "files": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["sha256", "bytes"], "properties": {
                "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                "bytes": {"type": "integer", "minimum": 0}}}},
        "text": {"type": "object", "required": ["tokenizer"], "properties": {"tokenizer": _NAME}},
        "prompts": {"type": "object", "required": ["tokenizer"], "properties": {"tokenizer": _NAME}},
        "tensorrt": _PLANS,
        "tensorrt-rtx": _PLANS,
        "sources": {"type": "object", "additionalProperties": _SOURCE},
    },
    # each family's own requirements, where the manifest names it
    "allOf": [{"if": {"properties": {"model": {"properties": {"family": {"const": name}}}}},
               "then": family.manifest_schema} for name, family in FAMILIES.items()],
}


def check_manifest(manifest, path: Path) -> None:
    """The manifest has :data:`MANIFEST_SCHEMA`'s structure and its model configs build; else one error naming the
    first bad field."""
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(MANIFEST_SCHEMA).iter_errors(manifest))
    if error is not None:
        field = ".".join(str(p) for p in error.absolute_path) or "the top level"
        raise EngineFolderError(f"{path}: {field}: {error.message}; fix the file or re-export the folder")
    family = family_of(manifest)
    for name, (_, derived) in family.model_configs.items():
        if name not in manifest["model"]:  # optional parts (a drafter-free folder); the schema names the required
            continue
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in manifest["model"][name].items()}
        try:
            built = family.config_class(name)(**values)
            for size in derived:  # what the loaders compute from it
                getattr(built, size)
        except (TypeError, ValueError, ZeroDivisionError) as err:
            raise EngineFolderError(f"{path}: model.{name}: {err}; fix the file or re-export the folder") from None


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
    check_manifest(manifest, path)
    try:
        family_of(manifest).options.from_dict(manifest["decoding_defaults"])
    except OptionsError as err:
        raise EngineFolderError(f"{path}: decoding_defaults: {err}; fix the file or re-export the folder") from None
    return manifest


def update_manifest(folder: Path, **fields) -> dict:
    """Set top-level fields of a folder's manifest, checked against the schema; the manifest is replaced in one
    rename, and the files it lists are untouched. Returns the manifest."""
    path = Path(folder) / MANIFEST
    manifest = {**json.loads(path.read_text()), **fields}
    check_manifest(manifest, path)
    tmp = path.with_name(MANIFEST + ".tmp")
    try:
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as err:
        raise EngineFolderError(f"{path}: cannot be rewritten ({err.strerror or err}); make the folder writable "
                                "and export it again") from None
    return manifest


def referenced_files(manifest: dict) -> list[str]:
    """Every file the manifest points at: graphs, tables, and the plans of each TensorRT flavour."""
    names = [g["file"] for g in manifest["graphs"].values()]
    if "tables" in manifest:
        names.append(manifest["tables"]["file"])
    for key in ("text", "prompts"):
        if key in manifest:
            names.append(manifest[key]["tokenizer"])
    for key in ("tensorrt", "tensorrt-rtx"):
        names += [e["file"] for e in manifest.get(key, {}).get("engines", {}).values()]
    return names


def verify_files(folder: Path, manifest: dict, names: list[str] | None = None, hashes: bool = True) -> None:
    """Every listed file exists with the recorded size and sha256 (``hashes=False``: size only, a check that takes
    milliseconds); every file asked for (default: every file the manifest points at) is listed."""
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
        if hashes and sha256(path) != record["sha256"]:
            raise EngineFolderError(f"{path}: contents differ from the manifest's sha256 (edited?); re-export the folder")


def graph_spec(manifest: dict, name: str) -> GraphSpec:
    return GraphSpec.from_dict(manifest["graphs"][name]["spec"])


ONNX_DTYPES = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
               "int64": onnx.TensorProto.INT64, "bool": onnx.TensorProto.BOOL}


def check_onnx_matches_spec(path: Path, spec: GraphSpec) -> None:
    """The graph's inputs/outputs have the spec's names, dtypes and static dimensions."""
    model = onnx.load(str(path), load_external_data=False)
    for kind, values, specs in (("input", model.graph.input, spec.graph_inputs),
                                ("output", model.graph.output, spec.outputs)):
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
