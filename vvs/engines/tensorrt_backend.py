"""TensorRT 11 backend (imported lazily; TensorRT is never a dependency of the base install)."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def tensorrt_ready(folder: str | Path) -> bool:
    """True when TensorRT is importable and the folder holds built engines."""
    return importlib.util.find_spec("tensorrt") is not None and (Path(folder) / "tensorrt").is_dir()
