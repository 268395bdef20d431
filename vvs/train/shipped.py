"""What the shipped weights' recipes share (each family's reproduces its own, ``vvs-train <name>``): the crops they
train on, the held-out crops they are measured on, the tokenizer's measures, and how a shipped file and its record
are written (parameters in fp16, buffers in fp32, sha256 and config in the family's ``shipped*.json``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from vvs.engines.manifest import sha256
from vvs.files import follow_umask
from vvs.models.loading import load_state, read_checkpoint
from vvs.models.vq import VQModel
from vvs.quality import ClassifierConfig, PhotoClassifier
from vvs.train.tokenizer import IMAGE_SIZE, flat_grid_deviation, region_errors, tokenizer_psnr, top_left_excess

TRAIN_CROPS = 5120
HELDOUT_SEED = 1000  # held-out crops are fresh random crops drawn with other seeds


def load_classifier(path) -> PhotoClassifier:
    state, meta = read_checkpoint(path)
    model = PhotoClassifier(ClassifierConfig(**json.loads(meta["vvs_config"])))
    load_state(model, state, path)
    return model.eval()


KIND = {"vq": "vq", "target": "gpt", "drafter": "drafter", "classifier": "classifier"}  # the shipped set's files


@torch.no_grad()
def vq_metrics(vq: VQModel, held_images: torch.Tensor) -> dict:
    """Held-out PSNR through the codes, and whether any corner of a decoded image is special."""
    crops = held_images * 2 - 1
    psnr = tokenizer_psnr(vq, crops)
    flat = flat_grid_deviation(vq, IMAGE_SIZE // vq.config.downsample)
    return {"heldout_psnr_db": float(psnr.mean()), "heldout_psnr_min_db": float(psnr.min()),
            "heldout_top_left_error_excess": top_left_excess(region_errors(vq, crops)),
            "flat_grid_max_corner_deviation": max(v for k, v in flat.items() if k != "centre")}


def ship_model(model, path: Path, kind: str) -> dict:
    """Write one shipped weight file (fp16 parameters, fp32 buffers); returns its record for the shipped json."""
    buffers = {k for k, _ in model.named_buffers()}
    state = {k: (v.half() if k not in buffers and v.is_floating_point() else v) for k, v in model.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: t.contiguous() for k, t in state.items()}, tmp,
              metadata={"vvs_kind": kind, "vvs_config": json.dumps(model.config.to_dict())})
    follow_umask(tmp)
    os.replace(tmp, path)
    return {"file": path.name, "sha256": sha256(path), "bytes": path.stat().st_size, "config": model.config.to_dict()}


def ship_prompt_pair(weights: Path, family: str, models: dict, tokenizer_path: Path, tokenizer_file: str,
                     info: dict) -> Path:
    """Write a prompt family's shipped pair into ``weights``: ``{family}_{role}.safetensors`` for each role of
    ``models`` (``{role: (model, kind)}``), its text tokenizer as ``tokenizer_file``, and ``shipped_{family}.json``
    (``info`` with every file's record)."""
    import shutil

    weights.mkdir(exist_ok=True)
    files = {role: ship_model(model, weights / f"{family}_{role}.safetensors", kind)
             for role, (model, kind) in models.items()}
    shutil.copyfile(tokenizer_path, weights / tokenizer_file)
    files["tokenizer"] = {"file": tokenizer_file, "sha256": sha256(weights / tokenizer_file),
                          "bytes": (weights / tokenizer_file).stat().st_size}
    (weights / f"shipped_{family}.json").write_text(json.dumps({**info, "files": files}, indent=2) + "\n")
    return weights
