"""Function-preserving inflation of an EAGLE drafter to its inflated target's width (:mod:`vvs.models.inflation`),
shared by every discrete-token family's ``vvs-bench --scale`` (each family inflates its own target)."""
from __future__ import annotations

from dataclasses import replace

import torch

from vvs.discrete.drafter import Drafter
from vvs.discrete.target import TargetConfig
from vvs.models.inflation import Inflater


@torch.no_grad()
def inflate_drafter(small: Drafter, big_target: TargetConfig, f: Inflater) -> Drafter:
    """An EAGLE drafter of ``big_target``'s width (any target config: ``dim``, ``n_head``, ``ffn_hidden``,
    ``vocab_size``, ``rotary()``) computing what ``small`` computes; ``f`` inflates its target."""
    sc = small.config
    cfg = replace(sc, hidden_size=big_target.dim, num_attention_heads=big_target.n_head,
                  intermediate_size=big_target.ffn_hidden, vocab_size=big_target.vocab_size,
                  rms_norm_eps=sc.rms_norm_eps * sc.hidden_size / big_target.dim,
                  qk_norm_groups=sc.qk_norm_groups if sc.qk_norm_groups <= 1 else big_target.n_head)
    if cfg.intermediate_size < sc.intermediate_size:
        raise ValueError(f"the drafter's feed-forward width {sc.intermediate_size} exceeds {cfg.intermediate_size}")
    big = Drafter(cfg, big_target).eval()
    f.randomize(big)
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
    for layer, s in zip(big.layers, small.layers):
        f.llama_layer(layer, s)
    return big
