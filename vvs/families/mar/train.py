"""The shipped MAR pair: continuous latents of the photo crops -> a target MAR and a smaller draft MAR.

The continuous tokenizer is the shipped VQ tokenizer without its codebook: the encoder's l2-normalised
pre-quantisation latents, which its decoder reconstructs better than the codes themselves (held-out PSNR in
``shipped_mar.json``), scaled to unit variance as MAR scales KL-16 latents by 0.2325.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from vvs.families.mar.latents import VQLatents
from vvs.families.mar.model import MAR, mar_config, patchify
from vvs.files import follow_umask
from vvs.models.vq import VQModel
from vvs.shipped import shipped_info
from vvs.train.data import balanced_labels, load_photos, random_crops
from vvs.train.loop import Schedule, train
from vvs.train.shipped import HELDOUT_SEED, TRAIN_CROPS  # the same crops as the shipped LlamaGen model


@torch.no_grad()
def latent_scale(vq: VQModel, images: torch.Tensor) -> float:
    """1 / std of the unscaled latents: MAR's diffusion head expects about unit variance."""
    return float(1.0 / VQLatents(vq, 1.0).encode(images).std())


@torch.no_grad()
def encode_crops(tokenizer: VQLatents, num: int, size: int, seed: int, batch: int = 32):
    """``num`` class-balanced random crops -> ``(labels [num], tokens [num, L, C])`` (MAR's raster order)."""
    photos = load_photos()
    gen = torch.Generator().manual_seed(seed)
    labels = balanced_labels(num, len(photos), gen)
    tokens = [patchify(tokenizer.encode(random_crops(photos, labels[i : i + batch], size, gen)), 1)
              for i in range(0, num, batch)]
    return labels, torch.cat(tokens)


def mask_ratio(gen: torch.Generator, low: float) -> float:
    """MAR's masking ratio: a Gaussian at 1.0 (std 0.25) truncated to [low, 1], by inverse CDF."""
    normal = torch.distributions.Normal(0.0, 1.0)
    a = normal.cdf(torch.tensor((low - 1.0) / 0.25))
    u = a + (0.5 - a) * torch.rand((), generator=gen)
    return float(1.0 + 0.25 * normal.icdf(u))


