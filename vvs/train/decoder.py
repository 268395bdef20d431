"""Re-ship a tokenizer with a retrained decoder: how the shipped tokenizer lost its corner blob, and then learnt to
decode the interior codes its generators are trained on.

The encoder and codebook stay frozen, so the continuous latents (and the MAR pair trained on them) stay valid;
the code pairs are retrained on the interior codes (``vvs-train all``, ``vvs-train t2i``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from vvs.engines.manifest import sha256
from vvs.families.registry import FAMILIES
from vvs.models.loading import load_vq, save_model
from vvs.shipped import shipped_info
from vvs.train.classifier import real_crops
from vvs.train.shipped import HELDOUT_SEED, KIND, ship_model, vq_metrics
from vvs.train.tokenizer import train_decoder


def reship_decoder(out_dir: Path, vq_path: Path, seed: int, steps: int = 2400) -> Path:
    """Retrain the decoder of the tokenizer in ``vq_path`` with reflection padding. Writes
    ``out_dir/weights/``: ``vq.safetensors`` (shipped format) and copies of the shipped ``shipped.json`` and of the
    records of the pairs that measure the tokenizer (``shipped_mar.json``), whose tokenizer entries describe it."""
    out_dir = Path(out_dir)
    torch.set_num_threads(os.cpu_count() or 1)
    path = out_dir / "vq.safetensors"
    if path.is_file():
        vq = load_vq(path)
    else:
        vq = train_decoder(load_vq(vq_path).float(), out_dir, seed, steps)
        save_model(vq, path, KIND["vq"])
    vq.eval()
    weights = out_dir / "weights"
    weights.mkdir(exist_ok=True)

    held_images = real_crops(256, HELDOUT_SEED)[0]
    info = shipped_info()
    # Retraining the shipped tokenizer extends its record of decoder runs; any other tokenizer starts a new one.
    earlier = info.get("decoder", []) if sha256(vq_path) == info["files"]["vq"]["sha256"] else []
    metrics = {**info["files"]["vq"]["metrics"], **vq_metrics(vq, held_images)}
    info["files"]["vq"] = {**ship_model(vq, weights / "vq.safetensors", KIND["vq"]), "metrics": metrics}
    info["decoder"] = [*earlier, {"retrained_from_sha256": sha256(vq_path), "seed": seed, "steps": steps,
                                  "reproduce": f"vvs-train decoder --vq VQ --out {out_dir} --seed {seed} "
                                               f"--steps {steps} (VQ: the file of that sha256)"}]
    records = {"shipped.json": info}
    for family in FAMILIES.values():  # the pairs trained on this tokenizer whose records measure it (MAR's)
        if family.remeasure_tokenizer is not None:
            name, record = family.call("remeasure_tokenizer", vq, held_images * 2 - 1)
            records[name] = record
    for name, content in records.items():
        tmp = weights / f"{name}.tmp"
        tmp.write_text(json.dumps(content, indent=2) + "\n")
        os.replace(tmp, weights / name)
    return weights
