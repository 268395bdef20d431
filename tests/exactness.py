"""A joint goodness-of-fit test for samplers that claim to draw exactly from the target.

Each token of a generated image is mapped through its own conditional distribution under the target, given the
image's earlier tokens (teacher forcing, with the same guidance and filters): ``U = F(x - 1) + V·p(x)`` with ``F``
the conditional's CDF and ``V`` a fresh uniform (the randomised probability integral transform). When every token
is drawn from that conditional, all the ``U`` of all positions of all images are independent and uniform on
[0, 1) — the chain rule makes this a statement about whole images, not per-position marginals — so one
Kolmogorov-Smirnov test over them sees errors that show only jointly (a draw that depends on an earlier
acceptance's uniform, a residual left unnormalised, an acceptance against the wrong power of p)."""
from __future__ import annotations

import torch
from scipy import stats

from vvs.runtime.sampling import Processor, cfg_matrix, mix


def conditionals(pipe, conditions: torch.Tensor, tokens: torch.Tensor, cfg_scale: float, temperature: float,
                 top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """``[n, N, V]``: the target's processed distribution of every token given the image's earlier tokens."""
    target = pipe.engines.graphs["target_verify"].module.target
    n = len(tokens)
    rows = torch.cat([conditions, target.null_condition(conditions)]) if cfg_scale > 1 else conditions
    prefix = tokens[:, :-1]
    with torch.no_grad():
        out = target.teacher_forced(rows, prefix.repeat(rows.shape[0] // n, 1))
    logits = out.logits[:, target.config.cls_token_num - 1:]  # output position C - 1 + i predicts token i
    return Processor(temperature, top_k, top_p).probs(mix(cfg_matrix(n, cfg_scale), logits))


def pit_pvalues(probs: torch.Tensor, tokens: torch.Tensor, seed: int = 0) -> tuple[float, float]:
    """KS p-values of the randomised PIT values of ``tokens [n, N]`` under ``probs [n, N, V]``: all positions
    jointly, and the worst single position (Bonferroni-adjusted over the N positions), each the smaller of two
    orderings of the codes (Bonferroni-adjusted over the two): by index, and by descending probability. Any
    ordering that is a function of the prefix keeps the values uniform under an exact sampler; the second turns a
    sampler that moves mass between likely and unlikely codes (an acceptance against p^0.9) into a shift of the
    values towards one end, which the index order scatters and hides."""
    by_index = _pit(probs, tokens, seed)
    ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # ties by index: a function of the prefix
    by_probability = _pit(ordered, order.argsort(-1).gather(-1, tokens[..., None]).squeeze(-1), seed)
    return tuple(min(1.0, 2 * min(a, b)) for a, b in zip(by_index, by_probability))


def _pit(probs: torch.Tensor, tokens: torch.Tensor, seed: int) -> tuple[float, float]:
    px = probs.gather(-1, tokens[..., None]).squeeze(-1)
    below = probs.cumsum(-1).gather(-1, tokens[..., None]).squeeze(-1) - px
    v = torch.rand(tokens.shape, generator=torch.Generator().manual_seed(seed), dtype=probs.dtype)
    u = (below + v * px).clamp(0, 1).double().numpy()
    joint = stats.kstest(u.reshape(-1), "uniform").pvalue
    worst = min(stats.kstest(u[:, pos], "uniform").pvalue for pos in range(u.shape[1])) * u.shape[1]
    return float(joint), float(min(worst, 1.0))
