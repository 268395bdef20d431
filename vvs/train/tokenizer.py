"""Stage 1: the VQ tokenizer (LlamaGen VQ architecture, small width, 16 x 16 tokens for 128 px images).

Trained first on 64 x 64 patches cut from 128 px crops (the pixel statistics of the images it will encode, at a
quarter of the cost), then briefly on whole 128 px crops so that borders and the attention blocks see the
16 x 16 latent grid they work on at inference. Codes unused for a while are restarted on random encoder
outputs, which keeps most of the codebook alive.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from vvs.models.vq import VQModel, vq_config
from vvs.train.data import load_photos, random_crops
from vvs.train.loop import Schedule, train

IMAGE_SIZE = 128
PATCH = 64


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR in dB of images in [-1, 1]."""
    mse = ((a.clamp(-1, 1) - b) ** 2).flatten(1).mean(1) / 4.0  # as if both were in [0, 1]
    return -10 * torch.log10(mse.clamp_min(1e-10))


def train_tokenizer(out_dir: Path, seed: int, steps: int = 3000, batch: int = 16, full_steps: int = 300,
                    full_batch: int = 8, restart_every: int = 100) -> VQModel:
    photos = load_photos()
    torch.manual_seed(seed)
    vq = VQModel(vq_config("VQ-vvs-S"))
    size = vq.config.codebook_size
    usage = torch.zeros(size)
    recent: dict[str, torch.Tensor] = {}

    def step_fn(step: int, gen: torch.Generator, patch: int = PATCH, size: int = batch):
        labels = torch.randint(0, len(photos), (size,), generator=gen)
        crops = random_crops(photos, labels, IMAGE_SIZE, gen)
        top, left = (int(torch.randint(0, IMAGE_SIZE - patch + 1, (1,), generator=gen)) for _ in range(2))
        x = crops[:, :, top : top + patch, left : left + patch]
        h = vq.quant_conv(vq.encoder(x))
        q = vq.quantize(h)
        recon = vq.decode(q.z_q)
        l1 = (recon - x).abs().mean()
        loss = l1 + F.mse_loss(recon, x) + q.codebook_loss + q.commit_loss
        usage.index_add_(0, q.indices.flatten(), torch.ones(q.indices.numel()))
        recent["z"] = F.normalize(h.detach().permute(0, 2, 3, 1).reshape(-1, h.shape[1]), dim=-1)
        recent["gen"] = gen
        return loss, {"l1": float(l1), "psnr": float(psnr(recon.detach(), x).mean())}

    def restart_dead_codes(step: int):
        if (step + 1) % restart_every:
            return
        dead = (usage == 0).nonzero().flatten()
        if len(dead):
            z = recent["z"]
            pick = torch.randint(0, len(z), (len(dead),), generator=recent["gen"])
            with torch.no_grad():
                vq.quantize.embedding.weight[dead] = z[pick]
        usage.zero_()

    train("tokenizer", vq, step_fn, Schedule(steps=steps, lr=4e-4, warmup=100, betas=(0.9, 0.99)),
          out_dir, seed, after_step=restart_dead_codes)
    train("tokenizer_full", vq, lambda step, gen: step_fn(step, gen, IMAGE_SIZE, full_batch),
          Schedule(steps=full_steps, lr=1e-4, warmup=20, betas=(0.9, 0.99)), out_dir, seed + 1,
          checkpoint_every=100, after_step=restart_dead_codes)
    return vq


@torch.no_grad()
def tokenizer_psnr(vq: VQModel, crops: torch.Tensor, batch: int = 32) -> torch.Tensor:
    """PSNR (dB) of each crop's reconstruction through the codebook (encode -> indices -> decode_codes)."""
    out = []
    for i in range(0, len(crops), batch):
        x = crops[i : i + batch]
        q = vq.encode(x)
        grid = x.shape[-1] // vq.config.downsample
        recon = vq.decode_codes(q.indices, grid) * 2 - 1
        out.append(psnr(recon, x))
    return torch.cat(out)
