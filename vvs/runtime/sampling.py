"""Classifier-free guidance and the logits processor, written once for the runtime and the exported graphs.

Guidance is a mixing matrix over batch rows, ``mixed = cfg_mix @ logits``: with rows ``[cond; uncond]`` it is
``[s·I, (1 - s)·I]`` (= ``l_u + s·(l_c - l_u)``), without guidance it is ``I``. One graph then serves every
scale, with or without the unconditional half.

The processor applies temperature, then top-k, then top-p (LlamaGen's order; the SD code's order differs only
when both filters are active). The drafter graph applies the same settings to its candidates
(:class:`vvs.discrete.graphs.Proposer`).
"""
from __future__ import annotations

import torch
from torch import nn

from vvs.runtime.random import inverse_cdf


def cfg_matrix(num_images: int, scale: float, dtype=torch.float32, device=None) -> torch.Tensor:
    """``[n, 2n]`` guidance mix for rows ``[cond; uncond]``; ``[n, n]`` identity when ``scale <= 1`` (LlamaGen
    guides only above 1)."""
    eye = torch.eye(num_images, dtype=dtype, device=device)
    if scale <= 1.0:
        return eye
    return torch.cat([scale * eye, (1.0 - scale) * eye], dim=1)


def mix(cfg_mix: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Apply ``cfg_mix [n, B]`` over the batch axis of ``x [B, ...]``."""
    return (cfg_mix @ x.flatten(1).to(cfg_mix.dtype)).view(cfg_mix.shape[0], *x.shape[1:])


class VocabularyMask(nn.Module):
    """Ids the model scores but never samples get -inf logits inside the graphs: the text ids of a joint text + image
    vocabulary, or the extra rows of a head wider than its codebook (the scale benchmark's official 16,384 codes
    over a smaller pair's). Applied after guidance (-inf mixed with -inf is NaN) and before every filter, so
    neither the target's sampling nor the drafter's candidates can reach them."""

    def __init__(self, vocab_size: int, sampled: range):
        super().__init__()
        ids = torch.arange(vocab_size)
        self.register_buffer("blocked", (ids < sampled.start) | (ids >= sampled.stop), persistent=False)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.masked_fill(self.blocked, float("-inf"))


def vocabulary_mask(vocab_size: int, sampled: range) -> VocabularyMask | None:
    """The mask of a head whose ``sampled`` ids are not all of it; None where every id is sampled."""
    return None if sampled == range(vocab_size) else VocabularyMask(vocab_size, sampled)


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, top-k, then top-p, as LlamaGen's ``top_k_top_p_filtering``; removed entries become -inf.

    Top-k (``top_k <= 0`` or ``>= vocab`` keeps all) keeps every code at least as likely as the k-th, ties included.
    Top-p keeps a code while the mass strictly above it, renormalised over the top-k survivors, is at most ``top_p``;
    codes tied at that boundary all stay (LlamaGen's sort keeps an arbitrary subset of them). Only the ``top_k``
    best are ever sorted (the whole vocabulary only for top-p without top-k): at 16,384 codes a full sort per tree
    node would cost more than the rest of a cycle's bookkeeping."""
    vocab = logits.shape[-1]
    logits = logits / max(temperature, 1e-5)
    k = vocab if top_k <= 0 else min(top_k, vocab)
    if k == vocab and top_p >= 1.0:
        return logits
    ordered = torch.topk(logits, k, dim=-1, sorted=top_p < 1.0).values
    threshold = ordered.amin(-1, keepdim=True)
    if top_p < 1.0:
        survivors = torch.logsumexp(logits.masked_fill(logits < threshold, float("-inf")), dim=-1, keepdim=True)
        probs = (ordered - survivors).exp()
        keep = (probs.cumsum(-1) - probs) <= top_p
        threshold = torch.maximum(threshold, ordered.gather(-1, keep.sum(-1, keepdim=True) - 1))
    return logits.masked_fill(logits < threshold, float("-inf"))


class Processor:
    """The options' logits processor (runtime side), and the same settings as the drafter graph's inputs."""

    def __init__(self, temperature: float, top_k: int, top_p: float, device=None, vocab_size: int | None = None):
        self.greedy = temperature == 0
        self.settings = (max(float(temperature), 1e-5), int(top_k), float(top_p))
        self.temperature = torch.tensor([self.settings[0]], device=device)
        self.top_k = torch.tensor([top_k], dtype=torch.long, device=device)
        self.top_p = torch.tensor([float(top_p)], device=device)
        # the drafter's TopK over the vocabulary (Proposer.filtered), needed only where top-p renormalises over
        # top-k's survivors; read on the host, where it sizes that TopK
        both = not self.greedy and top_p < 1.0 and 0 < top_k and (vocab_size is None or top_k < vocab_size)
        self.survivors_k = torch.tensor([top_k if both else 1], dtype=torch.long)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Target distribution used for sampling and acceptance (greedy: the plain softmax)."""
        if self.greedy:
            return torch.softmax(logits.float(), dim=-1)
        return torch.softmax(filter_logits(logits.float(), *self.settings), dim=-1)

    def graph_inputs(self) -> dict[str, torch.Tensor]:
        """What the drafter graph's in-graph filter needs; greedy drafts from the unfiltered distribution."""
        if self.greedy:
            return {"temperature": torch.ones_like(self.temperature), "top_k": torch.zeros_like(self.top_k),
                    "top_p": torch.ones_like(self.top_p), "survivors_k": self.survivors_k}
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "survivors_k": self.survivors_k}


def sample(probs: torch.Tensor, greedy: bool, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs [n, V]``, drawn with the row's uniform ``u [n]`` (argmax when greedy)."""
    if greedy:
        return probs.argmax(-1)
    return inverse_cdf(probs, u)
