"""MAR's continuous tokenizer: the KL-16 VAE (LDM's ``AutoencoderKL``), 16-channel latents at stride 16.

Names follow LTH14/mar ``models/vae.py`` (``decoder.up.3.block.0.conv1.weight`` ...), so ``kl16.ckpt`` loads
strictly. Generation needs only :meth:`AutoencoderKL.decode`; the encoder is here because the released file
holds both and a strict loader accounts for every tensor. The residual/attention/resampling blocks are the ones
of the VQ tokenizer (same design, same names).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from vvs.models.vq import AttnBlock, Downsample, ResnetBlock, Upsample, swish

GROUPS = 32


@dataclass(frozen=True)
class KLConfig:
    embed_dim: int = 16
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    resolution: int = 256
    scale: float = 0.2325  # MAR trains on latents times this (about unit variance)

    def __post_init__(self):
        object.__setattr__(self, "ch_mult", tuple(self.ch_mult))

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    def to_dict(self) -> dict:
        return asdict(self)


def _stage(blocks: int, c_in: int, c_out: int, attention: bool) -> tuple[nn.Module, int]:
    stage = nn.Module()
    stage.block, stage.attn = nn.ModuleList(), nn.ModuleList()
    for _ in range(blocks):
        stage.block.append(ResnetBlock(c_in, c_out, GROUPS))
        c_in = c_out
        if attention:
            stage.attn.append(AttnBlock(c_in, GROUPS))
    return stage, c_in


def _run(stage: nn.Module, h: torch.Tensor) -> torch.Tensor:
    for i, block in enumerate(stage.block):
        h = block(h)
        if len(stage.attn):
            h = stage.attn[i](h)
    return h


def _middle(c: int) -> nn.Module:
    mid = nn.Module()
    mid.block_1, mid.attn_1, mid.block_2 = ResnetBlock(c, c, GROUPS), AttnBlock(c, GROUPS), ResnetBlock(c, c, GROUPS)
    return mid


class Encoder(nn.Module):
    def __init__(self, cfg: KLConfig):
        super().__init__()
        self.conv_in = nn.Conv2d(3, cfg.ch, 3, padding=1)
        self.down = nn.ModuleList()
        c_in, res = cfg.ch, cfg.resolution
        for level, mult in enumerate(cfg.ch_mult):
            # attention at 16 x 16 (LDM's attn_resolutions=(16,)): the last level of a 256-px KL-16
            stage, c_in = _stage(cfg.num_res_blocks, c_in, cfg.ch * mult, attention=res == 16)
            if level != len(cfg.ch_mult) - 1:
                stage.downsample = Downsample(c_in)
                res //= 2
            self.down.append(stage)
        self.mid = _middle(c_in)
        self.norm_out = nn.GroupNorm(GROUPS, c_in, eps=1e-6)
        self.conv_out = nn.Conv2d(c_in, 2 * cfg.embed_dim, 3, padding=1)

    def forward(self, x):
        h = self.conv_in(x)
        for stage in self.down:
            h = _run(stage, h)
            if hasattr(stage, "downsample"):
                h = stage.downsample(h)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, cfg: KLConfig):
        super().__init__()
        c_in = cfg.ch * cfg.ch_mult[-1]
        self.conv_in = nn.Conv2d(cfg.embed_dim, c_in, 3, padding=1)
        self.mid = _middle(c_in)
        up = []
        for level in reversed(range(len(cfg.ch_mult))):
            stage, c_in = _stage(cfg.num_res_blocks + 1, c_in, cfg.ch * cfg.ch_mult[level], attention=False)
            if level != 0:
                stage.upsample = Upsample(c_in)
            up.insert(0, stage)  # up[level]: the official order
        self.up = nn.ModuleList(up)
        self.norm_out = nn.GroupNorm(GROUPS, c_in, eps=1e-6)
        self.conv_out = nn.Conv2d(c_in, 3, 3, padding=1)

    def forward(self, z):
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for stage in reversed(self.up):
            h = _run(stage, h)
            if hasattr(stage, "upsample"):
                h = stage.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class AutoencoderKL(nn.Module):
    def __init__(self, config: KLConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quant_conv = nn.Conv2d(2 * config.embed_dim, 2 * config.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.embed_dim, 1)

    def encode_mean(self, images: torch.Tensor) -> torch.Tensor:
        """images in [-1, 1] -> the posterior's mean ``[B, embed_dim, h, w]`` (unscaled)."""
        return self.quant_conv(self.encoder(images)).chunk(2, dim=1)[0]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """unscaled latents -> images in about [-1, 1]."""
        return self.decoder(self.post_quant_conv(z))
