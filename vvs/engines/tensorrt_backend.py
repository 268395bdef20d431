"""TensorRT 11 backend: engines built by :mod:`vvs.engines.tensorrt_build`, run from torch CUDA tensors.

Tensors are bound by address (``set_tensor_address``), shapes set per call (``set_input_shape``), and every
graph runs with ``execute_async_v3`` on the current torch stream; caches are the runtime's own buffers, read in
place. One execution context per optimisation profile (= shape bucket), so a context's shapes never change and
CUDA graphs can capture it (``cuda_graphs=True``). TensorRT is imported lazily: the base install never needs it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from vvs.engines.base import GRAPHS, EngineSet
from vvs.engines.buckets import BucketedEngine
from vvs.engines.tensorrt_build import TRT_DIR, import_tensorrt
from vvs.engines.manifest import EngineFolderError, engine_set, graph_spec, read_manifest, verify_files
from vvs.export.spec import GraphSpec



def tensorrt_ready(folder: str | Path) -> bool:
    """True when TensorRT is importable and the folder holds built engines."""
    return importlib.util.find_spec("tensorrt") is not None and (Path(folder) / TRT_DIR).is_dir()


class TrtEngine:
    def __init__(self, trt, engine, spec: GraphSpec, profiles: list[dict], device: torch.device):
        self.spec, self.device = spec, device
        self.engine = engine
        self.contexts = []
        self.news = []
        stream = self._stream()
        for index, profile in enumerate(profiles):
            ctx = engine.create_execution_context()
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
        dims = self.spec.check_inputs(inputs)
        ctx = self.context_for(inputs["input_ids"].shape[1] if "input_ids" in inputs else None)
        keep = []
        for spec in self.spec.inputs:
            t = inputs[spec.name].to(self.device).contiguous()
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


def load_tensorrt(folder: str | Path, device: str = "cuda", cuda_graphs: bool = False, trt=None) -> EngineSet:
    trt = trt or import_tensorrt()
    folder = Path(folder)
    device = torch.device(device)
    manifest = read_manifest(folder)
    built = manifest.get("tensorrt")
    if not built:
        raise EngineFolderError(f"{folder}: holds no TensorRT engines; build them with "
                                f"vvs-export --backend tensorrt --out {folder}")
    if built["version"] != trt.__version__:
        raise EngineFolderError(f"{folder}: engines were built with TensorRT {built['version']} but "
                                f"{trt.__version__} is installed; rebuild them (vvs-export --backend tensorrt)")
    verify_files(folder, manifest)
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    graphs = {}
    for name in GRAPHS:
        entry = built["engines"][name]
        engine = runtime.deserialize_cuda_engine((folder / entry["file"]).read_bytes())
        if engine is None:
            raise EngineFolderError(f"{folder / entry['file']}: TensorRT could not deserialize it; rebuild the engines")
        profiles = [{k: [tuple(s) for s in v] for k, v in p.items()} for p in entry["profiles"]]
        inner = TrtEngine(trt, engine, graph_spec(manifest, name), profiles, device)
        news = [n for n in inner.news if n is not None]
        graphs[name] = BucketedEngine(inner, news) if news else inner
    engines = engine_set("tensorrt", folder, manifest, graphs, device)
    if cuda_graphs:
        from vvs.engines.cuda_graphs import GraphedEngine

        for name in ("target_verify", "drafter_step"):
            bucketed = engines.graphs[name]
            bucketed.inner = GraphedEngine(bucketed.inner)
        engines.backend += "+cuda-graphs"
    return engines