def mar_loss(model: MAR, labels: torch.Tensor, tokens: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """MAR's training objective on one batch: random orders, a random masking ratio, class dropout, and the
    diffusion loss on the masked tokens (each repeated ``diffusion_batch_mul`` times with fresh noise)."""
    c = model.config
    b, n, _ = tokens.shape
    orders = torch.argsort(torch.rand(b, n, generator=gen), dim=1)
    masked = math.ceil(n * mask_ratio(gen, c.mask_ratio_min))
    mask = torch.zeros(b, n, dtype=torch.bool).scatter_(1, orders[:, :masked], True)
    labels = torch.where(torch.rand(b, generator=gen) < c.label_drop_prob, c.null_label, labels)
    z = model(tokens, mask, labels)
    target, cond = tokens[mask], z[mask]
    rep = c.diffusion_batch_mul
    return model.diffloss.loss(target.repeat(rep, 1), cond.repeat(rep, 1), gen).mean()


def train_mar(size: str, labels: torch.Tensor, tokens: torch.Tensor, out_dir: Path, seed: int, steps: int,
              batch: int = 16, lr: float = 1e-3) -> MAR:
    torch.manual_seed(seed)
    model = MAR(mar_config(size))

    def step_fn(step: int, gen: torch.Generator):
        pick = torch.randint(0, len(tokens), (batch,), generator=gen)
        return mar_loss(model, labels[pick], tokens[pick], gen), {}

    train(f"mar_{size}", model, step_fn, Schedule(steps=steps, lr=lr, warmup=100, weight_decay=0.02), out_dir, seed)
    return model


@torch.no_grad()
def heldout_loss(model: MAR, labels: torch.Tensor, tokens: torch.Tensor, seed: int = 0, batch: int = 64) -> float:
    gen = torch.Generator().manual_seed(seed)
    losses = [float(mar_loss(model, labels[i : i + batch], tokens[i : i + batch], gen))
              for i in range(0, len(tokens), batch)]
    return sum(losses) / len(losses)


STEPS = {"target": 1200, "draft": 1500}
SIZES = {"target": "MAR-vvs-S", "draft": "MAR-vvs-XS"}
# MAR's sampler settings for a 256-token image; the shipped model has 16 classes, guidance as MAR-B's 2.9 (linear)
SHIPPED_MAR_DECODING = {"num_iter": 32, "cfg_scale": 3.0, "temperature": 1.0}


@torch.no_grad()
def tokenizer_metrics(vq: VQModel, held: torch.Tensor) -> dict:
    """The latent scale of a VQ tokenizer used as MAR's continuous tokenizer, and its PSNR on held-out crops
    (in [-1, 1]) through the continuous latents and through the (interior) codes."""
    from vvs.train.tokenizer import psnr, tokenizer_psnr

    tokenizer = VQLatents(vq, latent_scale(vq, held))
    return {"latent_scale": tokenizer.scale,
            "heldout_psnr_db_continuous": float(psnr(tokenizer.decode(tokenizer.encode(held)), held).mean()),
            "heldout_psnr_db_codes": float(tokenizer_psnr(vq, held).mean())}


def remeasured_record(vq: VQModel, held: torch.Tensor) -> tuple[str, dict]:
    """``shipped_mar.json`` with its tokenizer's measures taken anew on a retrained decoder (``vvs-train
    decoder``): the pair's latents are the encoder's, which stays frozen, so only the measures change."""
    info = shipped_info("shipped_mar.json")
    info["tokenizer"].update(tokenizer_metrics(vq, held))
    return "shipped_mar.json", info


def reproduce_mar(out_dir: Path, vq_path: Path, seed: int = 0) -> Path:
    """Train the pair on the shipped VQ tokenizer's latents; ``out_dir/weights`` gets the files that ship."""
    import json
    import os
    import time

    from safetensors.torch import load_file, save_file

    from vvs.engines.manifest import sha256
    from vvs.families.mar.loading import load_mar
    from vvs.models.loading import load_vq, save_model
    from vvs.train.classifier import real_crops
    from vvs.train.tokenizer import IMAGE_SIZE

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    started = time.time()
    vq = load_vq(vq_path).float()
    metrics = {"tokenizer": tokenizer_metrics(vq, real_crops(256, HELDOUT_SEED)[0] * 2 - 1)}
    tokenizer = VQLatents(vq, metrics["tokenizer"]["latent_scale"])
    data_path = out_dir / "latents.safetensors"
    if not data_path.is_file():
        labels, tokens = encode_crops(tokenizer, TRAIN_CROPS, IMAGE_SIZE, seed)
        h_labels, h_tokens = encode_crops(tokenizer, 512, IMAGE_SIZE, HELDOUT_SEED + 1)
        save_file({"labels": labels, "tokens": tokens, "heldout_labels": h_labels, "heldout_tokens": h_tokens},
                  data_path)
    data = load_file(data_path)
    models = {}
    for role in ("target", "draft"):
        path = out_dir / f"mar_{role}.safetensors"
        if not path.is_file():
            model = train_mar(SIZES[role], data["labels"], data["tokens"], out_dir, seed, STEPS[role])
            save_model(model, path, "mar")
        models[role] = load_mar(path)
        metrics[role] = {"heldout_loss": heldout_loss(models[role], data["heldout_labels"], data["heldout_tokens"]),
                         "params_millions": sum(p.numel() for p in models[role].parameters()) / 1e6}
    weights = out_dir / "weights"
    weights.mkdir(exist_ok=True)
    files = {}
    for role, model in models.items():
        path = weights / f"mar_{role}.safetensors"
        tmp = path.with_name(path.name + ".tmp")
        save_file({k: v.half().contiguous() for k, v in model.state_dict().items()}, tmp,
                  metadata={"vvs_kind": "mar", "vvs_config": json.dumps(model.config.to_dict())})
        follow_umask(tmp)
        os.replace(tmp, path)
        files[role] = {"file": path.name, "sha256": sha256(path), "bytes": path.stat().st_size,
                       "config": model.config.to_dict(), "metrics": metrics[role]}
    info = {
        "description": "vvs's shipped MAR pair (continuous tokens): a target and a smaller draft MAR trained on CPU "
                       "on the shipped VQ tokenizer's l2-normalised pre-quantisation latents of the same photo crops.",
        "seed": seed,
        "training_seconds": round(time.time() - started, 1),
        "reproduce": f"vvs-train mar --out {out_dir} --seed {seed}",
        "tokenizer": {"kind": "vq-latents", "file": "vq.safetensors", **metrics["tokenizer"]},
        "decoding_defaults": SHIPPED_MAR_DECODING,
        "files": files,
    }
    tmp = weights / "shipped_mar.json.tmp"
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(tmp, weights / "shipped_mar.json")
    return weights
