"""Reproduce the shipped model set (``vvs-train all``): tokenizer -> tokenized crops -> LlamaGen's class-conditional
target -> drafter -> classifier -> weights.

Every stage writes its result into ``out_dir`` and is skipped when that result exists; inside a stage,
training resumes from its last checkpoint. ``out_dir/weights`` finally holds the files that ship in
``vvs/weights`` (parameters in fp16, buffers in fp32) with ``shipped.json`` describing them.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vvs.discrete.loading import load_drafter
from vvs.discrete.train_data import tokenize_crops
from vvs.discrete.train_drafter import drafter_batch, drafter_loss, train_drafter
from vvs.families.llamagen.gpt import GPT
from vvs.families.llamagen.loading import load_gpt
from vvs.families.llamagen.train_target import train_target
from vvs.models.loading import load_vq, save_model
from vvs.quality import sequence_nll
from vvs.train.classifier import accuracy, real_crops, train_classifier
from vvs.train.data import PHOTOS
from vvs.train.loop import plot_curves
from vvs.train.shipped import HELDOUT_SEED, KIND, TRAIN_CROPS, load_classifier, ship_model, vq_metrics
from vvs.train.tokenizer import IMAGE_SIZE, train_tokenizer

# Decoding defaults for the shipped model (its vocabulary is 1024, so LlamaGen's top-k 1000 filters nothing).
SHIPPED_DECODING = {"cfg_scale": 3.0, "top_k": 0, "lantern_k": 32}


def _stage(out_dir: Path, name: str, build, load):
    path = out_dir / f"{name}.safetensors"
    if path.is_file():
        return load(path)
    model = build()
    save_model(model, path, KIND[name])
    return model


def reproduce(out_dir: Path, seed: int = 0) -> Path:
    """Run every stage whose result ``out_dir`` lacks."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    started = time.time()
    metrics: dict[str, dict] = {}

    vq = _stage(out_dir, "vq", lambda: train_tokenizer(out_dir, seed), lambda p: load_vq(p))
    vq.eval()
    held_images, held_labels = real_crops(256, HELDOUT_SEED)
    metrics["vq"] = vq_metrics(vq, held_images)

    tokens_path = out_dir / "tokens.safetensors"
    if not tokens_path.is_file():
        labels, tokens = tokenize_crops(vq, TRAIN_CROPS, IMAGE_SIZE, seed)
        h_labels, h_tokens = tokenize_crops(vq, 512, IMAGE_SIZE, HELDOUT_SEED + 1)
        save_file({"labels": labels, "tokens": tokens, "heldout_labels": h_labels, "heldout_tokens": h_tokens},
                  tokens_path)
    data = load_file(tokens_path)
    metrics["vq"]["codes_used"] = int(torch.unique(data["tokens"]).numel())

    target = _stage(out_dir, "target", lambda: train_target(data["labels"], data["tokens"], out_dir, seed),
                    lambda p: load_gpt(p))
    metrics["target"] = {"heldout_nll": float(sequence_nll(target, data["heldout_labels"], data["heldout_tokens"]).mean()),
                         "params_millions": sum(p.numel() for p in target.parameters()) / 1e6}

    drafter = _stage(out_dir, "drafter",
                     lambda: train_drafter(target, data["labels"], data["tokens"], out_dir, seed, steps=1200),
                     lambda p: load_drafter(p, target.config))
    metrics["drafter"] = {"heldout_top1_agreement": _drafter_agreement(target, drafter, data),
                          "params_millions": sum(p.numel() for p in drafter.parameters() if p.requires_grad) / 1e6}

    classifier = _stage(out_dir, "classifier", lambda: train_classifier(out_dir, seed), load_classifier)
    metrics["classifier"] = {"heldout_accuracy": accuracy(classifier, held_images, held_labels)}

    logs = {}
    for name in ("tokenizer", "tokenizer_full", "tokenizer_decoder", "target", "drafter", "classifier"):
        log = out_dir / f"{name}.log.jsonl"
        if log.is_file():
            logs[name] = [json.loads(line) for line in log.read_text().splitlines()]
    if logs:
        plot_curves(logs, out_dir / "training_curves.png")
    return ship(out_dir, {"vq": vq, "target": target, "drafter": drafter, "classifier": classifier}, metrics,
                seed, time.time() - started)


@torch.no_grad()
def _drafter_agreement(target: GPT, drafter, data) -> float:
    gen = torch.Generator().manual_seed(0)
    labels, tokens = data["heldout_labels"][:128], data["heldout_tokens"][:128]
    ids, pos, feats, goals = drafter_batch(target, labels, tokens, 0.0, gen)
    _, m = drafter_loss(drafter, target.head, ids, pos, feats, goals, target.config.cls_token_num - 1, 0.0, gen)
    return m["top1_agreement"]


def ship(out_dir: Path, models: dict, metrics: dict, seed: int, seconds: float) -> Path:
    """Write ``out_dir/weights``: fp16 parameters, fp32 buffers, and ``shipped.json``."""
    weights = out_dir / "weights"
    weights.mkdir(exist_ok=True)
    files = {name: {**ship_model(model, weights / f"{name}.safetensors", KIND[name]), "metrics": metrics.get(name, {})}
             for name, model in models.items()}
    info = {
        "description": "vvs's shipped model set: a LlamaGen-architecture VQ tokenizer, class-conditional target "
                       "and EAGLE drafter, plus the photo classifier of the quality instruments, trained on CPU "
                       "from photographs bundled with scikit-image, scikit-learn and matplotlib.",
        "seed": seed,
        "training_seconds": round(seconds, 1),
        "reproduce": f"vvs-train all --out {out_dir} --seed {seed}",
        "classes": [{"id": i, "name": p.name, "source": p.source, "licence": p.licence} for i, p in enumerate(PHOTOS)],
        "image_size": IMAGE_SIZE,
        "decoding_defaults": SHIPPED_DECODING,
        "files": files,
    }
    tmp = weights / "shipped.json.tmp"
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(tmp, weights / "shipped.json")
    return weights
