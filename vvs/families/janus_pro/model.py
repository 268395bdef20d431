"""Janus-Pro's image-generation path with explicit positions, masks and key/value caches.

Janus-Pro (deepseek-ai) generates an image with its language model: a prompt of text tokens, then 576 image
codes, each fed back through ``gen_embed`` (a small code embedding) and ``gen_aligner`` (an MLP up to the
model width), each scored by ``gen_head`` (an MLP down to the 16,384 codes of its VQ-16 tokenizer). The text
``lm_head`` and the understanding tower (SigLIP ``vision_model`` and its ``aligner``) play no part in generation
and are not built. Module and parameter names follow deepseek-ai/Janus ``janus/models/modeling_vlm.py`` (the
language model is a Hugging Face ``LlamaForCausalLM``), so the official weights load with ``strict=True``.

Read top to bottom: config and named sizes, the Llama blocks, the model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vvs.discrete.target import GPTOutput, TargetConfigMixin
from vvs.export.spec import TensorSpec
from vvs.models.layers import LlamaLayer, RMSNorm, Rotary, causal_mask, layer_caches, rope_1d_table


@dataclass(frozen=True)
class JanusConfig(TargetConfigMixin):
    dim: int  # the language model's hidden_size
    n_layer: int
    n_head: int
    ffn_hidden: int  # intermediate_size
    text_vocab_size: int = 102400
    vocab_size: int = 16384  # image codes: gen_embed's and gen_head's rows, the VQ codebook
    code_dim: int = 8  # gen_embed's width (the VQ codebook's)
    head_hidden: int | None = None  # gen_head's inner width (image_token_embed); None: dim
    norm_eps: float = 1e-6
    rope_base: float = 10000.0
    grid_size: int = 24  # 24 x 24 codes: 384 px through the 16x VQ-16 decoder
    cls_token_num: int = 64  # prompt slots; shorter prompts are left-padded, longer ones refused
    bos_id: int = 100000  # <｜begin▁of▁sentence｜>
    pad_id: int = 100015  # <｜▁pad▁｜>: fills the guidance null's prompt, and padded slots
    boi_id: int = 100016  # <begin_of_image>: the prompt's last token
    sampled_codes: int | None = None  # as GPTConfig: ids from here up are never sampled; None: none

    def __post_init__(self):
        if self.dim % self.n_head or (self.dim // self.n_head) % 2:
            raise ValueError(f"dim {self.dim} must split into {self.n_head} heads of even size")
        if self.sampled_codes is not None and not 0 < self.sampled_codes <= self.vocab_size:
            raise ValueError(f"sampled_codes {self.sampled_codes} must lie in [1, vocab_size {self.vocab_size}]")
        for name in ("bos_id", "pad_id", "boi_id"):
            if not 0 <= getattr(self, name) < self.text_vocab_size:
                raise ValueError(f"{name} {getattr(self, name)} lies outside the text vocabulary "
                                 f"(0-{self.text_vocab_size - 1})")

    @property
    def head_width(self) -> int:
        return self.dim if self.head_hidden is None else self.head_hidden

    def condition_input(self, act: str) -> TensorSpec:
        """The ``target_prefill`` graph's condition: left-padded prompt ids."""
        return TensorSpec("condition", "int64", ("batch", self.cls_token_num))

    def rotary(self) -> Rotary:
        """Llama's 1-D RoPE over prompt slots and image codes alike, pairs split in halves (Hugging Face layout):
        the target's, and its drafter's."""
        return Rotary(rope_1d_table(self.max_positions, self.head_dim, self.rope_base), interleaved=False)


# The official sizes (the hub configs' language_config; LlamaConfig defaults fill what they leave out).
JANUS_SIZES: dict[str, dict] = {
    "Janus-Pro-1B": dict(dim=2048, n_layer=24, n_head=16, ffn_hidden=5632),
    "Janus-Pro-7B": dict(dim=4096, n_layer=30, n_head=32, ffn_hidden=11008),
    # the model vvs ships (docs/shipped_model.md); its tokenizer numbers the special tokens
    "Janus-vvs-S": dict(dim=192, n_layer=10, n_head=6, ffn_hidden=512, grid_size=16),
    # unit tests
    "Janus-tiny": dict(dim=64, n_layer=2, n_head=4, ffn_hidden=96, text_vocab_size=300, vocab_size=256,
                       grid_size=4, cls_token_num=12, bos_id=1, pad_id=2, boi_id=3),
}


def janus_config(name: str, **overrides) -> JanusConfig:
    if name not in JANUS_SIZES:
        raise KeyError(f"unknown Janus size {name!r}; choose one of {', '.join(JANUS_SIZES)}")
    return JanusConfig(**{**JANUS_SIZES[name], **overrides})


