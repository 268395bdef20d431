"""TensorRT backend (TensorRT 11 or TensorRT-RTX): engines built by :mod:`vvs.engines.tensorrt_build`, run from
torch CUDA tensors.

Tensors are bound by address (``set_tensor_address``), shapes set per call (``set_input_shape``), and every
graph runs with ``execute_async_v3`` on the current torch stream; caches are the runtime's own buffers, read in
place. One execution context per optimisation profile (= shape bucket), so a context's shapes never change and
CUDA graphs can capture it (``cuda_graphs=True``). TensorRT-RTX specialises its engines for the user's GPU on
first use; that work goes to a runtime cache in the engine folder, so later loads skip it. TensorRT is imported
lazily: the base install never needs it.
"""
from __future__ import annotations

import atexit
import importlib.util
import threading
from pathlib import Path

import torch

from vvs.engines.buckets import BucketedEngine
from vvs.engines.tensorrt_build import FLAVOURS, RUNTIME_CACHE, flavour, import_flavour
from vvs.engines.manifest import EngineFolderError, graph_spec, verify_files
from vvs.errors import VVSError
from vvs.export.spec import GraphSpec
from vvs.output import atomic_write


def ready_flavour(manifest: dict) -> str | None:
    """The first flavour whose module is importable and whose engines the folder holds, or None."""
    for fl in FLAVOURS.values():
        if fl.name in manifest and importlib.util.find_spec(fl.module) is not None:
            return fl.name
    return None


class RuntimeCache:
    """TensorRT-RTX's runtime cache, shared by every engine of a folder, written back when the process ends."""

    def __init__(self, path: Path):
        self.path = path
        self.cache = None
        self.blob = path.read_bytes() if path.is_file() else None
        atexit.register(self.save)

    def runtime_config(self, engine):
        config = engine.create_runtime_config()
        if self.cache is None:
            self.cache = config.create_runtime_cache()
            if self.blob is not None:
                self.cache.deserialize(self.blob)  # False on a GPU or driver mismatch: start afresh
        config.set_runtime_cache(self.cache)
        return config

    def save(self) -> None:
        if self.cache is None:
            return
        blob = bytes(self.cache.serialize())
        try:
            atomic_write(self.path, lambda tmp: tmp.write_bytes(blob))
        except VVSError:  # a read-only engine folder only loses the speed-up of the next load
            pass


class TrtEngine:
    def __init__(self, engine, spec: GraphSpec, profiles: list[dict], device: torch.device, runtime_config=None):
        self.spec, self.device = spec, device
        self.engine = engine
        self.lock = threading.Lock()
        self.contexts = []
        self.news = []
        stream = self._stream()
        for index, profile in enumerate(profiles):
            ctx = engine.create_execution_context() if runtime_config is None else \
                engine.create_execution_context(runtime_config)
            ctx.set_optimization_profile_async(index, stream)
            self.contexts.append(ctx)
            self.news.append(profile["input_ids"][0][1] if "input_ids" in profile else None)

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0

    def context_for(self, new: int | None):
        if new is None or self.news == [None]:
            return self.contexts[0]
        try:
            return self.contexts[self.news.index(new)]
        except ValueError:
            raise EngineFolderError(f"{self.spec.name}: no TensorRT profile for {new} new positions "
                                    f"(built for {self.news}); rebuild the engines") from None

    def run(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        with self.lock:  # a context holds one set of shapes and addresses at a time
            return self._run(inputs)

    def _run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        dims = self.spec.check_inputs(inputs)
        ctx = self.context_for(inputs["input_ids"].shape[1] if "input_ids" in inputs else None)
        keep = []
        feeds = self.spec.graph_feeds(inputs)
        for spec in self.spec.graph_inputs:
            t = feeds[spec.name].to("cpu" if spec.host else self.device).contiguous()  # shape tensors: host memory
            keep.append(t)
            ctx.set_input_shape(spec.name, tuple(t.shape))
            ctx.set_tensor_address(spec.name, t.data_ptr())
        outputs = {}
        for spec in self.spec.outputs:
            out = torch.empty([d if isinstance(d, int) else dims[d] for d in spec.shape], dtype=spec.torch_dtype,
                              device=self.device)
            ctx.set_tensor_address(spec.name, out.data_ptr())
            outputs[spec.name] = out
        if not ctx.execute_async_v3(self._stream()):
            raise RuntimeError(f"{self.spec.name}: TensorRT execution failed")
        return outputs


def open_plans(folder: Path, manifest: dict, names, device: torch.device, backend: str = "tensorrt",
               trt=None) -> tuple[dict, RuntimeCache | None]:
    """An engine for each named graph of a folder's ``backend`` plans (bucketed by their ``new`` profiles), and
    TensorRT-RTX's runtime cache, whose ``save`` persists what the GPU specialisation learnt."""
    fl = flavour(backend)
    trt = trt or import_flavour(fl)
    built = manifest.get(fl.name)
    if not built:
        others = [f"{FLAVOURS[k].label} engines (--backend {k})" for k in FLAVOURS if k in manifest]
        has = f" (it has {', '.join(others)})" if others else ""
        raise EngineFolderError(f"{folder}: holds no {fl.label} engines{has}; build them with "
                                f"vvs-export --backend {fl.name} --out {folder}")
    if built["version"] != trt.__version__:
        raise EngineFolderError(f"{folder}: engines were built with {fl.label} {built['version']} but "
                                f"{trt.__version__} is installed; rebuild them (vvs-export --backend {fl.name})")
    verify_files(folder, manifest)
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    cache = RuntimeCache(folder / fl.name / RUNTIME_CACHE) if fl.rtx else None
    graphs = {}
    for name in names:
        entry = built["engines"][name]
        engine = runtime.deserialize_cuda_engine((folder / entry["file"]).read_bytes())
        if engine is None:
            raise EngineFolderError(f"{folder / entry['file']}: {fl.label} could not deserialize it (built for "
                                    "another GPU or version?); rebuild the engines")
        profiles = [{k: [tuple(s) for s in v] for k, v in p.items()} for p in entry["profiles"]]
        inner = TrtEngine(engine, graph_spec(manifest, name), profiles, device,
                          cache.runtime_config(engine) if cache else None)
        news = [n for n in inner.news if n is not None]
        graphs[name] = BucketedEngine(inner, news) if news else inner
    return graphs, cache
