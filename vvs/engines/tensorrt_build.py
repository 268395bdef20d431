"""Build TensorRT 11 engines from an engine folder's ONNX graphs (``vvs-export --backend tensorrt``).

TensorRT 11 networks are always strongly typed: precision comes from the ONNX itself (fp16 graphs, or Q/DQ nodes
for int8), never from builder flags, which TensorRT 11 removed along with implicit calibration. One optimisation
profile per shape bucket (:mod:`vvs.engines.buckets`), a timing cache shared by all builds, and the engines are
recorded in the manifest with their sha256 and the TensorRT version.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import onnx

from vvs.engines.buckets import PAST_SLACK, buckets
from vvs.engines.manifest import MANIFEST, file_record, graph_spec, read_manifest, verify_files
from vvs.errors import VVSError
from vvs.runtime.options import DecodeOptions

TRT_DIR = "tensorrt"
TIMING_CACHE = "timing.cache"
WORKSPACE_BYTES = 4 << 30


class BuildError(VVSError):
    pass


def import_tensorrt():
    """The ``tensorrt`` module, or a one-line error saying how to get it."""
    try:
        import tensorrt
    except ImportError:
        raise VVSError("TensorRT 11 is not installed: pip install --extra-index-url https://pypi.nvidia.com "
                       "'vvs[trt]' on a machine with an NVIDIA GPU (or use --backend onnxruntime)") from None
    return tensorrt


def shape_ranges(manifest: dict, name: str, max_images: int) -> list[dict[str, tuple[tuple, tuple, tuple]]]:
    """Per optimisation profile: input name -> (min, opt, max) shapes. One profile per ``new`` bucket."""
    spec = graph_spec(manifest, name)
    target = manifest["model"]["target"]
    opts = DecodeOptions.from_dict(manifest["decoding_defaults"])
    c, n = target["cls_token_num"], target["grid_size"] ** 2
    base = c + n + 2 * opts.max_path_tokens
    past = {"target_verify": (c + n, base, c + n + PAST_SLACK),
            "drafter_step": (c + n, base + opts.depth * opts.draft_top_k,
                             c + n + PAST_SLACK + opts.depth * opts.draft_top_k)}.get(name, (0, 0, 0))
    news = buckets(name, c, opts) or [0]
    profiles = []
    for new in news:
        ranges = {"batch": (1, 2 * max_images, 2 * max_images), "images": (1, max_images, max_images),
                  "new": (new, new, new), "past": past,
                  "past_plus_new": tuple(p + new for p in past)}
        profile = {}
        for t in spec.inputs:
            lo, opt, hi = ([], [], [])
            for d in t.shape:
                r = ranges[d] if isinstance(d, str) else (d, d, d)
                lo.append(r[0]), opt.append(r[1]), hi.append(r[2])
            profile[t.name] = (tuple(lo), tuple(opt), tuple(hi))
        profiles.append(profile)
    return profiles


def build_engine(trt, onnx_path: Path, name: str, profiles, timing_cache: bytes, int8: bool):
    """Parse and build one graph; returns ``(plan bytes, timing cache bytes)``."""
    if int8 and not any(n.op_type == "QuantizeLinear" for n in onnx.load(str(onnx_path), load_external_data=False).graph.node):
        raise BuildError(f"{name}: an int8 engine needs a Q/DQ graph (export with --precision int8); "
                         "TensorRT 11 has no implicit calibration")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # strongly typed: TensorRT 11 has no other kind
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)) or "unknown parser error"
        raise BuildError(f"{name}: TensorRT could not parse {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    config.builder_optimization_level = 3
    config.set_timing_cache(config.create_timing_cache(timing_cache), False)
    for ranges in profiles:
        profile = builder.create_optimization_profile()
        for tensor, (lo, opt, hi) in ranges.items():
            profile.set_shape(tensor, lo, opt, hi)
        config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BuildError(f"{name}: TensorRT failed to build the engine (see the TensorRT log above)")
    return bytes(plan), bytes(config.get_timing_cache().serialize())


def build_folder(folder: Path, max_images: int = 8, trt=None) -> dict:
    """Build every graph of ``folder`` into ``folder/tensorrt`` and record the engines in the manifest."""
    trt = trt or import_tensorrt()
    folder = Path(folder)
    manifest = read_manifest(folder)
    verify_files(folder, manifest)
    out = folder / TRT_DIR
    out.mkdir(exist_ok=True)
    cache_path = out / TIMING_CACHE
    timing = cache_path.read_bytes() if cache_path.is_file() else b""
    engines = {}
    for name, entry in manifest["graphs"].items():
        profiles = shape_ranges(manifest, name, max_images)
        plan, timing = build_engine(trt, folder / entry["file"], name, profiles, timing, manifest["precision"] == "int8")
        path = out / f"{name}.plan"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(plan)
        os.replace(tmp, path)
        engines[name] = {"file": f"{TRT_DIR}/{path.name}", "profiles": [
            {k: [list(s) for s in v] for k, v in p.items()} for p in profiles]}
    cache_path.write_bytes(timing)
    manifest["tensorrt"] = {"version": trt.__version__, "max_images": max_images, "engines": engines}
    for entry in engines.values():
        manifest["files"][entry["file"]] = file_record(folder / entry["file"])
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, folder / MANIFEST)
    return manifest
