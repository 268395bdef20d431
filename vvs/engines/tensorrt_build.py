"""Build TensorRT engines from an engine folder's ONNX graphs (``vvs-export --backend tensorrt | tensorrt-rtx``).

Two flavours share the open-source ONNX importer and one build path (Polygraphy's loaders):

- ``tensorrt``: TensorRT 11 for data-centre GPUs (>= 10.14 imports the ONNX ``Attention`` op the graphs use).
  Engines are built on the GPU that runs them, with a timing cache kept beside them.
- ``tensorrt-rtx``: TensorRT for RTX (>= 1.7) for GeForce and RTX PRO GPUs. Engines are built ahead of time on
  any machine, no GPU needed, for chosen compute capabilities, and specialised on the user's GPU when loaded
  (that work is kept in a runtime cache in the engine folder). No timing cache: filling one queries a GPU.

Networks are strongly typed in both (precision comes from the ONNX: fp16 graphs, or Q/DQ nodes for int8; there
are no precision flags and no implicit calibration). Every attention layer is marked decomposable: no fused
kernel covers fp32 attention with an arbitrary mask, and without the fallback to MatMul + Softmax + MatMul the
builder stops. One optimisation profile per shape bucket (:mod:`vvs.engines.buckets`); the manifest records
each flavour's engines, builder version and compute capabilities.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import onnx

from vvs.engines.manifest import (KERNEL, MANIFEST, REWRITTEN, WEIGHT_ONLY, file_record, graph_weights, read_manifest,
                                  verify_files)
from vvs.errors import VVSError
from vvs.families.registry import family_of

TIMING_CACHE = "timing.cache"
RUNTIME_CACHE = "runtime.cache"
WORKSPACE_BYTES = 4 << 30


class BuildError(VVSError):
    pass


@dataclass(frozen=True)
class Flavour:
    name: str  # the --backend value, the manifest key and the engines' subfolder
    module: str
    label: str
    install: str

    @property
    def rtx(self) -> bool:
        return self.name == "tensorrt-rtx"


FLAVOURS = {
    "tensorrt": Flavour("tensorrt", "tensorrt", "TensorRT",
                        "pip install --extra-index-url https://pypi.nvidia.com 'vvs[trt]' on a machine with an NVIDIA "
                        "GPU, or build ahead of time with --backend tensorrt-rtx"),
    "tensorrt-rtx": Flavour("tensorrt-rtx", "tensorrt_rtx", "TensorRT-RTX", "pip install 'vvs[trt-rtx]'"),
}


def flavour(name: str) -> Flavour:
    if name not in FLAVOURS:
        raise VVSError(f"unknown TensorRT flavour {name!r}; choose one of {', '.join(FLAVOURS)}")
    return FLAVOURS[name]


def import_flavour(fl: Flavour):
    """The flavour's Python module, or a one-line error saying how to get it."""
    try:
        return importlib.import_module(fl.module)
    except ImportError:
        raise VVSError(f"{fl.label} is not installed: {fl.install} (or use --backend onnxruntime)") from None


def parse_compute_capabilities(text: str | None) -> list[tuple[int, int]] | None:
    """``"8.6,8.9,12.0"`` -> ``[(8, 6), (8, 9), (12, 0)]``; None keeps the builder's default set."""
    if not text:
        return None
    caps = []
    for part in text.split(","):
        major, dot, minor = part.strip().partition(".")
        if not (dot and major.isdigit() and minor.isdigit()):
            raise VVSError(f"option --compute-capability {part.strip()!r}: write major.minor, e.g. 8.9 or 12.0")
        caps.append((int(major), int(minor)))
    return caps


def check_build_request(backend: str, compute_capabilities) -> tuple[Flavour, object]:
    """Fail early, before any export work: a known flavour, installed, and capabilities only where they apply."""
    fl = flavour(backend)
    if compute_capabilities and not fl.rtx:
        raise VVSError("option --compute-capability: only --backend tensorrt-rtx builds for chosen GPUs; TensorRT "
                       "builds for the GPU it runs on")
    return fl, import_flavour(fl)


