"""Building blocks shared by the targets and the EAGLE-style drafter.

Key/value caches are never module state: attention takes the past keys/values of one layer as a tensor
``[2, B, H, P, hd]`` and returns the keys/values of the new tokens ``[2, B, H, T, hd]``. Whoever owns the cache
(the runtime) decides where those rows go, which is what makes tree verification and KV compaction explicit.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """LlamaGen's RMSNorm: normalise in fp32, cast back, then scale."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_2d_table(grid_size: int, head_dim: int, base: float, cls_token_num: int) -> torch.Tensor:
    """cos/sin table ``[cls_token_num + grid_size**2, head_dim // 2, 2]`` of LlamaGen's 2-D RoPE.

    The first ``cls_token_num`` rows are all zero, exactly as in the official model: condition queries and
    keys become zero after rotation (so every query-condition logit is 0), they are not left unrotated.
    Image token ``r * grid + c`` gets the row angles on the first half of the pairs, the column angles on
    the second half.
    """
    half = head_dim // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    angles = torch.outer(torch.arange(grid_size, dtype=torch.float32), freqs)  # [G, hd/4]
    grid = torch.cat(
        [angles[:, None, :].expand(-1, grid_size, -1), angles[None, :, :].expand(grid_size, -1, -1)], dim=-1
    )  # [G, G, hd/2]: (row angles, column angles)
    table = torch.stack([torch.cos(grid), torch.sin(grid)], dim=-1).flatten(0, 1)
    return torch.cat([torch.zeros(cls_token_num, half, 2), table])


def rope_1d_table(length: int, head_dim: int, base: float) -> torch.Tensor:
    """cos/sin table ``[length, head_dim // 2, 2]`` of Llama's 1-D RoPE: position ``p`` turns pair ``m`` by
    ``p / base ** (2m / head_dim)`` (the product taken in float32, as transformers' Llama takes it)."""
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.outer(torch.arange(length, dtype=torch.float32), freqs)
    return torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)


def pair_swap(head_dim: int) -> torch.Tensor:
    """``[hd, hd]`` with ``(x @ P)[2m] = -x[2m+1]`` and ``(x @ P)[2m+1] = x[2m]``: the partner of each element when
    RoPE turns interleaved pairs ``(x[2m], x[2m+1])`` (LlamaGen, Meta's Llama)."""
    p = torch.zeros(head_dim, head_dim)
    m = torch.arange(0, head_dim, 2)
    p[m + 1, m] = -1.0
    p[m, m + 1] = 1.0
    return p


def half_swap(head_dim: int) -> torch.Tensor:
    """``[hd, hd]`` with ``x @ P = (-x[h:], x[:h])``, ``h = hd / 2``: the partner of each element when RoPE turns
    pairs ``(x[m], x[m + h])`` (transformers' ``rotate_half``: Hugging Face Llama checkpoints)."""
    h = head_dim // 2
    p = torch.zeros(head_dim, head_dim)
    m = torch.arange(h)
    p[m + h, m] = -1.0
    p[m, m + h] = 1.0
    return p


