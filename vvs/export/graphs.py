"""The four graphs as torch modules: what ``vvs-export`` exports and what the torch backend runs.

Each ``forward`` takes its inputs in :mod:`vvs.export.spec` order and returns its outputs in spec order.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from vvs.models.drafter import Drafter
from vvs.models.gpt import GPT
from vvs.models.vq import VQModel
from vvs.runtime.sampling import filter_logits, mix


class TargetPrefill(nn.Module):
    """Condition -> guided logits of the first image token, condition features, condition keys/values."""

    def __init__(self, target: GPT):
        super().__init__()
        self.target = target

    def forward(self, condition, attn_mask, cfg_mix):
        c = self.target.config.cls_token_num
        positions = torch.arange(c, device=attn_mask.device).expand(condition.shape[0], c)
        out = self.target(condition=condition, position_ids=positions, mask=attn_mask)
        return mix(cfg_mix, out.logits[:, -1]), out.hidden, out.new_kv


class TargetVerify(nn.Module):
    """Any set of new tokens (1 for AR, a tree, a skipped chain + a tree) against the static KV buffer."""

    def __init__(self, target: GPT):
        super().__init__()
        self.target = target

    def forward(self, input_ids, position_ids, attn_mask, past_kv, cfg_mix):
        out = self.target(tokens=input_ids, position_ids=position_ids, mask=attn_mask, past_kv=past_kv)
        return mix(cfg_mix, out.logits), out.hidden, out.new_kv


class DrafterStep(nn.Module):
    """Drafter forward with explicit features, then the target's head, guidance, the logits processor and top-k:
    only ``max_top_k`` log-probabilities per node leave the graph."""

    def __init__(self, drafter: Drafter, head: nn.Linear, max_top_k: int):
        super().__init__()
        self.drafter = drafter
        self.head = head
        self.max_top_k = max_top_k

    def forward(self, features, input_ids, position_ids, attn_mask, past_kv, cfg_mix, temperature, top_k, top_p):
        out = self.drafter(features, input_ids, position_ids, attn_mask, past_kv)
        logits = mix(cfg_mix, self.head(out.hidden).float())
        logp = torch.log_softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)
        top = logp.topk(self.max_top_k, dim=-1)
        return out.hidden, out.new_kv, top.values, top.indices


class VQDecode(nn.Module):
    def __init__(self, vq: VQModel, grid: int):
        super().__init__()
        self.vq = vq
        self.grid = grid

    def forward(self, codes):
        return self.vq.decode_codes(codes, self.grid).float()  # float32 pixels from a decoder of any precision


def build_graphs(target: GPT, drafter: Drafter, vq: VQModel, max_draft_top_k: int) -> dict[str, nn.Module]:
    """The graph modules of a model bundle. The drafter graph holds its own copy of the target's head, as the
    exported drafter engine does."""
    return {
        "target_prefill": TargetPrefill(target).eval(),
        "target_verify": TargetVerify(target).eval(),
        "drafter_step": DrafterStep(drafter, copy.deepcopy(target.output), max_draft_top_k).eval(),
        "vq_decode": VQDecode(vq, target.config.grid_size).eval(),
    }