def shape_ranges(manifest: dict, name: str, max_images: int) -> list[dict[str, tuple[tuple, tuple, tuple]]]:
    """Per optimisation profile of graph ``name``: input name -> (min, opt, max) shapes, as its family sizes them."""
    return family_of(manifest).call("tensorrt_profiles", manifest, name, max_images)


def profile_of(spec, ranges: dict[str, tuple]) -> dict[str, tuple[tuple, tuple, tuple]]:
    """(min, opt, max) per input: shapes from the ranges of its symbolic dimensions; for a host input, the values
    ``ranges[name]`` gives."""
    profile = {}
    for t in spec.graph_inputs:
        if t.host:
            profile[t.name] = tuple(tuple(v) for v in ranges[t.name])
            continue
        lo, opt, hi = ([], [], [])
        for d in t.shape:
            r = ranges[d] if isinstance(d, str) else (d, d, d)
            lo.append(r[0]), opt.append(r[1]), hi.append(r[2])
        profile[t.name] = (tuple(lo), tuple(opt), tuple(hi))
    return profile


def polygraphy_trt(fl: Flavour):
    """Polygraphy's TensorRT loaders bound to the flavour's module. Polygraphy picks TensorRT or TensorRT-RTX
    once per process, when its TensorRT backend is first imported."""
    from polygraphy import config

    if "polygraphy.backend.trt" in sys.modules:
        if config.USE_TENSORRT_RTX != fl.rtx:
            other = "tensorrt-rtx" if config.USE_TENSORRT_RTX else "tensorrt"
            raise BuildError(f"this process already builds {other} engines; build {fl.name} engines in another one")
    else:
        config.USE_TENSORRT_RTX = fl.rtx
    from polygraphy.backend import trt as ptrt
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR  # the builder's own errors still show
    return ptrt


QUANTIZED_GRAPHS = ("target_prefill", "target_verify")  # the int8 export quantizes the target only


def check_int8(folder: Path, manifest: dict) -> None:
    for name in QUANTIZED_GRAPHS:
        graph = onnx.load(str(folder / manifest["graphs"][name]["file"]), load_external_data=False).graph
        if not any(n.op_type == "QuantizeLinear" for n in graph.node):
            raise BuildError(f"{name}: an int8 engine needs a Q/DQ graph (export with --precision int8); "
                             "TensorRT has no implicit calibration")


# weight-only graphs TensorRT-RTX takes: int4 blocks, and int4-head8's int8 head (vvs writes int8 blocks with
# positive scales, which its parser needs); whole int8 folders and TensorRT 11 were never tried
BUILDS_WEIGHT_ONLY = {"tensorrt-rtx": ("int4", "int4-head8"), "tensorrt": ()}
# TensorRT-RTX 1.7.1's builder stops with an internal error (Myelin, codeGenerator.cpp:2012) on the int4 draft_tree
# graph of more than one tree level: its plan holds the same values as float32 (the drafter only proposes)
FLOAT_COPY = ("draft_tree",)


def check_weight_only(fl: Flavour, manifest: dict) -> None:
    for name in manifest["graphs"]:
        weights = graph_weights(manifest, name)
        if weights in REWRITTEN and weights not in BUILDS_WEIGHT_ONLY[fl.name]:
            option = "--drafter-weights" if name == "draft_tree" else "--weights"
            builds = " or ".join(f"{w} with --backend {f}" for f, ws in BUILDS_WEIGHT_ONLY.items() for w in ws)
            raise BuildError(f"{name}: its {weights} weights are ONNX Runtime's {KERNEL[weights]}, which {fl.label} "
                             f"does not build; export the folder with {option} fp32 (or {builds}) for {fl.label}")


def dequantized_copy(path: Path, out: Path, to_float: bool) -> Path:
    """The graph with its ``MatMulNBits`` as ``DequantizeLinear`` -> ``MatMul`` of the same integers and scales,
    the form TensorRT's parser reads, or as float32 ``MatMul`` of their values
    (:func:`vvs.export.weight_only.dequantize_form`)."""
    from vvs.export.weight_only import dequantize_form

    model = dequantize_form(onnx.load(str(path)), to_float)
    onnx.save_model(model, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out.name + ".data", size_threshold=1024)
    return out