class Rotary(nn.Module):
    """A model's RoPE: per-element cos/sin rows by position, and the swap matrix that pairs the elements.

    ``table [P, hd/2, 2]`` holds each pair's angle; ``interleaved`` says whether pair ``m`` is elements
    ``(2m, 2m+1)`` or ``(m, m + hd/2)``. The rows are expanded to per-element form once, here, so a forward only
    gathers them. Buffers, not parameters: constants that checkpoints do not carry, kept in float32 by
    :func:`cast_floating`."""

    def __init__(self, table: torch.Tensor, interleaved: bool):
        super().__init__()
        cos, sin = table.unbind(-1)
        expand = (lambda t: t.repeat_interleave(2, dim=-1)) if interleaved else (lambda t: torch.cat([t, t], -1))
        head_dim = 2 * table.shape[1]
        self.register_buffer("rope_cos", expand(cos), persistent=False)
        self.register_buffer("rope_sin", expand(sin), persistent=False)
        self.register_buffer("rope_swap", pair_swap(head_dim) if interleaved else half_swap(head_dim),
                             persistent=False)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(cos, sin, swap)`` for :func:`apply_rope`: cos/sin ``[B, T, 1, hd]`` at ``position_ids [B, T]``.
        Computed once per forward, shared by every layer."""
        return self.rope_cos[position_ids].unsqueeze(2), self.rope_sin[position_ids].unsqueeze(2), self.rope_swap


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, swap: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs of ``x [B, T, H, hd]`` in fp32: ``(x0·c - x1·s, x1·c + x0·s)``, written as
    ``x·cos + (x @ swap)·sin`` — the same floating-point operations as the pairwise form (the swap matmul only
    moves and negates), in a handful of graph nodes; ``swap`` says which elements pair (:class:`Rotary`)."""
    xf = x.float()
    return (xf * cos + (xf @ swap) * sin).type_as(x)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_kv: torch.Tensor | tuple | None, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of new tokens over ``past ‖ new`` keys.

    q, k, v: ``[B, T, H, hd]`` (already rotated); past_kv: ``[2, B, H, P, hd]``, a tuple of such chunks, or None;
    mask: bool ``[B or 1, 1, T, P + T]``, True where a query may attend. Returns ``([B, T, H*hd], new_kv)``
    with ``new_kv [2, B, H, T, hd]``.

    Chunks are attended where they lie, without concatenating them: a draft tree attends over the whole drafter
    cache plus a few slots per level, and copying the cache for every level cost more than the attention.
    """
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, hd]
    new_kv = torch.stack([k, v])
    if isinstance(past_kv, tuple):
        out = _attend_chunks(q, [c[0] for c in past_kv] + [k], [c[1] for c in past_kv] + [v], mask)
    else:
        if past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=2)
            v = torch.cat([past_kv[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    b, h, t, hd = out.shape
    return out.transpose(1, 2).reshape(b, t, h * hd), new_kv


def layer_caches(past_kv: torch.Tensor | Sequence[torch.Tensor] | None, n_layer: int) -> list:
    """Each layer's past keys and values as one chunk for :func:`attend` (or None per layer), from ``past_kv
    [n_layer, 2, B, H, P, hd]`` or its ``2 n_layer`` pieces (layer 0's keys, its values, layer 1's keys, ...; how
    the target graphs take the cache, :attr:`vvs.export.spec.TensorSpec.pieces`). Attended where they lie: joining
    each layer's past to its new keys copied the cache once more per step."""
    if past_kv is None:
        return [None] * n_layer
    pieces = past_kv.flatten(0, 1).unbind(0) if isinstance(past_kv, torch.Tensor) else past_kv
    if len(pieces) != 2 * n_layer:
        raise ValueError(f"past_kv: {len(pieces)} pieces for {n_layer} layers' keys and values")
    return [((pieces[2 * i], pieces[2 * i + 1]),) for i in range(n_layer)]


def _attend_chunks(q, keys, values, mask):
    """Softmax attention over key/value chunks ``[B, H, P_i, hd]`` (scores in float32, as the fused kernels do)."""
    scale = q.shape[-1] ** -0.5
    scores = torch.cat([(q @ key.transpose(-1, -2)).float() for key in keys], -1) * scale
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).to(q.dtype)
    sizes = [key.shape[2] for key in keys]
    return sum(p @ value for p, value in zip(probs.split(sizes, dim=-1), values))


