"""ONNX Runtime backend: one session per graph, created once per engine folder.

Inputs and outputs are bound by address (IOBinding) to torch tensors: the static KV buffers the runtime owns
are read in place on every call, and outputs land in tensors allocated here, so nothing is copied between
torch and ONNX Runtime. CPU execution provider, or CUDA when ``onnxruntime-gpu`` is installed and asked for.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from vvs.engines.manifest import EngineFolderError, check_onnx_matches_spec, graph_spec, verify_files
from vvs.export.spec import GraphSpec

NUMPY = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.bool: np.bool_}


class OrtEngine:
    def __init__(self, session: ort.InferenceSession, spec: GraphSpec, device: torch.device):
        self.session, self.spec, self.device = session, spec, device
        self.device_type = "cuda" if device.type == "cuda" else "cpu"
        self.device_id = device.index or 0
        self.local = threading.local()  # one binding per calling thread, rebound on every call

    def run(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        dims = self.spec.check_inputs(inputs)
        io = getattr(self.local, "io", None)
        if io is None:
            io = self.local.io = self.session.io_binding()
        where = (self.device_type, self.device_id)
        feeds = self.spec.graph_feeds(inputs)
        for name, t in feeds.items():
            if t.device != self.device or not t.is_contiguous():
                t = feeds[name] = t.to(self.device).contiguous()  # kept alive until the run returns
            io.bind_input(name, *where, NUMPY[t.dtype], t.shape, t.data_ptr())
        outputs = {}
        for spec in self.spec.outputs:
            shape = [d if isinstance(d, int) else dims[d] for d in spec.shape]
            out = outputs[spec.name] = torch.empty(shape, dtype=spec.torch_dtype, device=self.device)
            io.bind_output(spec.name, *where, NUMPY[out.dtype], shape, out.data_ptr())
        self.session.run_with_iobinding(io)
        return outputs


def providers_for(device: torch.device) -> list:
    if device.type == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise EngineFolderError("device cuda needs onnxruntime-gpu (pip install 'vvs[gpu]' after uninstalling onnxruntime)")
        return [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def session_options(threads: int | None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3
    # ORT's worker threads otherwise spin after every run and starve the runtime's own (torch) tensor code
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def open_session(path: Path, spec: GraphSpec, device: torch.device, threads: int | None = None,
                 options: ort.SessionOptions | None = None) -> OrtEngine:
    """One graph of an engine folder, checked against its spec."""
    check_onnx_matches_spec(path, spec)
    try:
        session = ort.InferenceSession(str(path), options or session_options(threads), providers=providers_for(device))
    except Exception as err:  # ORT raises its own exception types for unreadable models
        raise EngineFolderError(f"{path}: ONNX Runtime cannot load it ({str(err).splitlines()[0]})") from None
    if device.type == "cuda" and "CUDAExecutionProvider" not in session.get_providers():
        raise EngineFolderError(f"{path}: the CUDA execution provider did not load (check CUDA 13 / cuDNN 9)")
    return OrtEngine(session, spec, device)


def open_graphs(folder: Path, manifest: dict, names, device: torch.device, threads: int | None = None) -> dict:
    """A session for each named graph of an engine folder, after checking every file of the folder."""
    verify_files(folder, manifest)
    options = session_options(threads)
    graphs = {}
    for name in names:
        if name not in manifest["graphs"]:
            raise EngineFolderError(f"{folder / 'manifest.json'}: lists no {name} graph; re-export the folder")
        graphs[name] = open_session(folder / manifest["graphs"][name]["file"], graph_spec(manifest, name), device,
                                    options=options)
    return graphs
