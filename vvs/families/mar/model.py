"""MAR (Li et al., "Autoregressive Image Generation without Vector Quantization"): a bidirectional encoder/decoder
ViT over continuous tokens in a random order, with a diffusion head per token.

Names follow LTH14/mar ``models/mar.py`` (its blocks are timm's ``Block``), so the released checkpoints load
strictly. One change in how the same function is computed: MAR's encoder *drops* the tokens still to be generated
(which needs every row of a batch to have the same number), here it keeps them and masks them out of attention.
The visible tokens see exactly the same keys, so the outputs are the same, and rows at different steps of their
schedule (continuous batching, speculative verification) share one batch and one static-shape graph.

``forward(tokens, mask, labels)``: ``tokens [B, L, C]`` latents (any value where masked), ``mask [B, L]`` True
where a token is not known yet, ``labels [B]`` class ids with ``class_num`` meaning "no class" (the learned
``fake_latent``, for guidance) -> ``z [B, L, decoder_embed_dim]``, the diffusion head's condition per token.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vvs.families.mar.diffloss import DiffLoss


@dataclass(frozen=True)
class MARConfig:
    img_size: int = 256
    vae_stride: int = 16
    patch_size: int = 1
    vae_embed_dim: int = 16
    encoder_embed_dim: int = 1024
    encoder_depth: int = 16
    encoder_num_heads: int = 16
    decoder_embed_dim: int = 1024
    decoder_depth: int = 16
    decoder_num_heads: int = 16
    mlp_ratio: float = 4.0
    class_num: int = 1000
    buffer_size: int = 64
    diffloss_d: int = 3
    diffloss_w: int = 1024
    num_sampling_steps: str = "100"
    # sampling only: clamp the head's implied clean latent to [-clip, clip] (0: MAR's unclipped sampler). The first
    # step of the cosine schedule multiplies epsilon's error by 1/sqrt(alpha_bar) ~ 2e4; a small, briefly trained
    # head is not precise enough there, and its samples blow up without this bound.
    diffloss_clip: float = 0.0
    label_drop_prob: float = 0.1
    mask_ratio_min: float = 0.7
    diffusion_batch_mul: int = 4

    @property
    def seq_h(self) -> int:
        return self.img_size // self.vae_stride // self.patch_size

    @property
    def seq_len(self) -> int:
        return self.seq_h ** 2

    @property
    def token_embed_dim(self) -> int:
        return self.vae_embed_dim * self.patch_size ** 2

    @property
    def null_label(self) -> int:
        return self.class_num

    def to_dict(self) -> dict:
        return asdict(self)


MAR_SIZES: dict[str, dict] = {
    "mar_base": dict(encoder_embed_dim=768, encoder_depth=12, encoder_num_heads=12, decoder_embed_dim=768,
                     decoder_depth=12, decoder_num_heads=12, diffloss_d=6, diffloss_w=1024),
    "mar_large": dict(encoder_embed_dim=1024, encoder_depth=16, encoder_num_heads=16, decoder_embed_dim=1024,
                      decoder_depth=16, decoder_num_heads=16, diffloss_d=8, diffloss_w=1280),
    "mar_huge": dict(encoder_embed_dim=1280, encoder_depth=20, encoder_num_heads=16, decoder_embed_dim=1280,
                     decoder_depth=20, decoder_num_heads=16, diffloss_d=12, diffloss_w=1536),
    # the shipped pair: 128 px images in the shipped VQ tokenizer's 16 x 16 grid of 8-dim latents (trained on two
    # CPU cores: one noise draw per token instead of MAR's four). Its latents are l2-normalised vectors times 2.85,
    # so every component lies in [-2.85, 2.85]: the sampler clamps to 3.
    "MAR-vvs-S": dict(img_size=128, vae_stride=8, vae_embed_dim=8, encoder_embed_dim=192, encoder_depth=3,
                      encoder_num_heads=6, decoder_embed_dim=192, decoder_depth=3, decoder_num_heads=6, class_num=16,
                      buffer_size=16, diffloss_d=3, diffloss_w=256, num_sampling_steps="50", diffusion_batch_mul=1,
                      diffloss_clip=3.0),
    "MAR-vvs-XS": dict(img_size=128, vae_stride=8, vae_embed_dim=8, encoder_embed_dim=128, encoder_depth=1,
                       encoder_num_heads=4, decoder_embed_dim=128, decoder_depth=1, decoder_num_heads=4, class_num=16,
                       buffer_size=16, diffloss_d=2, diffloss_w=128, num_sampling_steps="50", diffusion_batch_mul=1,
                       diffloss_clip=3.0),
}


def mar_config(name: str, **overrides) -> MARConfig:
    if name not in MAR_SIZES:
        raise KeyError(f"unknown MAR size {name!r}; choose one of {', '.join(MAR_SIZES)}")
    return MARConfig(**{**MAR_SIZES[name], **overrides})


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, key_mask=None):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """timm's pre-norm ViT block (no layer scale, no dropout at inference)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x, key_mask=None):
        x = x + self.attn(self.norm1(x), key_mask)
        return x + self.mlp(self.norm2(x))


