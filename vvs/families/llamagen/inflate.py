"""Function-preserving inflation: a target and drafter of an official size that compute exactly what a smaller
pair computes.

Why: speed at the sizes users deploy (GPT-B to GPT-XL) depends on per-call costs that only real widths and depths
have, and on acceptance behaviour that only a trained pair has. Random official-size weights give the first and
not the second; the shipped pair gives the second and not the first. An inflated pair has both: every matmul has
the official shape, and the tokens are the small pair's (up to floating-point summation order).

How, for a model of width ``d`` inflated to ``D`` (heads of dimension ``hd`` to ``HD = r·hd``):

- the residual stream keeps the small model's values in its first ``d`` channels and exact zeros elsewhere: every
  embedding is zero-padded, and every projection that writes to the stream (``wo``, ``w2``, the drafter's ``fc``
  and ``o_proj``/``down_proj``) has zero rows there;
- RMSNorm over ``D`` channels of which ``d`` are live divides by ``sqrt(d/D)`` times the small model's RMS when its
  epsilon is scaled by ``d/D``; the norm weights are scaled by ``sqrt(d/D)`` to compensate;
- head ``h`` of the small model lives in head ``h`` of the large one. LlamaGen's 2-D RoPE gives pair ``m`` of a
  head of dimension ``hd`` the frequency ``base^(-4m/hd)`` (row half, then column half); in a head of dimension
  ``r·hd`` pair ``r·m`` has that same frequency, so the small head's rotary pairs sit at every ``r``-th pair of
  each half. Queries are scaled by ``sqrt(r)`` to undo the larger attention scale ``1/sqrt(HD)``;
- the extra heads, feed-forward channels and layers hold random weights (their arithmetic is real) whose output
  projections are zero, so they add exactly nothing to the stream.

The head takes the official vocabulary (16,384 codes): its first rows and the embeddings' first rows are the small
model's codes, the other rows random, so every target step and drafter expansion pays the official head. The extra
ids are never sampled (``sampled_codes``: the graphs give them -inf logits before any filter), so the tokens stay
the small pair's.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from vvs.families.llamagen.bundle import ModelBundle
from vvs.families.llamagen.drafter import Drafter
from vvs.families.llamagen.gpt import GPT, GPTConfig, gpt_config
from vvs.models.layers import ffn_hidden_size


def inflated_config(small: GPTConfig, size: str) -> GPTConfig:
    """The official ``size``'s widths, depth and vocabulary with ``small``'s conditioning and grid; only ``small``'s
    codes are sampled."""
    big = gpt_config(size)
    r = big.head_dim // small.head_dim
    smaller = (big.ffn_hidden < small.ffn_hidden or big.dim < small.dim or big.n_head < small.n_head
               or big.n_layer < small.n_layer or big.vocab_size < small.vocab_size)
    if smaller or r * small.head_dim != big.head_dim or small.head_dim % 4:
        raise ValueError(f"cannot inflate a target of {small.n_layer} layers x {small.n_head} heads of dimension "
                         f"{small.head_dim} ({small.vocab_size} codes) to {size} ({big.n_layer} x {big.n_head} x "
                         f"{big.head_dim}, {big.vocab_size} codes): the size must have at least as many layers, heads "
                         "and codes, and a head dimension that is a multiple of the small one")
    # ffn_dim_multiplier=None and multiple_of=256 are the official sizes' feed-forward rule
    return replace(small, dim=big.dim, n_layer=big.n_layer, n_head=big.n_head, multiple_of=big.multiple_of,
                   ffn_dim_multiplier=big.ffn_dim_multiplier, norm_eps=small.norm_eps * small.dim / big.dim,
                   vocab_size=big.vocab_size, sampled_codes=len(small.sampled_ids))


def head_channels(small: GPTConfig, big: GPTConfig) -> torch.Tensor:
    """``[n_head_small * hd]``: where each channel of the small model's concatenated heads sits in the large one."""
    hd, r = small.head_dim, big.head_dim // small.head_dim
    pair = torch.arange(hd // 2)
    quarter = hd // 4  # pairs of the row half; the column half follows
    new_pair = torch.where(pair < quarter, pair * r, big.head_dim // 4 + (pair - quarter) * r)
    within = torch.stack([2 * new_pair, 2 * new_pair + 1], -1).flatten()  # [hd]
    return (torch.arange(small.n_head)[:, None] * big.head_dim + within).flatten()


class _Inflater:
    """Copies small weights into random large ones; the large model's dead parts keep their random values."""

    def __init__(self, small: GPTConfig, big: GPTConfig, generator: torch.Generator):
        self.d, self.D = small.dim, big.dim
        self.heads = head_channels(small, big)
        self.small_head_dim, self.big_head_dim = small.head_dim, big.head_dim
        self.q_scale = math.sqrt(big.head_dim / small.head_dim)
        self.norm_scale = math.sqrt(small.dim / big.dim)
        self.gen = generator

    def random(self, weight: torch.Tensor) -> None:
        weight.copy_(torch.randn(weight.shape, generator=self.gen) * 0.02)

    def norm(self, big, small) -> None:
        big.weight.copy_(torch.ones_like(big.weight))
        big.weight[: self.d] = small.weight * self.norm_scale

    def stream_in(self, big: torch.Tensor, small: torch.Tensor, out_index: torch.Tensor | None = None) -> None:
        """A projection reading the stream: small weight ``[out, d]`` into ``big [OUT, D]`` at rows ``out_index``
        (default: the first rows). Other rows keep their random values: whatever they compute meets a zero
        column of the projection that writes back to the stream."""
        rows = torch.arange(small.shape[0]) if out_index is None else out_index
        big[rows, : self.d] = small
        big[rows, self.d :] = 0.0

    def stream_out(self, big: torch.Tensor, small: torch.Tensor, in_index: torch.Tensor | None = None) -> None:
        """A projection writing the stream: zero everywhere but the live block."""
        cols = torch.arange(small.shape[1]) if in_index is None else in_index
        big.zero_()
        big[: self.d, cols] = small

    def attention(self, big_q, big_k, big_v, big_o, q, k, v, o) -> None:
        """Per-projection weights ``[dim, dim]`` (the target's fused ``wqkv`` is split by the caller)."""
        live = self.heads.numel() // self.small_head_dim * self.big_head_dim  # channels of the live heads
        for b, s, scale in ((big_q, q, self.q_scale), (big_k, k, 1.0), (big_v, v, 1.0)):
            b[:live] = 0.0  # a live head's padded query/key channels would add to its attention logits
            self.stream_in(b, s * scale, self.heads)
        self.stream_out(big_o, o, self.heads)


@torch.no_grad()
def inflate_target(small: GPT, size: str, seed: int = 0) -> GPT:
    cfg = inflated_config(small.config, size)
    gen = torch.Generator().manual_seed(seed)
    big = GPT(cfg).eval()
    f = _Inflater(small.config, cfg, gen)
    for p in big.parameters():
        f.random(p)
    d, D, v = small.config.dim, cfg.dim, small.config.vocab_size
    big.tok_embeddings.weight.zero_()
    big.tok_embeddings.weight[:v, :d] = small.tok_embeddings.weight
    if cfg.model_type == "c2i":
        table = big.cls_embedding.embedding_table.weight
        table.zero_()
        table[:, :d] = small.cls_embedding.embedding_table.weight
    else:
        proj, small_proj = big.cls_embedding.cap_proj, small.cls_embedding.cap_proj
        proj.fc1.weight.zero_()
        proj.fc1.weight[:d] = small_proj.fc1.weight  # gelu(0) = 0: the padded channels stay zero
        f.stream_out(proj.fc2.weight, small_proj.fc2.weight)
        big.cls_embedding.uncond_embedding.copy_(small.cls_embedding.uncond_embedding)
    for i, layer in enumerate(big.layers):
        if i >= small.config.n_layer:  # a layer that adds nothing: zero output projections
            layer.attention.wo.weight.zero_()
            layer.feed_forward.w2.weight.zero_()
            continue
        s = small.layers[i]
        f.norm(layer.attention_norm, s.attention_norm)
        f.norm(layer.ffn_norm, s.ffn_norm)
        wq, wk, wv = layer.attention.wqkv.weight.view(3, D, D).unbind(0)
        f.attention(wq, wk, wv, layer.attention.wo.weight, *s.attention.wqkv.weight.view(3, d, d).unbind(0),
                    s.attention.wo.weight)
        hidden = small.config.ffn_hidden
        for name in ("w1", "w3"):
            f.stream_in(getattr(layer.feed_forward, name).weight, getattr(s.feed_forward, name).weight)
        f.stream_out(layer.feed_forward.w2.weight, s.feed_forward.w2.weight, torch.arange(hidden))
    f.norm(big.norm, small.norm)
    big.output.weight[:v] = 0.0  # the extra codes' rows keep random weights: real arithmetic, masked logits
    big.output.weight[:v, :d] = small.output.weight
    return big


@torch.no_grad()
def inflate_drafter(small: Drafter, small_target: GPTConfig, big_target: GPTConfig, seed: int = 0) -> Drafter:
    sc = small.config
    hidden = ffn_hidden_size(big_target.dim, big_target.multiple_of, big_target.ffn_dim_multiplier)
    cfg = replace(sc, hidden_size=big_target.dim, num_attention_heads=big_target.n_head, intermediate_size=hidden,
                  rms_norm_eps=sc.rms_norm_eps * sc.hidden_size / big_target.dim, vocab_size=big_target.vocab_size)
    if hidden < sc.intermediate_size:
        raise ValueError(f"the drafter's feed-forward width {sc.intermediate_size} exceeds {hidden}")
    gen = torch.Generator().manual_seed(seed + 1)
    big = Drafter(cfg, big_target).eval()
    f = _Inflater(small_target, big_target, gen)
    for p in big.parameters():
        f.random(p)
    d, D = sc.hidden_size, cfg.hidden_size
    big.embed_tokens.weight.zero_()
    big.embed_tokens.weight[: sc.vocab_size, :d] = small.embed_tokens.weight
    # fc reads [embedding ; feature]: both halves' live channels
    big.fc.weight.zero_()
    big.fc.weight[:d, :d] = small.fc.weight[:, :d]
    big.fc.weight[:d, D : D + d] = small.fc.weight[:, d:]
    if big.fc.bias is not None:
        big.fc.bias.zero_()
        big.fc.bias[:d] = small.fc.bias
    for i, layer in enumerate(big.layers):
        s = small.layers[i]
        if hasattr(s, "input_layernorm"):
            f.norm(layer.input_layernorm, s.input_layernorm)
        f.norm(layer.post_attention_layernorm, s.post_attention_layernorm)
        a, sa = layer.self_attn, s.self_attn
        f.attention(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight,
                    sa.q_proj.weight, sa.k_proj.weight, sa.v_proj.weight, sa.o_proj.weight)
        for name in ("gate_proj", "up_proj"):
            f.stream_in(getattr(layer.mlp, name).weight, getattr(s.mlp, name).weight)
        f.stream_out(layer.mlp.down_proj.weight, s.mlp.down_proj.weight, torch.arange(sc.intermediate_size))
    return big


def inflate_bundle(bundle: ModelBundle, size: str, seed: int = 0) -> ModelBundle:
    """``bundle``'s target and drafter inflated to the official ``size``; the VQ decoder is shared."""
    target = inflate_target(bundle.target, size, seed)
    drafter = inflate_drafter(bundle.drafter, bundle.target.config, target.config, seed)
    return ModelBundle(target, drafter, bundle.vq)

