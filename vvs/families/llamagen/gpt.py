"""LlamaGen GPT (class- and text-conditional) with explicit positions, masks and key/value caches.

Module and parameter names follow FoundationVision/LlamaGen ``autoregressive/models/gpt.py`` so that the
official checkpoints load with ``strict=True``. Read top to bottom: config and named sizes, conditioning,
block, model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from vvs.discrete.target import GPTOutput, TargetConfigMixin
from vvs.export.spec import TensorSpec
from vvs.models.layers import (RMSNorm, Rotary, apply_rope, attend, causal_mask, ffn_hidden_size, layer_caches,
                               rope_2d_table)


@dataclass(frozen=True)
class GPTConfig(TargetConfigMixin):
    dim: int
    n_layer: int
    n_head: int
    vocab_size: int = 16384
    sampled_codes: int | None = None  # ids from here up are never sampled (a head wider than the codebook); None: none
    model_type: str = "c2i"  # "c2i" (class ids) or "t2i" (caption embeddings)
    num_classes: int = 1000
    caption_dim: int = 2048
    cls_token_num: int = 1  # condition slots before the image tokens (120 for t2i)
    grid_size: int = 16  # image tokens form a grid_size x grid_size raster
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    class_dropout_prob: float = 0.1  # > 0 adds the null-condition row used by classifier-free guidance
    token_dropout_p: float = 0.1
    resid_dropout_p: float = 0.1
    ffn_dropout_p: float = 0.1

    def __post_init__(self):
        if self.model_type not in ("c2i", "t2i"):
            raise ValueError(f"model_type must be 'c2i' or 't2i', got {self.model_type!r}")
        if self.dim % self.n_head or (self.dim // self.n_head) % 4:
            raise ValueError(f"dim {self.dim} must split into {self.n_head} heads whose size is a multiple of 4")
        if self.sampled_codes is not None and not 0 < self.sampled_codes <= self.vocab_size:
            raise ValueError(f"sampled_codes {self.sampled_codes} must lie in [1, vocab_size {self.vocab_size}]")

    @property
    def ffn_hidden(self) -> int:
        return ffn_hidden_size(self.dim, self.multiple_of, self.ffn_dim_multiplier)

    @property
    def null_class(self) -> int:
        return self.num_classes

    def condition_input(self, act: str) -> TensorSpec:
        """The ``target_prefill`` graph's condition: class ids ``[batch]`` or caption embeddings."""
        if self.model_type == "c2i":
            return TensorSpec("condition", "int64", ("batch",))
        return TensorSpec("condition", act, ("batch", self.cls_token_num, self.caption_dim))

    def rotary(self) -> Rotary:
        """LlamaGen's 2-D RoPE over the condition slots and the image grid: the target's, and its drafter's."""
        return Rotary(rope_2d_table(self.grid_size, self.head_dim, self.rope_base, self.cls_token_num),
                      interleaved=True)


# The official sizes (LlamaGen gpt.py). The text-conditional release uses GPT-XL with model_type="t2i".
GPT_SIZES: dict[str, dict] = {
    "GPT-B": dict(n_layer=12, n_head=12, dim=768),
    "GPT-L": dict(n_layer=24, n_head=16, dim=1024),
    "GPT-XL": dict(n_layer=36, n_head=20, dim=1280),
    "GPT-XXL": dict(n_layer=48, n_head=24, dim=1536),
    "GPT-XXXL": dict(n_layer=48, n_head=40, dim=2560),
    "GPT-1B": dict(n_layer=22, n_head=32, dim=2048),
    "GPT-3B": dict(n_layer=24, n_head=32, dim=3200),
    "GPT-7B": dict(n_layer=32, n_head=32, dim=4096),
    # Small configurations: unit tests, and the model vvs ships (trained on photographs, see docs/shipped_model.md).
    "GPT-tiny": dict(n_layer=2, n_head=4, dim=64, vocab_size=256, num_classes=10, grid_size=4, multiple_of=32),
    "GPT-vvs-S": dict(n_layer=10, n_head=6, dim=192, vocab_size=1024, num_classes=16, grid_size=16, multiple_of=64),
}


def gpt_config(name: str, **overrides) -> GPTConfig:
    """A named size, with overrides; ``model_type="t2i"`` also switches to LlamaGen's 120 caption slots."""
    if name not in GPT_SIZES:
        raise KeyError(f"unknown GPT size {name!r}; choose one of {', '.join(GPT_SIZES)}")
    fields = dict(GPT_SIZES[name])
    if overrides.get("model_type") == "t2i":
        fields["cls_token_num"] = 120
    fields.update(overrides)
    return GPTConfig(**fields)


# --------------------------------------------------------------------------- conditioning


class LabelEmbedder(nn.Module):
    """Class ids -> one condition token. Row ``num_classes`` is the null class used by CFG."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.embedding_table = nn.Embedding(config.num_classes + (config.class_dropout_prob > 0), config.dim)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(labels).unsqueeze(1)


class CaptionMLP(nn.Module):
    def __init__(self, in_features: int, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, dim, bias=False)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CaptionEmbedder(nn.Module):
    """T5 caption features ``[B, C, caption_dim]`` -> C condition tokens.

    ``uncond_embedding`` is a buffer, as in LlamaGen: the optimizer never sees it, and it is the CFG null caption.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.cap_proj = CaptionMLP(config.caption_dim, config.dim)
        self.register_buffer(
            "uncond_embedding", torch.randn(config.cls_token_num, config.caption_dim) / config.caption_dim**0.5
        )

    def forward(self, caption: torch.Tensor) -> torch.Tensor:
        return self.cap_proj(caption)


# --------------------------------------------------------------------------- transformer


