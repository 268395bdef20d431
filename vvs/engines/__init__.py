"""Backends behind one interface (:class:`~vvs.engines.base.Engine`): torch, ONNX Runtime, OpenVINO, TensorRT."""
from __future__ import annotations

from pathlib import Path

import torch

from vvs.errors import VVSError

BACKENDS = ("auto", "onnxruntime", "openvino", "torch", "tensorrt", "tensorrt-rtx")


def load_engines(folder: str | Path, backend: str = "auto", device: str | None = None,
                 threads: int | None = None, cuda_graphs: bool = False):
    """Open an engine folder with a backend, through its family's engine loader (the manifest names the family).
    ``auto``: the fastest backend the folder and this machine have."""
    from vvs.engines.manifest import read_manifest
    from vvs.families.registry import family_of

    folder = Path(folder)
    manifest = read_manifest(folder)
    check_backend(manifest, backend, device)
    return family_of(manifest).call("load_engines", folder, manifest, backend, device, threads, cuda_graphs)


def check_backend(manifest: dict, backend: str, device: str | None) -> None:
    """Whether this machine can run the folder on ``backend`` and ``device``, known before anything is loaded (a
    scale run would otherwise inflate a 7B model first)."""
    from vvs.families.registry import family_of

    if backend not in BACKENDS:
        raise VVSError(f"option backend={backend!r}: choose one of {', '.join(BACKENDS)}")
    check_device(device)
    family = family_of(manifest)
    if backend != "auto" and backend not in family.run_backends:
        raise VVSError(f"--backend {backend}: {family.label} folders run on {', '.join(family.run_backends)}"
                       + (f" ({family.instead[f'run {backend}']})" if f"run {backend}" in family.instead else ""))
    if backend.startswith("tensorrt") and not torch.cuda.is_available():
        raise VVSError(f"--backend {backend}: TensorRT plans run on an NVIDIA GPU and none is available here; "
                       "use --backend onnxruntime")


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


__all__ = ["BACKENDS", "check_backend", "load_engines"]
