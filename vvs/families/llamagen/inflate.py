"""Function-preserving inflation: a target and drafter of an official size that compute exactly what a smaller
pair computes.

Why: speed at the sizes users deploy (GPT-B to GPT-XL) depends on per-call costs that only real widths and depths
have, and on acceptance behaviour that only a trained pair has. Random official-size weights give the first and
not the second; the shipped pair gives the second and not the first. An inflated pair has both: every matmul has
the official shape, and the tokens are the small pair's (up to floating-point summation order).

How: :mod:`vvs.models.inflation` (the residual stream's live channels, RMSNorm, heads and rotary pairs, dead
parts); LlamaGen's 2-D RoPE gives a head's rotary pairs in two runs, rows then columns, interleaved.

The head takes the official vocabulary (16,384 codes): its first rows and the embeddings' first rows are the small
model's codes, the other rows random, so every target step and drafter expansion pays the official head. The extra
ids are never sampled (``sampled_codes``: the graphs give them -inf logits before any filter), so the tokens stay
the small pair's.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from vvs.discrete.bundle import ModelBundle
from vvs.discrete.inflate import inflate_drafter
from vvs.families.llamagen.family import SCALE_SIZES
from vvs.families.llamagen.gpt import GPT, GPTConfig, gpt_config
from vvs.models.inflation import Inflater, empty_model

SIZES = SCALE_SIZES


def inflated_config(small: GPTConfig, size: str, n_layer: int | None = None) -> GPTConfig:
    """The official ``size``'s widths, depth (or ``n_layer``) and vocabulary with ``small``'s conditioning and grid;
    only ``small``'s codes are sampled."""
    big = gpt_config(size)
    if n_layer is not None:
        big = replace(big, n_layer=n_layer)
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


@torch.no_grad()
def inflate_target(small: GPT, size: str, n_layer: int | None = None, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> GPT:
    cfg = inflated_config(small.config, size, n_layer)
    big = empty_model(GPT, cfg, dtype)
    f = Inflater.between(small.config, cfg, seed, interleaved=True, blocks=2)
    f.randomize(big)
    d, D, v = small.config.dim, cfg.dim, small.config.vocab_size
    f.embedding(big.tok_embeddings.weight, small.tok_embeddings.weight)
    if cfg.model_type == "c2i":
        f.embedding(big.cls_embedding.embedding_table.weight, small.cls_embedding.embedding_table.weight)
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


def inflate_bundle(bundle: ModelBundle, size: str, n_layer: int | None = None, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> ModelBundle:
    """``bundle``'s target and drafter inflated to the official ``size`` (``n_layer`` layers: default the size's);
    the VQ decoder is shared. ``dtype``: the target's storage (float16 for a weight-only folder:
    :func:`vvs.models.inflation.empty_model`)."""
    target = inflate_target(bundle.target, size, n_layer, seed, dtype)
    f = Inflater.between(bundle.target.config, target.config, seed + 1, interleaved=True, blocks=2)
    drafter = None if bundle.drafter is None else inflate_drafter(bundle.drafter, target.config, f)
    return ModelBundle(target, drafter, bundle.vq, bundle.family, bundle.tokenizer)
