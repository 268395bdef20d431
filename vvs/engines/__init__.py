"""Backends behind one interface (:class:`~vvs.engines.base.EngineSet`): torch, ONNX Runtime, TensorRT."""
from __future__ import annotations

from pathlib import Path

import torch

from vvs.engines.base import EngineSet
from vvs.errors import VVSError

BACKENDS = ("auto", "onnxruntime", "torch", "tensorrt", "tensorrt-rtx")


def load_engines(folder: str | Path, backend: str = "auto", device: str | None = None,
                 threads: int | None = None, cuda_graphs: bool = False) -> EngineSet:
    """Open an engine folder with a backend. ``auto``: TensorRT (then TensorRT-RTX) engines if built and the
    module is installed, else ONNX Runtime (CUDA when onnxruntime-gpu and a GPU are present, else CPU)."""
    if backend not in BACKENDS:
        raise VVSError(f"option backend={backend!r}: choose one of {', '.join(BACKENDS)}")
    check_device(device)
    from vvs.engines.manifest import is_mar, read_manifest

    if is_mar(read_manifest(Path(folder))):
        from vvs.engines.mar import load_mar_folder

        return load_mar_folder(folder, "onnxruntime" if backend == "auto" else backend, device, threads)
    if backend == "auto":
        from vvs.engines.tensorrt_backend import ready_flavour

        backend = ready_flavour(folder) or "onnxruntime"
    if backend in ("tensorrt", "tensorrt-rtx"):
        from vvs.engines.tensorrt_backend import load_tensorrt

        if device is None and not torch.cuda.is_available():
            raise VVSError(f"--backend {backend}: TensorRT plans run on an NVIDIA GPU and none is available here; "
                           "use --backend onnxruntime")
        return load_tensorrt(folder, device or "cuda", cuda_graphs=cuda_graphs, backend=backend)
    if backend == "torch":
        from vvs.engines.torch_backend import load_torch_folder

        return load_torch_folder(folder, device or ("cuda" if torch.cuda.is_available() else "cpu"),
                                 threads=threads, cuda_graphs=cuda_graphs)
    from vvs.engines.onnxruntime_backend import load_onnxruntime

    import onnxruntime as ort

    default = "cuda" if torch.cuda.is_available() and "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"
    return load_onnxruntime(folder, device or default, threads=threads)


def check_device(device: str | None) -> None:
    if device is None:
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise VVSError(f"option --device {device!r}: not a device vvs runs on; use cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise VVSError(f"option --device {device}: no CUDA device is available here; use --device cpu")


__all__ = ["BACKENDS", "EngineSet", "load_engines"]
