"""Function-preserving inflation of Llama-style blocks: weights of an official width that compute exactly what a
narrower model computes, so a benchmark pays the official per-call cost with a trained pair's acceptance.

For a model of width ``d`` inflated to ``D`` (heads of dimension ``hd`` to ``HD = r·hd``):

- the residual stream keeps the small model's values in its first ``d`` channels and exact zeros elsewhere: every
  embedding is zero-padded, and every projection that writes to the stream has zero rows there;
- RMSNorm over ``D`` channels of which ``d`` are live divides by ``sqrt(d/D)`` times the small model's RMS when its
  epsilon is scaled by ``d/D`` (the caller's config does that); the norm weights are scaled by ``sqrt(d/D)``;
- head ``h`` of the small model lives in head ``h`` of the large one, each rotary pair at the pair of the large head
  that has its frequency (:func:`head_channels`); queries are scaled by ``sqrt(r)`` to undo the larger attention
  scale ``1/sqrt(HD)``;
- the extra heads, feed-forward channels and layers hold random weights (their arithmetic is real) whose output
  projections are zero, so they add exactly nothing to the stream.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

import torch
from torch import nn

from vvs.models.layers import LlamaLayer


def head_channels(n_head: int, head_dim: int, big_head_dim: int, *, interleaved: bool, blocks: int) -> torch.Tensor:
    """``[n_head * head_dim]``: where each channel of the small model's concatenated heads sits in the large one.

    A head's rotary pairs come in ``blocks`` runs of rising frequency (LlamaGen's 2-D RoPE: rows, then columns; a
    1-D RoPE: one run); pair ``m`` of a run of ``k`` pairs has frequency ``base^(-m/k)`` up to a constant, so in a
    head ``r`` times wider, pair ``r·m`` of the same run has it. ``interleaved``: a pair is channels ``(2p, 2p+1)``
    (LlamaGen), else ``(p, p + hd/2)`` (Hugging Face's rotate-half)."""
    r = big_head_dim // head_dim
    pairs, big_pairs = head_dim // 2, big_head_dim // 2
    run, big_run = pairs // blocks, big_pairs // blocks
    pair = torch.arange(pairs)
    new_pair = (pair // run) * big_run + (pair % run) * r
    if interleaved:
        within = torch.stack([2 * new_pair, 2 * new_pair + 1], -1).flatten()
    else:
        within = torch.cat([new_pair, new_pair + big_pairs])
    return (torch.arange(n_head)[:, None] * big_head_dim + within).flatten()


def empty_model(model_class: type, config, dtype: torch.dtype = torch.float32) -> nn.Module:
    """An uninitialised ``model_class(config)`` whose parameters are stored in ``dtype``: at float16, a 7B target in
    14 GB instead of 28 (a weight-only folder quantises each matrix from it, so the rounding is lost in the
    quantisation's). Buffers (RoPE tables, id maps) are computed as the model computes them: those of the same model
    at one layer, every layer's being alike."""
    with torch.device("meta"):
        model = model_class(config).eval()
    one = dict(model_class(replace(config, n_layer=1)).named_buffers())
    stored: dict[int, nn.Parameter] = {}  # by the meta parameter's id, so that tied weights stay tied
    for name, param in list(model.named_parameters(remove_duplicate=False)):
        if id(param) not in stored:
            kind = dtype if param.is_floating_point() else param.dtype
            stored[id(param)] = nn.Parameter(torch.empty(param.shape, dtype=kind), requires_grad=False)
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._parameters[leaf] = stored[id(param)]
    for name, _ in list(model.named_buffers()):
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._buffers[leaf] = one[re.sub(r"layers\.\d+\.", "layers.0.", name)].clone()
    return model


class Inflater:
    """Copies small weights into random large ones; the large model's dead parts keep their random values."""

    def __init__(self, dim: int, big_dim: int, heads: torch.Tensor, head_dim: int, big_head_dim: int, seed: int):
        self.d, self.D = dim, big_dim
        self.heads = heads  # head_channels(...)
        self.small_head_dim, self.big_head_dim = head_dim, big_head_dim
        self.q_scale = math.sqrt(big_head_dim / head_dim)
        self.norm_scale = math.sqrt(dim / big_dim)
        self.gen = torch.Generator().manual_seed(seed)

    @classmethod
    def between(cls, small, big, seed: int, *, interleaved: bool = False, blocks: int = 1) -> "Inflater":
        """An inflater from config ``small`` to config ``big`` (each with ``dim``, ``n_head`` and ``head_dim``);
        ``interleaved`` / ``blocks``: the heads' rotary layout (:func:`head_channels`)."""
        heads = head_channels(small.n_head, small.head_dim, big.head_dim, interleaved=interleaved, blocks=blocks)
        return cls(small.dim, big.dim, heads, small.head_dim, big.head_dim, seed)

    def randomize(self, module: nn.Module) -> None:
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=self.gen) * 0.02)

    def norm(self, big, small) -> None:
        big.weight.copy_(torch.ones_like(big.weight))
        big.weight[: self.d] = small.weight * self.norm_scale

    def embedding(self, big: torch.Tensor, small: torch.Tensor) -> None:
        """A table writing the stream: the small rows in the first rows, zero-padded; extra rows zero."""
        big.zero_()
        big[: small.shape[0], : self.d] = small

    def stream_in(self, big: torch.Tensor, small: torch.Tensor, out_index: torch.Tensor | None = None) -> None:
        """A projection reading the stream: small weight ``[out, d]`` into ``big [OUT, D]`` at rows ``out_index``
        (default: the first rows). Other rows keep their random values: whatever they compute meets a zero
        column of the projection that writes back to the stream."""
        rows = torch.arange(small.shape[0]) if out_index is None else out_index
        big[rows, : self.d] = small.to(big.dtype)  # an index put takes no dtype conversion
        big[rows, self.d :] = 0.0

    def stream_out(self, big: torch.Tensor, small: torch.Tensor, in_index: torch.Tensor | None = None) -> None:
        """A projection writing the stream: zero everywhere but the live block."""
        cols = torch.arange(small.shape[1]) if in_index is None else in_index
        big.zero_()
        big[: self.d, cols] = small.to(big.dtype)

    def attention(self, big_q, big_k, big_v, big_o, q, k, v, o) -> None:
        """Per-projection weights ``[dim, dim]`` (a fused ``wqkv`` is split by the caller)."""
        live = self.heads.numel() // self.small_head_dim * self.big_head_dim  # channels of the live heads
        for b, s, scale in ((big_q, q, self.q_scale), (big_k, k, 1.0), (big_v, v, 1.0)):
            b[:live] = 0.0  # a live head's padded query/key channels would add to its attention logits
            self.stream_in(b, s * scale, self.heads)
        self.stream_out(big_o, o, self.heads)

    def llama_layer(self, big: LlamaLayer, small: LlamaLayer) -> None:
        if hasattr(small, "input_layernorm"):
            self.norm(big.input_layernorm, small.input_layernorm)
        self.norm(big.post_attention_layernorm, small.post_attention_layernorm)
        a, s = big.self_attn, small.self_attn
        self.attention(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight,
                       s.q_proj.weight, s.k_proj.weight, s.v_proj.weight, s.o_proj.weight)
        if hasattr(s, "q_norm"):
            self.head_norm(a.q_norm, s.q_norm)
            self.head_norm(a.k_norm, s.k_norm)
        for name in ("gate_proj", "up_proj"):
            self.stream_in(getattr(big.mlp, name).weight, getattr(small.mlp, name).weight)
        hidden = small.mlp.down_proj.weight.shape[1]
        self.stream_out(big.mlp.down_proj.weight, small.mlp.down_proj.weight, torch.arange(hidden))

    def head_norm(self, big, small) -> None:
        """Chameleon's query/key norm (:class:`vvs.models.layers.HeadNorm`): LayerNorm statistics over each head's
        channels, which padding would change, so only heads of the same dimension carry over; one gain row shared by
        all heads stays shared, a row per head goes to its head."""
        if self.small_head_dim != self.big_head_dim:
            raise ValueError(f"query/key norms normalise each head's channels: heads of dimension "
                             f"{self.small_head_dim} cannot become heads of {self.big_head_dim}")
        rows = small.weight.shape[0]
        if rows > 1 and rows != self.heads.numel() // self.small_head_dim:
            raise ValueError(f"{rows} query/key norm rows: inflation takes one shared row or one per head")
        big.weight[:rows] = small.weight
        big.bias[:rows] = small.bias

    @staticmethod
    def dead_llama_layer(big: LlamaLayer) -> None:
        """A layer beyond the small model's depth: real arithmetic that adds nothing to the stream."""
        big.self_attn.o_proj.weight.zero_()
        big.mlp.down_proj.weight.zero_()