def guidance_null(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Guidance's null of left-padded prompt ids ``[n, C]``, as the official script builds it: the first real id
    (BOS) and the last (the image-start tag) kept, every other slot the pad id."""
    first = (ids != pad_id).long().argmax(1)
    keep = torch.zeros_like(ids, dtype=torch.bool)
    keep[torch.arange(ids.shape[0], device=ids.device), first] = True
    keep[:, -1] = True
    return torch.where(keep, ids, torch.full_like(ids, pad_id))


# --------------------------------------------------------------------------- the language model (Llama)


class LlamaBody(nn.Module):
    """``LlamaModel``'s weights: text embeddings, layers, final norm."""

    def __init__(self, config: JanusConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.text_vocab_size, config.dim)
        self.layers = nn.ModuleList(LlamaLayer(config.dim, config.n_head, config.ffn_hidden, config.norm_eps)
                                    for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)


class LanguageModel(nn.Module):
    """``LlamaForCausalLM`` without its text ``lm_head``, which image generation never reads."""

    def __init__(self, config: JanusConfig):
        super().__init__()
        self.model = LlamaBody(config)


# --------------------------------------------------------------------------- the generation modules


class GenAligner(nn.Module):
    """``MlpProjector`` of type ``mlp_gelu``, depth 2: code embedding -> model width."""

    def __init__(self, config: JanusConfig):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(config.code_dim, config.dim), nn.GELU(),
                                    nn.Linear(config.dim, config.dim))

    def forward(self, x):
        return self.layers(x)


class GenHead(nn.Module):
    """``vision_head``: model width -> ``head_width`` -> GELU -> code logits. Not linear, so guidance mixes its
    logits, never the hidden states before it."""

    def __init__(self, config: JanusConfig):
        super().__init__()
        self.output_mlp_projector = nn.Linear(config.dim, config.head_width)
        self.vision_activation = nn.GELU()
        self.vision_head = nn.Linear(config.head_width, config.vocab_size)

    def forward(self, x):
        return self.vision_head(self.vision_activation(self.output_mlp_projector(x)))


class JanusGen(nn.Module):
    """The target: prompt ids or image codes in, image-code logits, final hidden states and new keys/values out —
    :class:`vvs.discrete.target.DiscreteTarget`, so the shared graphs and loop run it unchanged."""

    def __init__(self, config: JanusConfig):
        super().__init__()
        self.config = config
        self.language_model = LanguageModel(config)
        self.gen_embed = nn.Embedding(config.vocab_size, config.code_dim)
        self.gen_aligner = GenAligner(config)
        self.gen_head = GenHead(config)
        self.rotary = config.rotary()
        for m in self.modules():  # a random model stays testable (official weights replace all of this)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    @property
    def head(self) -> nn.Module:
        return self.gen_head

    def null_condition(self, conditions: torch.Tensor) -> torch.Tensor:
        return guidance_null(conditions, self.config.pad_id)

    def image_embeddings(self, codes: torch.Tensor) -> torch.Tensor:
        return self.gen_aligner(self.gen_embed(codes))

    def embedding_table(self) -> torch.Tensor:
        """``[vocab_size, dim]``: every code's input embedding, which an EAGLE drafter copies as its own table."""
        return self.image_embeddings(torch.arange(self.config.vocab_size, device=self.gen_embed.weight.device))

    def forward(self, *, tokens: torch.Tensor | None = None, condition: torch.Tensor | None = None,
                position_ids: torch.Tensor, mask: torch.Tensor, past_kv: torch.Tensor | None = None) -> GPTOutput:
        """Run new positions: image ``tokens [B, T]`` (codes) or a ``condition`` (prompt ids ``[B, C]``).

        position_ids ``[B, T]`` index the RoPE table (prompt slots ``0..C-1``, image code i at ``C + i``); mask is
        bool ``[B or 1, 1, T, P + T]`` over ``past ‖ new``; past_kv ``[n_layer, 2, B, H, P, hd]``
        (or its pieces, :func:`~vvs.models.layers.layer_caches`) or None."""
        if (tokens is None) == (condition is None):
            raise ValueError("pass exactly one of tokens= or condition=")
        x = self.image_embeddings(tokens) if tokens is not None else self.language_model.model.embed_tokens(condition)
        return self.forward_embeddings(x, position_ids, mask, past_kv)

    def teacher_forced(self, condition: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> GPTOutput:
        """One causal forward over ``[prompt ‖ codes]``: output position ``C - 1 + i`` predicts code ``i``."""
        x = torch.cat([self.language_model.model.embed_tokens(condition), self.image_embeddings(tokens)], dim=1)
        b, length = x.shape[:2]
        positions = torch.arange(length, device=x.device).expand(b, -1)
        return self.forward_embeddings(x, positions, causal_mask(length, x.device) if mask is None else mask)

    def forward_embeddings(self, x, position_ids, mask, past_kv=None) -> GPTOutput:
        body = self.language_model.model
        rope = self.rotary(position_ids)
        new_kv = []
        for layer, past in zip(body.layers, layer_caches(past_kv, len(body.layers))):
            x, kv = layer(x, rope, mask, past)
            new_kv.append(kv)
        hidden = body.norm(x)
        return GPTOutput(self.gen_head(hidden).float(), hidden, torch.stack(new_kv))
