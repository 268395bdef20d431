"""EAGLE / LANTERN one-layer drafter for any discrete-token target (LlamaGen, Janus-Pro, Lumina-mGPT).

``x = fc([embed(token) ; target_feature])`` goes through LlamaGen-style decoder layers (the first has no input
norm, there is no final norm); logits come from the *target's* ``output`` head. Parameter names follow LANTERN's
``cnets_llamagen.py`` (``embed_tokens``, ``fc``, ``layers.0.self_attn.q_proj`` ...), so its released drafter
folders load with ``strict=True``.

Slot alignment (EAGLE): the drafter slot that consumes the token at target position ``p + 1`` is fed the target
feature of position ``p``. We pass ``p + 1`` as that slot's position id, so the drafter shares the target's RoPE
table (the official code builds a separate table with one zero row fewer, which is the same thing).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
from torch import nn

from vvs.discrete.target import TargetConfig
from vvs.models.layers import LlamaLayer


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_hidden_layers: int = 1
    rms_norm_eps: float = 1e-6
    fc_bias: bool = True  # LANTERN's config has no "bias" key, and the fc then has a bias
    # a Chameleon target's drafter (LANTERN's for Lumina-mGPT): its layers have the target's query/key norms, and
    # its first layer normalises the fused input
    qk_norm_groups: int = 0
    first_input_norm: bool = False

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by {self.num_attention_heads} heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def for_target(cls, target: TargetConfig, **overrides) -> "DrafterConfig":
        """LANTERN's rule: the drafter config equals the target's except for the number of layers (a target
        config's ``drafter_fields()``, where it has one, says what else its drafters take from it)."""
        fields = dict(
            hidden_size=target.dim,
            intermediate_size=target.ffn_hidden,
            num_attention_heads=target.n_head,
            vocab_size=target.vocab_size,
            **(target.drafter_fields() if hasattr(target, "drafter_fields") else {}),
        )
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_hf_json(cls, data: dict) -> "DrafterConfig":
        """Read a LANTERN / EAGLE ``config.json``."""
        if data.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {data['hidden_act']!r}")
        if data.get("rope_scaling") is not None:
            raise ValueError("rope_scaling is not supported (LlamaGen drafters use the 2-D RoPE table)")
        heads = data["num_attention_heads"]
        if data.get("num_key_value_heads", heads) != heads:
            raise ValueError("num_key_value_heads must equal num_attention_heads (LlamaGen has no grouped-query attention)")
        chameleon = data.get("model_type") == "chameleon"  # LANTERN's Lumina-mGPT drafter
        return cls(
            hidden_size=data["hidden_size"],
            intermediate_size=data["intermediate_size"],
            num_attention_heads=heads,
            vocab_size=data["vocab_size"],
            num_hidden_layers=data.get("num_hidden_layers", 1),
            rms_norm_eps=data.get("rms_norm_eps", 1e-5 if chameleon else 1e-6),
            fc_bias=data.get("bias", True),
            qk_norm_groups=data.get("model_parallel_size", 1) if chameleon else 0,
            first_input_norm=chameleon,
        )

    def to_hf_json(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLM"],
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "bias": self.fc_bias,
            "rope_scaling": None,
        }

    def to_dict(self) -> dict:
        return asdict(self)


class DrafterOutput(NamedTuple):
    hidden: torch.Tensor  # [B, T, D]; logits = target.head(hidden)
    new_kv: torch.Tensor  # [num_hidden_layers, 2, B, H, T, hd]


class Drafter(nn.Module):
    def __init__(self, config: DrafterConfig, target: TargetConfig):
        super().__init__()
        if (config.hidden_size, config.num_attention_heads) != (target.dim, target.n_head):
            raise ValueError(
                f"drafter width {config.hidden_size}/{config.num_attention_heads} heads does not match the target's "
                f"{target.dim}/{target.n_head}"
            )
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # a frozen copy of the target's table
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.fc_bias)
        # EAGLE: the fused input is not normalised before the first layer's attention (LANTERN's Chameleon drafter
        # normalises it)
        self.layers = nn.ModuleList(
            LlamaLayer(config.hidden_size, config.num_attention_heads, config.intermediate_size, config.rms_norm_eps,
                       input_norm=i > 0 or config.first_input_norm, qk_norm_groups=config.qk_norm_groups)
            for i in range(config.num_hidden_layers))
        self.rotary = target.rotary()
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, features, tokens, position_ids, mask, past_kv=None) -> DrafterOutput:
        """features ``[B, T, D]`` (target features of the previous positions), tokens ``[B, T]``, position_ids
        ``[B, T]`` (target positions of the tokens), mask bool ``[B or 1, 1, T, P + T]``,
        past_kv ``[num_hidden_layers, 2, B, H, P, hd]``, a tuple of such chunks (see :func:`attend`), or None."""
        x = self.fc(torch.cat([self.embed_tokens(tokens).to(features.dtype), features], dim=-1))
        rope = self.rotary(position_ids)
        new_kv = []
        for i, layer in enumerate(self.layers):
            past = past_kv if past_kv is None else (
                tuple(c[i] for c in past_kv) if isinstance(past_kv, tuple) else past_kv[i])
            x, kv = layer(x, rope, mask, past)
            new_kv.append(kv)
        return DrafterOutput(x, torch.stack(new_kv))
