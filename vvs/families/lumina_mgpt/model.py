"""Lumina-mGPT's decoder (the Chameleon architecture) with explicit positions, masks and key/value caches.

Lumina-mGPT (Alpha-VLLM) paints an image with one vocabulary for text and images: a prompt of text ids, then the
start-of-image tag and two size tokens, then the image row by row, each row its codes (ids of Chameleon's 8,192
VQGAN codes) followed by an end-of-line id. The decoder is Llama-like with Chameleon's query/key norms: a
LayerNorm over each head's channels, applied after the projections and before RoPE, whose gain and bias are
stored once per model-parallel shard (``[1, head_dim]`` in Lumina-mGPT's folders) or once per head
(``[heads, head_dim]`` in transformers' and Anole's) and shared by the heads of a shard.

The image stream the shared loop decodes has its own small vocabulary: index ``c < num_codes`` is the image id
``first_code_id + c`` (ids 4..8195, the ones the official solver samples inside an image; which VQGAN code an id
stands for is the vocabulary's business, applied by the image decoder), index ``num_codes`` is the end-of-line
token. The target maps stream indices to ids of the joint vocabulary on the way in (``stream_ids``) and scores only
those ids on the way out: its ``lm_head`` holds just their rows of the official head (the official solver masks
every other id to -inf before sampling, so the distribution over the stream's ids is the same, for an eighth of the
head's cost at 65,536 ids). Module and parameter names are Lumina-mGPT's
(``ChameleonForConditionalGeneration``), so its folders load with ``strict=True``.

Read top to bottom: config and named sizes, the model (its layers are :class:`vvs.models.layers.LlamaLayer` with
the query/key norms).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vvs.discrete.target import GPTOutput, TargetConfigMixin
from vvs.export.spec import TensorSpec
from vvs.models.layers import LlamaLayer, RMSNorm, Rotary, causal_mask, layer_caches, rope_1d_table


@dataclass(frozen=True)
class ChameleonConfig(TargetConfigMixin):
    dim: int  # hidden_size
    n_layer: int
    n_head: int
    ffn_hidden: int  # intermediate_size
    joint_vocab_size: int = 65536  # text and image ids: embed_tokens' and lm_head's rows
    norm_eps: float = 1e-5  # rms_norm_eps (the query/key LayerNorms use a fixed 1e-5, as the official code does)
    rope_base: float = 10000.0
    qk_norm_groups: int = 1  # rows of each q_norm / k_norm parameter (model_parallel_size); n_head in HF's layout
    num_codes: int = 8192  # image ids: first_code_id onwards, the ids the official solver samples images from
    first_code_id: int = 4
    grid_size: int = 32  # codes per image side: 512 px through the 16x VQGAN
    code_pixels: int = 16  # pixels per code side: the VQGAN's downsampling (16 for Chameleon's)
    cls_token_num: int = 64  # prompt slots, up to and including the size tokens; shorter prompts are left-padded
    bos_id: int = 0
    pad_id: int = 1  # fills padded prompt slots (never attended)
    sep_id: int = 8710  # <reserved08706>: closes the user's turn
    boi_id: int = 8197  # <racm3:break>: start of image
    eoi_id: int = 8196  # <eoss>: end of image
    eol_id: int = 8803  # <reserved08799>: end of every row
    size_base: int = 8804  # <reserved0(8800+n)>: the size token of a side of 32·n pixels
    # image ids the head scores after the end-of-line row but never samples: an inflated pair's (vvs-bench --scale),
    # which pays for the official 8,192 codes' rows while sampling its own
    extra_codes: int = 0

    def __post_init__(self):
        if self.dim % self.n_head or (self.dim // self.n_head) % 2:
            raise ValueError(f"dim {self.dim} must split into {self.n_head} heads of even size")
        if self.n_head % self.qk_norm_groups:
            raise ValueError(f"{self.n_head} heads do not split into {self.qk_norm_groups} query/key norm groups")
        ids = {name: getattr(self, name) for name in ("bos_id", "pad_id", "sep_id", "boi_id", "eoi_id", "eol_id")}
        ids["the largest size token"] = self.size_token(self.grid_size)
        ids["the last image id"] = self.first_code_id + self.num_codes + self.extra_codes - 1
        bad = [f"{name} {value}" for name, value in ids.items() if not 0 <= value < self.joint_vocab_size]
        if bad:
            raise ValueError(f"{', '.join(bad)} lie(s) outside the {self.joint_vocab_size}-id vocabulary")

    @property
    def stream_ids(self) -> tuple[int, ...]:
        """The joint id of each stream index: the image ids, the end-of-line token, any extra image ids."""
        first, last = self.first_code_id + self.num_codes, self.first_code_id + self.num_codes + self.extra_codes
        return (*range(self.first_code_id, first), self.eol_id, *range(first, last))

    @property
    def vocab_size(self) -> int:
        """The image stream's vocabulary (codes and end-of-line), which the graphs take and score."""
        return self.num_codes + 1 + self.extra_codes

    @property
    def eol(self) -> int:
        """The end-of-line token's stream index."""
        return self.num_codes

    @property
    def sampled_ids(self) -> range:
        """Only codes are ever sampled; the end-of-line token is forced at the end of each row."""
        return range(self.num_codes)

    @property
    def num_image_tokens(self) -> int:
        """Rows of ``grid_size`` codes, each closed by an end-of-line token (the end-of-image tag that follows
        is fixed, and not decoded)."""
        return self.grid_size * (self.grid_size + 1)

    @property
    def side_pixels(self) -> int:
        return self.grid_size * self.code_pixels

    def size_token(self, codes: int) -> int:
        """The size token of a side of ``codes`` codes (``code_pixels`` each; the token counts 32 px)."""
        return self.size_base + codes * self.code_pixels // 32

    def forced_stream(self) -> tuple[int, ...]:
        """The stream's forced tokens (:class:`vvs.runtime.conditions.TokenLayout`): end-of-line after each row."""
        row = self.grid_size + 1
        return tuple(self.eol if (i + 1) % row == 0 else -1 for i in range(self.num_image_tokens))

    def drafter_fields(self) -> dict:
        """What its EAGLE drafters take from it beyond the sizes (LANTERN's Lumina-mGPT drafter: a Chameleon layer
        that normalises the fused input)."""
        return {"qk_norm_groups": self.qk_norm_groups, "first_input_norm": True, "rms_norm_eps": self.norm_eps}

    def condition_input(self, act: str) -> TensorSpec:
        """The ``target_prefill`` graph's condition: left-padded prompt ids, ending in the image's start and size
        tokens."""
        return TensorSpec("condition", "int64", ("batch", self.cls_token_num))

    def rotary(self) -> Rotary:
        """1-D RoPE over prompt slots and the image stream alike, pairs split in halves (the layout the official
        conversion permutes the query/key weights into)."""
        return Rotary(rope_1d_table(self.max_positions, self.head_dim, self.rope_base), interleaved=False)


