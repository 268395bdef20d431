"""LlamaGen's VQ tokenizer (VQ-16 / VQ-8): convolutional encoder/decoder and an l2-normalised codebook.

Names follow FoundationVision/LlamaGen ``tokenizer/tokenizer_image/vq_model.py`` so official checkpoints load
strictly. The official code fixes the base width at 128 channels; here it is a config field so that a small
tokenizer (the shipped one) uses the same code.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class VQConfig:
    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    codebook_show_usage: bool = True  # the official checkpoints carry a `quantize.codebook_used` buffer
    base_channels: int = 128
    encoder_ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    decoder_ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    z_channels: int = 256
    num_res_blocks: int = 2
    norm_groups: int = 32
    commit_loss_beta: float = 0.25
    # How the decoder's 3x3 convolutions pad. LlamaGen pads with zeros; the border is then a signal from which
    # a small decoder learns position, and the shipped one painted a blob into the top-left corner of every image.
    # Reflection gives no such signal. Official checkpoints keep "zeros" (their exact architecture).
    decoder_padding: str = "zeros"

    def __post_init__(self):
        if self.decoder_padding not in ("zeros", "reflect"):
            raise ValueError(f"decoder_padding must be 'zeros' or 'reflect', not {self.decoder_padding!r}")
        object.__setattr__(self, "encoder_ch_mult", tuple(self.encoder_ch_mult))
        object.__setattr__(self, "decoder_ch_mult", tuple(self.decoder_ch_mult))

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.encoder_ch_mult) - 1)

    def to_dict(self) -> dict:
        return asdict(self)


VQ_SIZES: dict[str, dict] = {
    "VQ-16": dict(encoder_ch_mult=(1, 1, 2, 2, 4), decoder_ch_mult=(1, 1, 2, 2, 4)),
    "VQ-8": dict(encoder_ch_mult=(1, 2, 2, 4), decoder_ch_mult=(1, 2, 2, 4)),
    "VQ-tiny": dict(codebook_size=256, base_channels=32, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2),
                    z_channels=32, num_res_blocks=1, codebook_show_usage=False),
    "VQ-vvs-S": dict(codebook_size=1024, base_channels=32, encoder_ch_mult=(1, 2, 2, 2), decoder_ch_mult=(1, 2, 2, 2),
                     z_channels=64, num_res_blocks=1, codebook_show_usage=False, decoder_padding="reflect"),
}


def vq_config(name: str, **overrides) -> VQConfig:
    if name not in VQ_SIZES:
        raise KeyError(f"unknown VQ size {name!r}; choose one of {', '.join(VQ_SIZES)}")
    return VQConfig(**{**VQ_SIZES[name], **overrides})


def swish(x):
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, groups: int, padding: str = "zeros"):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c_in, eps=1e-6)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, padding_mode=padding)
        self.norm2 = nn.GroupNorm(groups, c_out, eps=1e-6)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, padding_mode=padding)
        if c_in != c_out:
            self.nin_shortcut = nn.Conv2d(c_in, c_out, 1)

    def forward(self, x):
        h = self.conv2(swish(self.norm2(self.conv1(swish(self.norm1(x))))))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    def __init__(self, c: int, groups: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, c, eps=1e-6)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x):
        h = self.norm(x)
        b, c, hh, ww = x.shape
        q, k, v = (m(h).reshape(b, 1, c, hh * ww).transpose(2, 3) for m in (self.q, self.k, self.v))  # one head
        out = F.scaled_dot_product_attention(q, k, v).transpose(2, 3).reshape(b, c, hh, ww)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # asymmetric padding, as in taming/LlamaGen


class Upsample(nn.Module):
    def __init__(self, c: int, padding: str = "zeros"):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, padding_mode=padding)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Encoder(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        ch, mult, g = cfg.base_channels, cfg.encoder_ch_mult, cfg.norm_groups
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        c_in = ch
        for level, m in enumerate(mult):
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(cfg.num_res_blocks):
                block.res.append(ResnetBlock(c_in, ch * m, g))
                c_in = ch * m
                if level == len(mult) - 1:
                    block.attn.append(AttnBlock(c_in, g))
            if level != len(mult) - 1:
                block.downsample = Downsample(c_in)
            self.conv_blocks.append(block)
        self.mid = nn.ModuleList([ResnetBlock(c_in, c_in, g), AttnBlock(c_in, g), ResnetBlock(c_in, c_in, g)])
        self.norm_out = nn.GroupNorm(g, c_in, eps=1e-6)
        self.conv_out = nn.Conv2d(c_in, cfg.z_channels, 3, padding=1)

    def forward(self, x):
        h = self.conv_in(x)
        for block in self.conv_blocks:
            for i, res in enumerate(block.res):
                h = res(h)
                if len(block.attn):
                    h = block.attn[i](h)
            if hasattr(block, "downsample"):
                h = block.downsample(h)
        for m in self.mid:
            h = m(h)
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        ch, mult, g, pad = cfg.base_channels, cfg.decoder_ch_mult, cfg.norm_groups, cfg.decoder_padding
        c_in = ch * mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, c_in, 3, padding=1, padding_mode=pad)
        self.mid = nn.ModuleList([ResnetBlock(c_in, c_in, g, pad), AttnBlock(c_in, g), ResnetBlock(c_in, c_in, g, pad)])
        self.conv_blocks = nn.ModuleList()
        for level in reversed(range(len(mult))):
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(cfg.num_res_blocks + 1):
                block.res.append(ResnetBlock(c_in, ch * mult[level], g, pad))
                c_in = ch * mult[level]
                if level == len(mult) - 1:
                    block.attn.append(AttnBlock(c_in, g))
            if level != 0:
                block.upsample = Upsample(c_in, pad)
            self.conv_blocks.append(block)
        self.norm_out = nn.GroupNorm(g, c_in, eps=1e-6)
        self.conv_out = nn.Conv2d(c_in, 3, 3, padding=1, padding_mode=pad)

    def forward(self, z):
        h = self.conv_in(z)
        for m in self.mid:
            h = m(h)
        for block in self.conv_blocks:
            for i, res in enumerate(block.res):
                h = res(h)
                if len(block.attn):
                    h = block.attn[i](h)
            if hasattr(block, "upsample"):
                h = block.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class Quantized(NamedTuple):
    z_q: torch.Tensor  # [B, e_dim, h, w], straight-through gradients to the encoder
    indices: torch.Tensor  # [B, h * w] raster order
    codebook_loss: torch.Tensor
    commit_loss: torch.Tensor


class VectorQuantizer(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.codebook_embed_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / cfg.codebook_size, 1.0 / cfg.codebook_size)
        if cfg.codebook_l2_norm:
            self.embedding.weight.data = F.normalize(self.embedding.weight.data, dim=-1)
        if cfg.codebook_show_usage:
            self.register_buffer("codebook_used", torch.zeros(65536))

    def codebook(self) -> torch.Tensor:
        """The code vectors the decoder sees ``[codebook_size, e_dim]`` (l2-normalised when configured)."""
        w = self.embedding.weight
        return F.normalize(w, dim=-1) if self.cfg.codebook_l2_norm else w

    def forward(self, z: torch.Tensor) -> Quantized:
        b, c, h, w = z.shape
        z = z.permute(0, 2, 3, 1)
        if self.cfg.codebook_l2_norm:
            z = F.normalize(z, dim=-1)
        book = self.codebook()
        flat = z.reshape(-1, c)
        dist = flat.pow(2).sum(1, keepdim=True) + book.pow(2).sum(1) - 2 * flat @ book.t()
        indices = dist.argmin(1)
        z_q = book[indices].view_as(z)
        codebook_loss = F.mse_loss(z_q, z.detach())
        commit_loss = self.cfg.commit_loss_beta * F.mse_loss(z_q.detach(), z)
        z_q = z + (z_q - z).detach()
        return Quantized(z_q.permute(0, 3, 1, 2), indices.view(b, h * w), codebook_loss, commit_loss)


class VQModel(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    def encode(self, images: torch.Tensor) -> Quantized:
        """images in [-1, 1] ``[B, 3, H, W]`` -> quantized latents and token ids."""
        return self.quantize(self.quant_conv(self.encoder(images)))

    def decode(self, z_q: torch.Tensor) -> torch.Tensor:
        """latents ``[B, e_dim, h, w]`` -> images in about [-1, 1] (unclamped)."""
        return self.decoder(self.post_quant_conv(z_q))

    def embed_codes(self, indices: torch.Tensor, grid: int) -> torch.Tensor:
        """token ids ``[B, grid * grid]`` (raster order) -> quantized latents ``[B, e_dim, grid, grid]``."""
        return self.quantize.codebook()[indices].view(indices.shape[0], grid, grid, -1).permute(0, 3, 1, 2)

    def decode_codes(self, indices: torch.Tensor, grid: int) -> torch.Tensor:
        """token ids ``[B, grid * grid]`` (raster order) -> images in [0, 1] ``[B, 3, H, W]``."""
        return ((self.decode(self.embed_codes(indices, grid)).clamp(-1, 1) + 1) / 2)

    def forward(self, images: torch.Tensor):
        q = self.encode(images)
        return self.decode(q.z_q), q