def build_engine(fl: Flavour, onnx_path: Path, name: str, profiles,
                 compute_capabilities: list[tuple[int, int]] | None = None, timing_cache: Path | None = None) -> bytes:
    """Parse and build one graph into a serialized plan."""
    trt = import_flavour(fl)
    ptrt = polygraphy_trt(fl)
    from polygraphy.exception import PolygraphyException

    network = ptrt.SetDecomposableAttentions(ptrt.NetworkFromOnnxPath(str(onnx_path)))
    trt_profiles = []
    for ranges in profiles:
        profile = ptrt.Profile()
        for tensor, (lo, opt, hi) in ranges.items():
            profile.add(tensor, lo, opt, hi)
        trt_profiles.append(profile)
    common = dict(profiles=trt_profiles, builder_optimization_level=3,
                  memory_pool_limits={trt.MemoryPoolType.WORKSPACE: WORKSPACE_BYTES})
    if fl.rtx:
        from polygraphy.backend.tensorrt_rtx import CreateConfigRTX

        config = CreateConfigRTX(compute_capabilities=compute_capabilities, **common)
        cache = None
    else:
        config = ptrt.CreateConfig(load_timing_cache=str(timing_cache) if timing_cache and timing_cache.is_file()
                                   else None, **common)
        cache = str(timing_cache) if timing_cache else None
    try:
        return bytes(ptrt.EngineBytesFromNetwork(network, config, save_timing_cache=cache)())
    except PolygraphyException as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else "see the log above"
        raise BuildError(f"{name}: {fl.label} could not build {onnx_path.name}: {first}") from None


def build_folder(folder: Path, backend: str = "tensorrt", max_images: int = 8,
                 compute_capabilities: list[tuple[int, int]] | None = None, progress=None) -> dict:
    """Build every graph of ``folder`` into ``folder/<flavour>/`` and record the engines in the manifest.
    ``progress(name, seconds, plan_bytes)`` is called after each graph."""
    fl, trt = check_build_request(backend, compute_capabilities)
    folder = Path(folder)
    manifest = read_manifest(folder)
    verify_files(folder, manifest)
    if manifest["precision"] == "int8":
        check_int8(folder, manifest)
    check_weight_only(fl, manifest)
    out = folder / fl.name
    out.mkdir(exist_ok=True)
    engines = {}
    for name, entry in manifest["graphs"].items():
        start = time.perf_counter()
        profiles = shape_ranges(manifest, name, max_images)
        source = folder / entry["file"]
        if graph_weights(manifest, name) in WEIGHT_ONLY:
            source = dequantized_copy(source, out / f"{name}.dq.onnx", name in FLOAT_COPY)
        try:
            plan = build_engine(fl, source, name, profiles, compute_capabilities,
                                None if fl.rtx else out / TIMING_CACHE)
        finally:
            if source.parent == out:  # the DequantizeLinear form is only the builder's input
                for f in (source, source.with_name(source.name + ".data")):
                    f.unlink(missing_ok=True)
        path = out / f"{name}.plan"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(plan)
        os.replace(tmp, path)
        engines[name] = {"file": f"{fl.name}/{path.name}", "seconds": round(time.perf_counter() - start, 1),
                         "profiles": [{k: [list(s) for s in v] for k, v in p.items()} for p in profiles]}
        if progress:
            progress(name, engines[name]["seconds"], len(plan))
    record = {"flavour": fl.name, "version": trt.__version__, "max_images": max_images, "engines": engines}
    if fl.rtx:
        record["compute_capabilities"] = ([f"{a}.{b}" for a, b in compute_capabilities] if compute_capabilities
                                          else "builder default")
    manifest[fl.name] = record
    for entry in engines.values():
        manifest["files"][entry["file"]] = file_record(folder / entry["file"])
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, folder / MANIFEST)
    return manifest