# The official sizes: Lumina-mGPT's 7B folders are Chameleon-7B at three resolutions; Anole-7b is Chameleon-7B in
# transformers' layout (a query/key norm row per head).
CHAMELEON_7B = dict(dim=4096, n_layer=32, n_head=32, ffn_hidden=11008)
LUMINA_SIZES: dict[str, dict] = {
    "Lumina-mGPT-7B": CHAMELEON_7B,  # the decoder alone (vvs-bench --scale keeps the inflated pair's grid)
    "Lumina-mGPT-7B-512": dict(CHAMELEON_7B, grid_size=32),
    "Lumina-mGPT-7B-768": dict(CHAMELEON_7B, grid_size=48),
    "Lumina-mGPT-7B-1024": dict(CHAMELEON_7B, grid_size=64),
    "Anole-7b": dict(CHAMELEON_7B, grid_size=32, qk_norm_groups=32),
    # the pair vvs ships (docs/shipped_model.md): Chameleon-7B's head size (128) and feed-forward ratio, so that
    # --scale inflates it by adding whole heads, and few layers, so that it does so at a depth this machine's memory
    # holds; the shipped VQGAN's 1,024 codes, 16 x 16 of them at 128 px; Chameleon's special ids
    "Lumina-vvs-S": dict(dim=384, n_layer=4, n_head=3, ffn_hidden=1032, num_codes=1024, grid_size=16, code_pixels=8,
                         bos_id=1, pad_id=3),
    # unit tests: a 300-id vocabulary holding 64 codes at 4..67 and the special ids below them
    "Lumina-tiny": dict(dim=64, n_layer=2, n_head=4, ffn_hidden=96, joint_vocab_size=300, num_codes=64, grid_size=4,
                        cls_token_num=16, bos_id=0, pad_id=1, sep_id=70, boi_id=71, eoi_id=72, eol_id=73,
                        size_base=74),
}


