"""Janus-Pro at official widths computing what a smaller Janus pair computes (:mod:`vvs.models.inflation`): the
shipped pair's tokens and acceptance at Janus-Pro-1B's or -7B's per-call cost.

Janus-specific parts: the 1-D rotate-half RoPE (one run of pairs, halves); ``gen_embed`` keeps its official width
(8, the small model's too) with the small codes in its first rows; ``gen_aligner``'s first linear reads the code
embedding (the small rows first, the others random) and its second writes the stream; ``gen_head``'s first linear
reads the stream and its second scores the official 16,384 codes (the small codes first; only those are ever
sampled). The text vocabulary stays the small model's: a prompt's ids are looked up once per image, a gather whose
cost does not depend on the table's size.

``n_layer`` below the official depth gives the official width with fewer layers, for a size whose weights do not
fit in memory (``vvs-bench --scale`` extrapolates its target time to the full depth).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from vvs.families.janus_pro.family import SCALE_SIZES
from vvs.families.janus_pro.model import JanusConfig, JanusGen, janus_config
from vvs.discrete.bundle import ModelBundle
from vvs.discrete.inflate import inflate_drafter
from vvs.models.inflation import Inflater, empty_model

SIZES = SCALE_SIZES


def inflated_config(small: JanusConfig, size: str, n_layer: int | None = None) -> JanusConfig:
    """The official ``size``'s widths, depth (or ``n_layer``) and code vocabulary, with ``small``'s prompt slots, grid,
    text vocabulary and special ids; only ``small``'s codes are sampled."""
    big = janus_config(size)
    depth = big.n_layer if n_layer is None else n_layer
    r = big.head_dim // small.head_dim
    smaller = (big.ffn_hidden < small.ffn_hidden or big.dim < small.dim or big.n_head < small.n_head
               or depth < small.n_layer or big.vocab_size < small.vocab_size or big.head_width < small.head_width)
    if smaller or r * small.head_dim != big.head_dim or small.code_dim != big.code_dim:
        raise ValueError(f"cannot inflate a Janus target of {small.n_layer} layers x {small.n_head} heads of dimension "
                         f"{small.head_dim} ({small.vocab_size} codes of width {small.code_dim}) to {size} ({depth} x "
                         f"{big.n_head} x {big.head_dim}, {big.vocab_size} codes of width {big.code_dim}): the size "
                         "must have at least as many layers, heads and codes, the same code width, and a head "
                         "dimension that is a multiple of the small one")
    return replace(small, dim=big.dim, n_layer=depth, n_head=big.n_head, ffn_hidden=big.ffn_hidden,
                   vocab_size=big.vocab_size, head_hidden=big.head_hidden,
                   norm_eps=small.norm_eps * small.dim / big.dim, sampled_codes=len(small.sampled_ids))


@torch.no_grad()
def inflate_target(small: JanusGen, size: str, n_layer: int | None = None, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> JanusGen:
    cfg = inflated_config(small.config, size, n_layer)
    big = empty_model(JanusGen, cfg, dtype)
    f = Inflater.between(small.config, cfg, seed)
    f.randomize(big)
    sc, d, v, hw = small.config, small.config.dim, small.config.vocab_size, small.config.head_width
    body, small_body = big.language_model.model, small.language_model.model
    f.embedding(body.embed_tokens.weight, small_body.embed_tokens.weight)
    big.gen_embed.weight[:v] = small.gen_embed.weight
    # gen_aligner: code_dim -> D (the small rows first; the other rows compute random values) -> GELU -> the stream
    first, second = big.gen_aligner.layers[0], big.gen_aligner.layers[2]
    s_first, s_second = small.gen_aligner.layers[0], small.gen_aligner.layers[2]
    first.weight[:d] = s_first.weight
    first.bias[:d] = s_first.bias
    f.stream_out(second.weight, s_second.weight, torch.arange(d))
    second.bias.zero_()
    second.bias[:d] = s_second.bias
    for i, layer in enumerate(body.layers):
        if i < sc.n_layer:
            f.llama_layer(layer, small_body.layers[i])
        else:
            f.dead_llama_layer(layer)
    f.norm(body.norm, small_body.norm)
    # gen_head: the stream -> head width (the small rows first) -> GELU -> codes (the small codes read those rows only)
    proj, s_proj = big.gen_head.output_mlp_projector, small.gen_head.output_mlp_projector
    f.stream_in(proj.weight, s_proj.weight)
    proj.bias[:hw] = s_proj.bias
    scores, s_scores = big.gen_head.vision_head, small.gen_head.vision_head
    scores.weight[:v] = 0.0  # the extra codes' rows keep random weights: real arithmetic, masked logits
    scores.weight[:v, :hw] = s_scores.weight
    scores.bias[:v] = s_scores.bias
    return big


def inflate_bundle(bundle: ModelBundle, size: str, n_layer: int | None = None, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> ModelBundle:
    """``bundle``'s target and drafter inflated to the official ``size`` (``n_layer`` layers: default the size's);
    the VQ decoder and the prompt tokenizer are shared. ``dtype``: the target's storage (float16 for a weight-only folder:
    :func:`vvs.models.inflation.empty_model`)."""
    target = inflate_target(bundle.target, size, n_layer, seed, dtype)
    f = Inflater.between(bundle.target.config, target.config, seed + 1)
    drafter = None if bundle.drafter is None else inflate_drafter(bundle.drafter, target.config, f)
    return ModelBundle(target, drafter, bundle.vq, bundle.family, bundle.tokenizer)