class HeadNorm(nn.Module):
    """Chameleon's query/key norm: LayerNorm statistics over each head's channels (epsilon 1e-5, as the official
    code fixes it), then a gain and bias per group of heads (``weight``, ``bias [groups, head_dim]``, repeated over
    the heads of a group: one group per model-parallel shard in Lumina-mGPT's folders, one per head in
    transformers')."""

    def __init__(self, n_head: int, head_dim: int, groups: int):
        super().__init__()
        self.repeat = n_head // groups
        self.weight = nn.Parameter(torch.ones(groups, head_dim))
        self.bias = nn.Parameter(torch.zeros(groups, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, H, hd]
        normed = F.layer_norm(x, x.shape[-1:], None, None, eps=1e-5)
        return normed * self.weight.repeat_interleave(self.repeat, 0) + self.bias.repeat_interleave(self.repeat, 0)


class LlamaAttention(nn.Module):
    """Attention with Hugging Face Llama's parameter names (``q_proj`` ... ``o_proj``, no biases): Janus-Pro's
    language model and the EAGLE drafter. ``qk_norm_groups > 0``: Chameleon's query/key norms (``q_norm``,
    ``k_norm``, :class:`HeadNorm`) after the projections and before RoPE."""

    def __init__(self, dim: int, n_head: int, qk_norm_groups: int = 0):
        super().__init__()
        self.n_head, self.head_dim = n_head, dim // n_head
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        if qk_norm_groups:
            self.q_norm = HeadNorm(n_head, self.head_dim, qk_norm_groups)
            self.k_norm = HeadNorm(n_head, self.head_dim, qk_norm_groups)

    def forward(self, x, rope, mask, past_kv):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.n_head, self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        out, new_kv = attend(apply_rope(q, *rope), apply_rope(k, *rope), v, past_kv, mask)
        return self.o_proj(out), new_kv


class LlamaMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    """A Hugging Face Llama decoder layer (with ``qk_norm_groups``, Chameleon's). ``input_norm=False`` leaves out
    the norm before attention (an EAGLE drafter's first layer, whose fused input is not normalised); the module then
    has no ``input_layernorm``."""

    def __init__(self, dim: int, n_head: int, hidden: int, eps: float, input_norm: bool = True,
                 qk_norm_groups: int = 0):
        super().__init__()
        self.self_attn = LlamaAttention(dim, n_head, qk_norm_groups)
        self.mlp = LlamaMLP(dim, hidden)
        if input_norm:
            self.input_layernorm = RMSNorm(dim, eps)
        self.post_attention_layernorm = RMSNorm(dim, eps)

    def forward(self, x, rope, mask, past_kv):
        normed = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        attn, new_kv = self.self_attn(normed, rope, mask, past_kv)
        h = x + attn
        return h + self.mlp(self.post_attention_layernorm(h)), new_kv


def ffn_hidden_size(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """LlamaGen's SwiGLU width: int(2 * 4 * dim / 3), optionally scaled, rounded up to ``multiple_of``."""
    hidden = int(2 * 4 * dim / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return -(-hidden // multiple_of) * multiple_of


def cast_floating(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast a model's weights to ``dtype`` but keep RoPE tables (angles, not activations) in float32."""
    ropes = {name: buf for name, buf in module.named_buffers()
             if name.rsplit(".", 1)[-1] in ("rope_cos", "rope_sin", "rope_swap")}
    module.to(dtype)
    for name, buf in ropes.items():
        owner, _, leaf = name.rpartition(".")
        (module.get_submodule(owner) if owner else module)._buffers[leaf] = buf.float()
    return module


def causal_mask(length: int, device=None) -> torch.Tensor:
    """Bool ``[1, 1, length, length]`` lower-triangular mask (True = may attend)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


def caption_causal_mask(caption_mask: torch.Tensor, length: int) -> torch.Tensor:
    """Bool ``[B, 1, length, length]`` causal mask over ``[caption slots ‖ image tokens]`` for a left-padded
    caption (``caption_mask [B, C]``, True = valid), as LlamaGen's own ``generate`` builds it: no position sees a
    padded slot, except that every position sees itself. (A padded slot's row becomes a drafter feature, so this
    matters; LlamaGen's HF port lets a padded slot see the padded slots before it, and differs there.)"""
    b, c = caption_mask.shape
    valid = torch.cat([caption_mask, caption_mask.new_ones(b, length - c)], dim=1)
    causal = torch.ones(length, length, dtype=torch.bool, device=caption_mask.device).tril()
    eye = torch.eye(length, dtype=torch.bool, device=caption_mask.device)
    return ((causal & valid[:, None, :]) | eye).unsqueeze(1)

