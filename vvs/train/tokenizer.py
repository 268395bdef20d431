"""Stage 1: the VQ tokenizer (LlamaGen VQ architecture, small width, 16 x 16 tokens for 128 px images).

Trained first on 64 x 64 patches cut from 128 px crops (the pixel statistics of the images it will encode, at a
quarter of the cost), then briefly on whole 128 px crops so that borders and the attention blocks see the
16 x 16 latent grid they work on at inference. Codes unused for a while are restarted on random encoder
outputs, which keeps most of the codebook alive.

The codes are learnt with LlamaGen's zero-padded decoder. That decoder learnt position from the zero border and
painted a blob into the top-left corner of every image, so a last stage freezes encoder and codebook and retrains
the decoder with reflection padding on whole crops, from both their interior codes (``interior_codes``: what the
generators learn from) and the continuous latents (the MAR pair decodes those).
"""
from __future__ import annotations

from dataclasses import replace
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
    vq = VQModel(vq_config("VQ-vvs-S", decoder_padding="zeros"))
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
    return train_decoder(vq, out_dir, seed + 2)


def train_decoder(codes_from: VQModel, out_dir: Path, seed: int, steps: int = 2400, batch: int = 8,
                  latent_fraction: float = 0.5) -> VQModel:
    """A reflection-padded decoder for ``codes_from``'s frozen encoder and codebook, trained on whole crops from
    their interior codes (the codes the generators learn from) and, for ``latent_fraction`` of the images, their
    l2-normalised continuous latents (which the MAR pair generates). Starts from ``codes_from``'s decoder."""
    photos = load_photos()
    vq = VQModel(replace(codes_from.config, decoder_padding="reflect"))
    vq.load_state_dict(codes_from.state_dict())  # padding has no weights: the zero-padded decoder is the start
    for module in (vq.encoder, vq.quant_conv, vq.quantize):
        module.requires_grad_(False)

    def step_fn(step: int, gen: torch.Generator):
        labels = torch.randint(0, len(photos), (batch,), generator=gen)
        x = random_crops(photos, labels, IMAGE_SIZE, gen)
        with torch.no_grad():
            latents = F.normalize(vq.quant_conv(vq.encoder(x)), dim=1)
            codes = vq.embed_codes(interior_codes(vq, x), latents.shape[-1])
            continuous = torch.rand(batch, generator=gen) < latent_fraction
            z = torch.where(continuous[:, None, None, None], latents, codes)
        recon = vq.decode(z)
        l1 = (recon - x).abs().mean()
        return l1 + F.mse_loss(recon, x), {"l1": float(l1), "psnr": float(psnr(recon.detach(), x).mean())}

    train("tokenizer_decoder", vq, step_fn, Schedule(steps=steps, lr=2e-4, warmup=50, betas=(0.9, 0.99)),
          out_dir, seed, checkpoint_every=100)
    return vq


# The codes the generators learn from. The encoder pads with zeros and attends over the whole grid, so it has learnt
# where its input's border is: the third and fourth rows of cells (most at the left) get codes it uses elsewhere
# for other colours, and a target trained on them paints specks there. Encoding each crop inside a canvas four cells
# wider on every side, the crop mirrored outwards, puts those cells outside the crop; only the crop's own cells are
# kept. The encoder and codebook are unchanged; the decoder is trained on these codes.
CANVAS_MARGIN_PX = 32


@torch.no_grad()
def interior_codes(vq: VQModel, crops: torch.Tensor, margin: int = CANVAS_MARGIN_PX) -> torch.Tensor:
    """Token ids ``[B, (H / downsample) ** 2]`` of crops in [-1, 1], each encoded inside its reflection-padded canvas
    (``margin`` px on every side, a multiple of the downsampling factor)."""
    down = vq.config.downsample
    if margin % down:
        raise ValueError(f"the canvas margin must be a multiple of the downsampling factor {down}, not {margin}")
    canvas = F.pad(crops, (margin,) * 4, mode="reflect")
    side, cut = canvas.shape[-1] // down, margin // down
    grid = vq.encode(canvas).indices.view(len(crops), side, side)
    return grid[:, cut : side - cut, cut : side - cut].reshape(len(crops), -1)


@torch.no_grad()
def tokenizer_psnr(vq: VQModel, crops: torch.Tensor, batch: int = 32) -> torch.Tensor:
    """PSNR (dB) of each crop's reconstruction through its interior codes (``interior_codes`` -> ``decode_codes``)."""
    out = []
    for i in range(0, len(crops), batch):
        x = crops[i : i + batch]
        grid = x.shape[-1] // vq.config.downsample
        recon = vq.decode_codes(interior_codes(vq, x), grid) * 2 - 1
        out.append(psnr(recon, x))
    return torch.cat(out)


# The instruments of the corner artefact: 24 px patches, about 1.5 latent cells, cover the blob the zero-padded
# decoder painted (mostly the top-left 8-16 px).
PATCH_PX = 24
REGIONS = ("top-left", "top-right", "bottom-left", "bottom-right", "centre")


def region_means(maps: torch.Tensor) -> dict[str, float]:
    """Mean of ``maps [N, H, W]`` over each 24 px corner patch and the central patch."""
    size, p = maps.shape[-1], PATCH_PX
    starts = {"top-left": (0, 0), "top-right": (0, size - p), "bottom-left": (size - p, 0),
              "bottom-right": (size - p, size - p), "centre": ((size - p) // 2, (size - p) // 2)}
    return {name: float(maps[:, r : r + p, c : c + p].mean()) for name, (r, c) in starts.items()}


@torch.no_grad()
def flat_grid_deviation(vq: VQModel, grid: int, images: int = 16) -> dict[str, float]:
    """Decode ``images`` grids of one repeated code each; mean |pixel - the image's median colour| per region, in
    [0, 1] pixel units. Such a grid has nothing that should vary across the image: any deviation is the decoder's."""
    codes = torch.randint(0, vq.config.codebook_size, (images, 1), generator=torch.Generator().manual_seed(5))
    img = vq.decode_codes(codes.expand(-1, grid * grid), grid)
    median = img.flatten(2).median(-1).values[..., None, None]
    return region_means((img - median).abs().mean(1))


@torch.no_grad()
def region_errors(vq: VQModel, crops: torch.Tensor, batch: int = 32) -> dict[str, float]:
    """Mean absolute reconstruction error (through the interior codes, [0, 1] pixel units) per region of crops in
    [-1, 1] and their three mirror images: the same pixels visit every corner, so what differs between corners is
    the tokenizer's doing, not the content's."""
    mirrored = torch.cat([crops, crops.flip(-1), crops.flip(-2), crops.flip(-2, -1)])
    maps = []
    for i in range(0, len(mirrored), batch):
        x = mirrored[i : i + batch]
        recon = vq.decode_codes(interior_codes(vq, x), x.shape[-1] // vq.config.downsample)
        maps.append((recon - (x + 1) / 2).abs().mean(1))
    return region_means(torch.cat(maps))


def top_left_excess(errors: dict[str, float]) -> float:
    """The top-left region's error over the mean of the other three corners' (1.0: not special)."""
    others = [errors[k] for k in ("top-right", "bottom-left", "bottom-right")]
    return errors["top-left"] / (sum(others) / 3)
