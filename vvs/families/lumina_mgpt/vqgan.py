"""Chameleon's image tokenizer: the VQGAN of Meta's Chameleon (taming-transformers' architecture), which Lumina-mGPT
reads images with and paints them back from. Module and parameter names are those of the official ``vqgan.ckpt``
(``encoder.*``, ``decoder.*``, ``quantize.embedding.weight``, ``quant_conv.*``, ``post_quant_conv.*``); the
sizes are its ``vqgan.yaml``'s ``model.params`` (:class:`VQGANConfig`).

The encoder downsamples by 2 at every level but the last (asymmetric zero padding before a stride-2 convolution);
both encoder and decoder have self-attention in their middle block, and in a level only at the resolutions
``attn_resolutions`` names (none, officially); the quantiser takes the nearest code by plain squared L2 distance.
The decoder mirrors the encoder with one more residual block per level and nearest-neighbour upsampling.

Its residual, attention and resampling blocks are taming's, the ones LlamaGen's VQ models are built of
(:mod:`vvs.models.vq`), with the same parameter names. Read top to bottom: config, encoder, decoder, the model.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from vvs.models.vq import AttnBlock, Downsample, ResnetBlock, Upsample, swish

GROUPS = 32  # every GroupNorm's


@dataclass(frozen=True)
class VQGANConfig:
    embed_dim: int = 256  # the codebook's width
    n_embed: int = 8192  # codes
    z_channels: int = 256
    resolution: int = 512  # what the attention resolutions are counted from
    in_channels: int = 3
    out_ch: int = 3
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = ()
    # How the decoder's 3x3 convolutions pad: Chameleon's with zeros. vvs's shipped tokenizer reflects (a small
    # zero-padded decoder learns where the border is and specks the top-left corner, docs/performance.md "The
    # tokenizer's corners"); official files have no such field and keep zeros.
    decoder_padding: str = "zeros"

    def __post_init__(self):
        if self.decoder_padding not in ("zeros", "reflect"):
            raise ValueError(f"decoder_padding must be 'zeros' or 'reflect', not {self.decoder_padding!r}")
        object.__setattr__(self, "ch_mult", tuple(self.ch_mult))
        object.__setattr__(self, "attn_resolutions", tuple(self.attn_resolutions))
        if any((self.ch * m) % GROUPS for m in self.ch_mult):
            raise ValueError(f"ch {self.ch} x ch_mult {self.ch_mult}: every level's channels must split into the 32 "
                             "groups of its GroupNorms")

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def codebook_size(self) -> int:
        return self.n_embed

    @property
    def codebook_embed_dim(self) -> int:
        return self.embed_dim

    def to_dict(self) -> dict:
        return asdict(self)


def middle(channels: int, padding: str = "zeros") -> nn.Module:
    mid = nn.Module()
    mid.block_1 = ResnetBlock(channels, channels, GROUPS, padding)
    mid.attn_1 = AttnBlock(channels, GROUPS)
    mid.block_2 = ResnetBlock(channels, channels, GROUPS, padding)
    return mid


def run_middle(mid: nn.Module, x):
    return mid.block_2(mid.attn_1(mid.block_1(x)))


class Encoder(nn.Module):
    def __init__(self, c: VQGANConfig):
        super().__init__()
        self.conv_in = nn.Conv2d(c.in_channels, c.ch, 3, padding=1)
        self.down = nn.ModuleList()
        widths = (1, *c.ch_mult)
        res = c.resolution
        for level, mult in enumerate(c.ch_mult):
            down = nn.Module()
            block_in, block_out = c.ch * widths[level], c.ch * mult
            down.block = nn.ModuleList(ResnetBlock(block_in if i == 0 else block_out, block_out, GROUPS)
                                       for i in range(c.num_res_blocks))
            down.attn = nn.ModuleList(AttnBlock(block_out, GROUPS) for _ in range(c.num_res_blocks)) \
                if res in c.attn_resolutions else nn.ModuleList()
            if level != len(c.ch_mult) - 1:
                down.downsample = Downsample(block_out)
                res //= 2
            self.down.append(down)
        top = c.ch * c.ch_mult[-1]
        self.mid = middle(top)
        self.norm_out = nn.GroupNorm(GROUPS, top, eps=1e-6)
        self.conv_out = nn.Conv2d(top, c.z_channels, 3, padding=1)

    def forward(self, x):
        h = self.conv_in(x)
        for down in self.down:
            for i, block in enumerate(down.block):
                h = block(h)
                if len(down.attn):
                    h = down.attn[i](h)
            if hasattr(down, "downsample"):
                h = down.downsample(h)
        return self.conv_out(swish(self.norm_out(run_middle(self.mid, h))))


class Decoder(nn.Module):
    """``up[level]`` mirrors ``down[level]``; the deepest level runs first."""

    def __init__(self, c: VQGANConfig):
        super().__init__()
        top, pad = c.ch * c.ch_mult[-1], c.decoder_padding
        self.conv_in = nn.Conv2d(c.z_channels, top, 3, padding=1, padding_mode=pad)
        self.mid = middle(top, pad)
        self.up = nn.ModuleList()
        res = c.resolution // c.downsample
        block_in = top
        ups = []
        for level in reversed(range(len(c.ch_mult))):
            up = nn.Module()
            block_out = c.ch * c.ch_mult[level]
            up.block = nn.ModuleList(ResnetBlock(block_in if i == 0 else block_out, block_out, GROUPS, pad)
                                     for i in range(c.num_res_blocks + 1))
            up.attn = nn.ModuleList(AttnBlock(block_out, GROUPS) for _ in range(c.num_res_blocks + 1)) \
                if res in c.attn_resolutions else nn.ModuleList()
            block_in = block_out
            if level != 0:
                up.upsample = Upsample(block_out, pad)
                res *= 2
            ups.insert(0, up)
        self.up.extend(ups)
        self.norm_out = nn.GroupNorm(GROUPS, block_in, eps=1e-6)
        self.conv_out = nn.Conv2d(block_in, c.out_ch, 3, padding=1, padding_mode=pad)

    def forward(self, z):
        h = run_middle(self.mid, self.conv_in(z))
        for up in reversed(self.up):
            for i, block in enumerate(up.block):
                h = block(h)
                if len(up.attn):
                    h = up.attn[i](h)
            if hasattr(up, "upsample"):
                h = up.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class Quantizer(nn.Module):
    """The codebook, and the code each image id of the stream stands for (``stream_codes``: Chameleon's vocabulary
    names its image ids by code; not in the official file, which knows only codes)."""

    def __init__(self, c: VQGANConfig):
        super().__init__()
        self.embedding = nn.Embedding(c.n_embed, c.embed_dim)
        self.register_buffer("stream_codes", torch.arange(c.n_embed))

    def codebook(self) -> torch.Tensor:
        """``[n_embed + 1, embed_dim]``: the code vector of each stream id, and a zero row for the end-of-line
        token (a forced token: LANTERN's neighbours and VVS's path similarity never need its latent)."""
        book = self.embedding.weight[self.stream_codes]
        return torch.cat([book, book.new_zeros(1, book.shape[1])])

    def codes(self, z: torch.Tensor) -> torch.Tensor:
        """The nearest code of each position of ``z [B, D, h, w]`` by squared L2 distance: ``[B, h * w]``."""
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        book = self.embedding.weight
        distance = (flat * flat).sum(1, keepdim=True) + (book * book).sum(1) - 2 * flat @ book.t()
        return distance.argmin(1).view(z.shape[0], -1)


class ChameleonVQGAN(nn.Module):
    def __init__(self, config: VQGANConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = Quantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.z_channels, 1)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] ``[B, 3, H, W]`` -> codes ``[B, (H/16) * (W/16)]`` in raster order."""
        return self.quantize.codes(self.quant_conv(self.encoder(images)))

    def decode(self, codes: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Codes ``[B, height * width]`` in raster order -> images in [0, 1] ``[B, 3, 16·height, 16·width]``."""
        z = self.quantize.embedding(codes).view(codes.shape[0], height, width, -1).permute(0, 3, 1, 2)
        return (self.decoder(self.post_quant_conv(z)).clamp(-1, 1) + 1) / 2

    def decode_codes(self, stream: torch.Tensor, grid: int) -> torch.Tensor:
        """The image stream ``[B, grid * (grid + 1)]`` (rows of stream ids, each closed by an end-of-line token) ->
        images in [0, 1]: the end-of-line column dropped, ids mapped to their codes, as the official solver's
        ``decode_image`` does."""
        ids = stream.view(stream.shape[0], grid, grid + 1)[:, :, :grid].reshape(stream.shape[0], -1)
        return self.decode(self.quantize.stream_codes[ids], grid, grid)
