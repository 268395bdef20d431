"""What the discrete-token machinery (graphs, exporter, engine sets, drafter, calibration, quality instruments)
asks of a target model, so that one machinery serves every such family: LlamaGen's GPT, Janus-Pro's generation
path, Lumina-mGPT's Chameleon decoder.

A target predicts an image stream of ``num_image_tokens`` ids of its graphs' vocabulary after ``cls_token_num``
condition slots; stream token ``i`` sits at position ``cls_token_num + i``. A family whose guidance null is a
function of the condition alone also offers ``null_condition(conditions)``, the drafter trainer's default null
(LlamaGen, Janus-Pro); Lumina-mGPT gives its null, which also masks slots, to the trainer instead.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import torch
from torch import nn

if TYPE_CHECKING:
    from vvs.export.spec import TensorSpec
    from vvs.models.layers import Rotary


class GPTOutput(NamedTuple):
    logits: torch.Tensor  # [B, T, vocab] float32
    hidden: torch.Tensor  # [B, T, dim] post-final-norm: the features the drafter consumes
    new_kv: torch.Tensor  # [n_layer, 2, B, n_head, T, head_dim]: keys/values of the T new positions


class TargetConfig(Protocol):
    """A target's config: the sizes the graphs, caches and drafters are built from, and its condition and RoPE."""

    @property
    def dim(self) -> int: ...
    @property
    def n_layer(self) -> int: ...
    @property
    def n_head(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def ffn_hidden(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...  # the image stream's ids, which the graphs take and score
    @property
    def sampled_ids(self) -> range: ...  # the ids an image position may be sampled as
    @property
    def cls_token_num(self) -> int: ...  # condition slots
    @property
    def grid_size(self) -> int: ...  # codes per image side
    @property
    def num_image_tokens(self) -> int: ...
    @property
    def max_positions(self) -> int: ...

    def condition_input(self, act: str) -> TensorSpec:
        """The ``target_prefill`` graph's condition input."""

    def rotary(self) -> Rotary:
        """The RoPE over condition slots and the image stream: the target's, and its drafter's."""

    def to_dict(self) -> dict: ...


@runtime_checkable
class DiscreteTarget(Protocol):
    """A target module: explicit positions, masks and key/value caches in, logits, post-norm features and the new
    positions' keys/values out."""

    config: TargetConfig

    def __call__(self, *, tokens: torch.Tensor | None = None, condition: torch.Tensor | None = None,
                 position_ids: torch.Tensor, mask: torch.Tensor, past_kv: torch.Tensor | None = None) -> GPTOutput:
        """Run new positions: stream ``tokens [B, T]`` or a ``condition``; mask is bool ``[B or 1, 1, T, P + T]``
        over ``past ‖ new``, past_kv ``[n_layer, 2, B, H, P, hd]``
        (or its pieces, :func:`~vvs.models.layers.layer_caches`) or None."""

    def teacher_forced(self, condition: torch.Tensor, tokens: torch.Tensor,
                       mask: torch.Tensor | None = None) -> GPTOutput:
        """One causal forward over ``[condition slots ‖ tokens]``: output position ``C - 1 + i`` predicts stream
        token ``i`` (training, likelihoods, calibration)."""

    @property
    def head(self) -> nn.Module:
        """What scores the stream's ids from a hidden state (an EAGLE drafter's logits come from it too)."""

    def embedding_table(self) -> torch.Tensor:
        """``[vocab_size, dim]``: every stream id's input embedding, which an EAGLE drafter copies."""


class TargetConfigMixin:
    """What the targets' config dataclasses derive alike from their fields (``dim``, ``n_head``, ``grid_size``,
    ``cls_token_num``, and ``vocab_size`` with ``sampled_codes`` for a raster of codes)."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def num_image_tokens(self) -> int:
        """A raster of ``grid_size`` x ``grid_size`` codes."""
        return self.grid_size**2

    @property
    def max_positions(self) -> int:
        return self.cls_token_num + self.num_image_tokens

    @property
    def sampled_ids(self) -> range:
        """The ids an image position may take: the codebook's codes, which the head's first rows score (ids from
        ``sampled_codes`` up, a head wider than the codebook, are never sampled)."""
        return range(self.vocab_size if self.sampled_codes is None else self.sampled_codes)

    def to_dict(self) -> dict:
        return asdict(self)