class MAR(nn.Module):
    def __init__(self, config: MARConfig):
        super().__init__()
        c = self.config = config
        e, d, total = c.encoder_embed_dim, c.decoder_embed_dim, c.seq_len + c.buffer_size
        self.class_emb = nn.Embedding(c.class_num, e)
        self.fake_latent = nn.Parameter(torch.zeros(1, e))
        self.z_proj = nn.Linear(c.token_embed_dim, e)
        self.z_proj_ln = nn.LayerNorm(e, eps=1e-6)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, total, e))
        self.encoder_blocks = nn.ModuleList(Block(e, c.encoder_num_heads, c.mlp_ratio) for _ in range(c.encoder_depth))
        self.encoder_norm = nn.LayerNorm(e, eps=1e-6)
        self.decoder_embed = nn.Linear(e, d)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, d))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, total, d))
        self.decoder_blocks = nn.ModuleList(Block(d, c.decoder_num_heads, c.mlp_ratio) for _ in range(c.decoder_depth))
        self.decoder_norm = nn.LayerNorm(d, eps=1e-6)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, c.seq_len, d))
        self._init_weights()
        self.diffloss = DiffLoss(c.token_embed_dim, d, c.diffloss_d, c.diffloss_w, c.num_sampling_steps,
                                 c.diffloss_clip)

    def _init_weights(self):
        for p in (self.class_emb.weight, self.fake_latent, self.mask_token, self.encoder_pos_embed_learned,
                  self.decoder_pos_embed_learned, self.diffusion_pos_embed_learned):
            nn.init.normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def class_embedding(self, labels: torch.Tensor) -> torch.Tensor:
        table = torch.cat([self.class_emb.weight, self.fake_latent])  # row class_num = no class
        return table[labels]

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        c = self.config
        b = tokens.shape[0]
        known = torch.cat([torch.ones(b, c.buffer_size, dtype=torch.bool, device=tokens.device), ~mask.bool()], 1)
        x = self.z_proj(tokens)
        x = torch.cat([self.class_embedding(labels)[:, None].expand(-1, c.buffer_size, -1), x], 1)
        x = self.z_proj_ln(x + self.encoder_pos_embed_learned)
        n = known.shape[1]
        key_mask = known[:, None, None, :].expand(b, 1, n, n)  # unknown tokens are never attended to
        for block in self.encoder_blocks:
            x = block(x, key_mask)
        x = self.decoder_embed(self.encoder_norm(x))
        x = torch.where(known[..., None], x, self.mask_token.to(x.dtype))
        x = x + self.decoder_pos_embed_learned
        for block in self.decoder_blocks:
            x = block(x)
        x = self.decoder_norm(x)[:, c.buffer_size:]
        return x + self.diffusion_pos_embed_learned


def patchify(latents: torch.Tensor, patch: int) -> torch.Tensor:
    """``[B, C, H, W]`` -> ``[B, (H/p)(W/p), C p p]`` in raster order, as MAR."""
    b, ch, h, w = latents.shape
    x = latents.reshape(b, ch, h // patch, patch, w // patch, patch)
    return torch.einsum("nchpwq->nhwcpq", x).reshape(b, (h // patch) * (w // patch), ch * patch ** 2)


def unpatchify(tokens: torch.Tensor, channels: int, patch: int) -> torch.Tensor:
    b, n, _ = tokens.shape
    side = int(round(n ** 0.5))
    x = tokens.reshape(b, side, side, channels, patch, patch)
    return torch.einsum("nhwcpq->nchpwq", x).reshape(b, channels, side * patch, side * patch)
