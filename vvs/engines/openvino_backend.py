"""OpenVINO backend: one compiled model per graph, read from the folder's ONNX files by OpenVINO's own ONNX
frontend, which takes opset 23 ``Attention`` and ONNX Runtime's ``MatMulNBits`` as they are (weight-only folders
keep their int4 / int8 matrices compressed), so the folders need no conversion.

Inputs and outputs are torch tensors' memory wrapped as OpenVINO tensors, shared rather than copied: the static KV
buffer's per-layer pieces are read where they lie on every call, and outputs land in tensors allocated here. CPU
only (the runtime's own tensors live in host memory); ``--threads`` is OpenVINO's inference thread count.
"""
from __future__ import annotations

import threading
from pathlib import Path

import openvino as ov
import openvino.opset13 as ops
import torch

from vvs.engines.manifest import EngineFolderError, check_onnx_matches_spec, graph_spec, verify_files
from vvs.errors import VVSError
from vvs.export.spec import GraphSpec


class OVEngine:
    def __init__(self, compiled: ov.CompiledModel, spec: GraphSpec):
        self.compiled, self.spec = compiled, spec
        self.inputs = [compiled.input(t.name) for t in spec.graph_inputs]
        self.outputs = [compiled.output(t.name) for t in spec.outputs]
        self.local = threading.local()  # one infer request per calling thread, its tensors set on every call

    def run(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        dims = self.spec.check_inputs(inputs)
        request = getattr(self.local, "request", None)
        if request is None:
            request = self.local.request = self.compiled.create_infer_request()
        feeds = list(self.spec.graph_feeds(inputs).values())  # kept alive until the request returns
        for i, (port, t) in enumerate(zip(self.inputs, feeds)):
            if t.device.type != "cpu" or not t.is_contiguous():
                t = feeds[i] = t.cpu().contiguous()
            request.set_tensor(port, ov.Tensor(t.numpy(), shared_memory=True))
        outputs = {}
        for port, spec in zip(self.outputs, self.spec.outputs):
            shape = [d if isinstance(d, int) else dims[d] for d in spec.shape]
            out = outputs[spec.name] = torch.empty(shape, dtype=spec.torch_dtype)
            request.set_tensor(port, ov.Tensor(out.numpy(), shared_memory=True))
        request.infer()
        return outputs


def check_device(device: str | None) -> torch.device:
    if device is not None and torch.device(device).type != "cpu":
        raise VVSError(f"--backend openvino --device {device}: vvs runs OpenVINO on the CPU; use --device cpu, or "
                       "--backend onnxruntime or tensorrt for a CUDA device")
    return torch.device("cpu")


def compile_config(threads: int | None) -> dict:
    # float32 arithmetic whatever the CPU offers: on CPUs with bf16 units OpenVINO would otherwise compute float32
    # graphs in bf16, and exact modes sample the graphs' own distribution
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    return config


def float_integer_sums(model: ov.Model) -> ov.Model:
    """Every integer ``ReduceSum`` summed in float32 instead (exact: the graphs' integer sums are counts, far below
    2**24). OpenVINO 2026.3-2026.4's CPU plugin fuses the ``+ 1`` after an integer sum into the reduction and then
    gets some rows wrong once a batch passes about 16 images: ``draft_tree``'s tree selection gave parents of -1 and
    -2**31, which the runtime's acceptance indexes with."""
    for node in model.get_ordered_ops():
        if node.get_type_name() == "ReduceSum" and node.get_output_element_type(0).is_integral_number():
            summed = ops.reduce_sum(ops.convert(node.input_value(0), ov.Type.f32), node.input_value(1),
                                    node.get_attributes()["keep_dims"])
            node.output(0).replace(ops.convert(summed, node.get_output_element_type(0)).output(0))
    return model


def open_model(core: ov.Core, path: Path, spec: GraphSpec, threads: int | None = None) -> OVEngine:
    """One graph of an engine folder, checked against its spec."""
    check_onnx_matches_spec(path, spec)
    try:
        compiled = core.compile_model(float_integer_sums(core.read_model(str(path))), "CPU", compile_config(threads))
    except Exception as err:  # OpenVINO raises RuntimeError subclasses of its own for unreadable models
        raise EngineFolderError(f"{path}: OpenVINO cannot load it ({str(err).strip().splitlines()[0]})") from None
    return OVEngine(compiled, spec)


def open_graphs(folder: Path, manifest: dict, names, threads: int | None = None) -> dict:
    """A compiled model for each named graph of an engine folder, after checking every file of the folder."""
    verify_files(folder, manifest)
    core = ov.Core()
    graphs = {}
    for name in names:
        if name not in manifest["graphs"]:
            raise EngineFolderError(f"{folder / 'manifest.json'}: lists no {name} graph; re-export the folder")
        graphs[name] = open_model(core, folder / manifest["graphs"][name]["file"], graph_spec(manifest, name), threads)
    return graphs