class Attention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.wqkv = nn.Linear(config.dim, 3 * config.dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.resid_dropout = nn.Dropout(config.resid_dropout_p)

    def forward(self, x, rope, mask, past_kv):
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).view(b, t, 3, self.n_head, self.head_dim).unbind(2)
        out, new_kv = attend(apply_rope(q, *rope), apply_rope(k, *rope), v, past_kv, mask)
        return self.resid_dropout(self.wo(out)), new_kv


class FeedForward(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden, config.dim, bias=False)
        self.ffn_dropout = nn.Dropout(config.ffn_dropout_p)

    def forward(self, x):
        return self.ffn_dropout(self.w2(nn.functional.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x, rope, mask, past_kv):
        attn, new_kv = self.attention(self.attention_norm(x), rope, mask, past_kv)
        h = x + attn
        return h + self.feed_forward(self.ffn_norm(h)), new_kv


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.cls_embedding = LabelEmbedder(config) if config.model_type == "c2i" else CaptionEmbedder(config)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.tok_dropout = nn.Dropout(config.token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.rotary = config.rotary()
        # LlamaGen zero-initialises `output` for training; a random head keeps untrained models testable.
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    @property
    def head(self) -> nn.Linear:
        """What scores image tokens: the shared graphs ask every target for its ``head``."""
        return self.output

    def embedding_table(self) -> torch.Tensor:
        """``[vocab_size, dim]``: every token's input embedding, which an EAGLE drafter copies as its own table."""
        return self.tok_embeddings.weight

    def null_condition(self, conditions: torch.Tensor) -> torch.Tensor:
        """The CFG null of each condition (the null class id, or the unconditional caption)."""
        batch = conditions.shape[0]
        if self.config.model_type == "c2i":
            return torch.full((batch,), self.config.null_class, dtype=torch.long, device=self.output.weight.device)
        return self.cls_embedding.uncond_embedding.expand(batch, -1, -1)

    def forward(
        self,
        *,
        tokens: torch.Tensor | None = None,
        condition: torch.Tensor | None = None,
        position_ids: torch.Tensor,
        mask: torch.Tensor,
        past_kv: torch.Tensor | None = None,
    ) -> GPTOutput:
        """Run new positions: image ``tokens [B, T]`` or a ``condition`` (class ids ``[B]`` / captions ``[B, C, caption_dim]``).

        position_ids ``[B, T]`` index the RoPE table (condition slots ``0..C-1``, image token i at ``C + i``);
        mask is bool ``[B or 1, 1, T, P + T]`` over ``past ‖ new``; past_kv ``[n_layer, 2, B, H, P, hd]``
        (or its pieces, :func:`~vvs.models.layers.layer_caches`) or None.
        """
        if (tokens is None) == (condition is None):
            raise ValueError("pass exactly one of tokens= or condition=")
        x = self.tok_embeddings(tokens) if tokens is not None else self.cls_embedding(condition)
        return self.forward_embeddings(self.tok_dropout(x), position_ids, mask, past_kv)

    def teacher_forced(self, condition: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> GPTOutput:
        """One causal forward over ``[condition slots ‖ tokens]`` (training, likelihoods, reference checks).

        Output position ``C - 1 + i`` predicts image token ``i``. ``mask`` defaults to plain causal.
        """
        x = torch.cat([self.cls_embedding(condition), self.tok_embeddings(tokens)], dim=1)
        b, length = x.shape[:2]
        positions = torch.arange(length, device=x.device).expand(b, -1)
        mask = causal_mask(length, x.device) if mask is None else mask
        return self.forward_embeddings(self.tok_dropout(x), positions, mask)

    def forward_embeddings(self, x, position_ids, mask, past_kv=None) -> GPTOutput:
        rope = self.rotary(position_ids)
        new_kv = []
        for layer, past in zip(self.layers, layer_caches(past_kv, len(self.layers))):
            x, kv = layer(x, rope, mask, past)
            new_kv.append(kv)
        hidden = self.norm(x)
        return GPTOutput(self.output(hidden).float(), hidden, torch.stack(new_kv))


@torch.no_grad()
def sample_ar(model: GPT, condition: torch.Tensor, cfg_scale: float = 1.0, temperature: float = 1.0,
              generator: torch.Generator | None = None, progress: str | None = None) -> torch.Tensor:
    """Plain ancestral sampling with an explicit KV cache, one image per condition (class ids, or captions without
    padding): ``[n, N]`` tokens; ``progress`` labels a progress bar. The model-level reference (calibration data,
    tests); serving goes through :mod:`vvs.runtime`."""
    n, c = condition.shape[0], model.config.cls_token_num
    guided = cfg_scale > 1.0
    cond = torch.cat([condition, model.null_condition(condition)]) if guided else condition
    rows = cond.shape[0]
    out = model(condition=cond, position_ids=torch.arange(c).expand(rows, -1), mask=causal_mask(c))
    kv, logits, tokens = out.new_kv, out.logits[:, -1], []
    steps = range(model.config.num_image_tokens)
    for i in steps if progress is None else tqdm(steps, desc=progress, unit="token", leave=False, dynamic_ncols=True):
        if guided:
            logits = logits[n:] + cfg_scale * (logits[:n] - logits[n:])
        token = torch.multinomial(torch.softmax(logits / max(temperature, 1e-5), -1), 1, generator=generator)
        tokens.append(token)
        if i + 1 == model.config.num_image_tokens:
            break
        step = model(tokens=token.repeat(rows // n, 1), position_ids=torch.full((rows, 1), c + i),
                     mask=torch.ones(1, 1, 1, c + i + 1, dtype=torch.bool), past_kv=kv)
        kv, logits = torch.cat([kv, step.new_kv], dim=4), step.logits[:, -1]
    return torch.cat(tokens, 1)
