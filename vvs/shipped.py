"""The weights vvs ships (``vvs/weights/``): every family's shipped models and their records, by name.

One lookup for every family, the tools and the training recipes, so a shipped file has one name wherever it is
read."""
from __future__ import annotations

import json
from pathlib import Path

from vvs.errors import VVSError

SHIPPED_DIR = Path(__file__).resolve().parent / "weights"
SHIPPED = {"target": "target.safetensors", "drafter": "drafter.safetensors", "vq": "vq.safetensors",
           "t2i_target": "t2i_target.safetensors", "t2i_drafter": "t2i_drafter.safetensors",
           "text_encoder": "text_encoder/model.safetensors", "janus_target": "janus_target.safetensors",
           "janus_drafter": "janus_drafter.safetensors", "janus_tokenizer": "janus_tokenizer.json",
           "lumina_target": "lumina_target.safetensors", "lumina_drafter": "lumina_drafter.safetensors",
           "lumina_vqgan": "lumina_vqgan.safetensors", "lumina_tokenizer": "lumina_tokenizer.json"}


def shipped_info(name: str = "shipped.json") -> dict:
    """``shipped.json``: configs, classes, licences, metrics and sha256 of the shipped weights
    (``shipped_t2i.json``: the text-to-image pair's; ``shipped_janus.json``, ``shipped_lumina.json``,
    ``shipped_mar.json``: the Janus-Pro, Lumina-mGPT and MAR pairs')."""
    path = SHIPPED_DIR / name
    if not path.is_file():
        raise VVSError(f"{path}: missing; reinstall vvs")
    return json.loads(path.read_text())


def shipped_path(name: str) -> Path:
    path = SHIPPED_DIR / SHIPPED[name]
    if not path.is_file():
        raise VVSError(f"the shipped {name} weights are missing ({path}); reinstall vvs or pass the file explicitly")
    return path


def shipped_text_encoder() -> Path:
    """The shipped text-to-image pair's T5 encoder folder (config.json, model.safetensors, tokenizer.json)."""
    return shipped_path("text_encoder").parent