def lumina_config(name: str, **overrides) -> ChameleonConfig:
    if name not in LUMINA_SIZES:
        raise KeyError(f"unknown Lumina-mGPT size {name!r}; choose one of {', '.join(LUMINA_SIZES)}")
    return ChameleonConfig(**{**LUMINA_SIZES[name], **overrides})


class ChameleonModel(nn.Module):
    def __init__(self, config: ChameleonConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.joint_vocab_size, config.dim)
        # pre-norm layers (Lumina-mGPT's swin_norm is false) with the query/key norms
        self.layers = nn.ModuleList(LlamaLayer(config.dim, config.n_head, config.ffn_hidden, config.norm_eps,
                                               qk_norm_groups=config.qk_norm_groups) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)


# --------------------------------------------------------------------------- the model


class ChameleonGen(nn.Module):
    """The target: prompt ids or stream indices in, stream logits, final hidden states and new keys/values out —
    :class:`vvs.discrete.target.DiscreteTarget`, so the shared graphs and loop run it unchanged."""

    def __init__(self, config: ChameleonConfig):
        super().__init__()
        self.config = config
        self.model = ChameleonModel(config)
        # the stream's rows of the official lm_head (the loader keeps those): the rest scores text, which image
        # generation masks before sampling and never reads
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.register_buffer("stream_ids", torch.tensor(config.stream_ids), persistent=False)
        self.rotary = config.rotary()
        for m in self.modules():  # a random model stays testable (official weights replace all of this)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    @property
    def head(self) -> nn.Module:
        return self.lm_head

    def embedding_table(self) -> torch.Tensor:
        """``[vocab_size, dim]``: every stream index's input embedding, which an EAGLE drafter copies."""
        return self.model.embed_tokens(self.stream_ids)

    def forward(self, *, tokens: torch.Tensor | None = None, condition: torch.Tensor | None = None,
                position_ids: torch.Tensor, mask: torch.Tensor, past_kv: torch.Tensor | None = None) -> GPTOutput:
        """Run new positions: stream ``tokens [B, T]`` (indices of the stream vocabulary) or a ``condition``
        (prompt ids ``[B, C]`` of the joint vocabulary).

        position_ids ``[B, T]`` index the RoPE table (prompt slots ``0..C-1``, stream token i at ``C + i``); mask is
        bool ``[B or 1, 1, T, P + T]`` over ``past ‖ new``; past_kv ``[n_layer, 2, B, H, P, hd]``
        (or its pieces, :func:`~vvs.models.layers.layer_caches`) or None."""
        if (tokens is None) == (condition is None):
            raise ValueError("pass exactly one of tokens= or condition=")
        ids = self.stream_ids[tokens] if tokens is not None else condition
        return self.forward_embeddings(self.model.embed_tokens(ids), position_ids, mask, past_kv)

    def teacher_forced(self, condition: torch.Tensor, tokens: torch.Tensor,
                       mask: torch.Tensor | None = None) -> GPTOutput:
        """One causal forward over ``[prompt ‖ stream]``: output position ``C - 1 + i`` predicts stream token
        ``i``."""
        x = self.model.embed_tokens(torch.cat([condition, self.stream_ids[tokens]], dim=1))
        b, length = x.shape[:2]
        positions = torch.arange(length, device=x.device).expand(b, -1)
        return self.forward_embeddings(x, positions, causal_mask(length, x.device) if mask is None else mask)

    def forward_embeddings(self, x, position_ids, mask, past_kv=None) -> GPTOutput:
        rope = self.rotary(position_ids)
        new_kv = []
        for layer, past in zip(self.model.layers, layer_caches(past_kv, len(self.model.layers))):
            x, kv = layer(x, rope, mask, past)
            new_kv.append(kv)
        hidden = self.model.norm(x)
        return GPTOutput(self.lm_head(hidden).float(), hidden, torch.stack(new_kv))
