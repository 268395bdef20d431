"""Lumina-mGPT-7B's widths computing what a smaller Chameleon pair computes (:mod:`vvs.models.inflation`): the
shipped pair's tokens and acceptance at Lumina-mGPT-7B's per-call cost.

Chameleon-specific parts: the query/key LayerNorms normalise each head's channels, so the small heads must already
have the official head dimension (128; the shipped pair's do) and become the first heads, their norm rows carried
over (the extra heads run real arithmetic that their zero output columns drop). The head scores the official
8,192 codes and the end-of-line token: the small stream (its codes, then end-of-line) keeps its indices, and the
other official image ids follow as ``extra_codes``, scored (random rows, real arithmetic) and never sampled, so the
latents and LANTERN neighbours of every token the loop can meet stay the small pair's. That head is what vvs runs on
an official folder too: the stream's 8,193 rows of the official 65,536 (the other ids are text, which image
generation never samples). The joint vocabulary's embedding stays the small model's: a call gathers
rows, at a cost that does not depend on the table's size.

``n_layer`` below the official depth gives the official width with fewer layers, for a size whose weights do not
fit in memory (``vvs-bench --scale`` extrapolates its target time to the full depth).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from vvs.discrete.bundle import ModelBundle
from vvs.discrete.inflate import inflate_drafter
from vvs.families.lumina_mgpt.family import SCALE_SIZES
from vvs.families.lumina_mgpt.model import ChameleonConfig, ChameleonGen, lumina_config
from vvs.models.inflation import Inflater, empty_model

SIZES = SCALE_SIZES


def inflated_config(small: ChameleonConfig, size: str, n_layer: int | None = None) -> ChameleonConfig:
    """The official ``size``'s widths, depth (or ``n_layer``) and code count, with ``small``'s prompt slots, grid,
    vocabulary and special ids; only ``small``'s codes are sampled."""
    big = lumina_config(size)
    depth = big.n_layer if n_layer is None else n_layer
    smaller = (big.ffn_hidden < small.ffn_hidden or big.n_head < small.n_head or depth < small.n_layer
               or big.num_codes < small.num_codes)
    if smaller or big.head_dim != small.head_dim or small.qk_norm_groups not in (1, small.n_head):
        raise ValueError(f"cannot inflate a Chameleon target of {small.n_layer} layers x {small.n_head} heads of "
                         f"dimension {small.head_dim} ({small.num_codes} codes) to {size} ({depth} x {big.n_head} x "
                         f"{big.head_dim}, {big.num_codes} codes): the size must have at least as many layers, heads "
                         "and codes and the same head dimension (the query/key norms normalise each head)")
    groups = 1 if small.qk_norm_groups == 1 else big.n_head
    last_id = small.first_code_id + big.num_codes  # the joint vocabulary names every official image id
    return replace(small, dim=big.dim, n_layer=depth, n_head=big.n_head, ffn_hidden=big.ffn_hidden,
                   extra_codes=big.num_codes - small.num_codes, qk_norm_groups=groups,
                   joint_vocab_size=max(small.joint_vocab_size, last_id), norm_eps=small.norm_eps * small.dim / big.dim)


@torch.no_grad()
def inflate_target(small: ChameleonGen, size: str, n_layer: int | None = None, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> ChameleonGen:
    cfg = inflated_config(small.config, size, n_layer)
    big = empty_model(ChameleonGen, cfg, dtype)
    f = Inflater.between(small.config, cfg, seed)
    f.randomize(big)
    f.embedding(big.model.embed_tokens.weight, small.model.embed_tokens.weight)
    for i, layer in enumerate(big.model.layers):
        if i < small.config.n_layer:
            f.llama_layer(layer, small.model.layers[i])
        else:
            f.dead_llama_layer(layer)
    f.norm(big.model.norm, small.model.norm)
    # the extra codes' rows keep random weights: real arithmetic, masked logits
    f.stream_in(big.lm_head.weight, small.lm_head.weight)
    return big


def inflate_bundle(bundle: ModelBundle, size: str, n_layer: int | None = None, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> ModelBundle:
    """``bundle``'s target and drafter inflated to the official ``size`` (``n_layer`` layers: default the size's);
    the VQGAN and the prompt tokenizer are shared. ``dtype``: the target's storage (float16 for a weight-only folder:
    :func:`vvs.models.inflation.empty_model`)."""
    target = inflate_target(bundle.target, size, n_layer, seed, dtype)
    f = Inflater.between(bundle.target.config, target.config, seed + 1)
    drafter = None if bundle.drafter is None else inflate_drafter(bundle.drafter, target.config, f)
    return ModelBundle(target, drafter, bundle.vq, bundle.family, bundle.tokenizer)
