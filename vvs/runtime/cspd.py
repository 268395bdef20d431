"""Continuous speculative acceptance (Wang et al., arXiv 2411.11925) for tokens whose last denoising step is a
Gaussian.

Draft and target share every noise of a token's diffusion sampler except the test's own randomness, so given
that noise each model's token is a diagonal Gaussian: the draft's ``q = N(mean_q, std_q)``, the target's
``p = N(mean_p, std_p)``. A drafted ``x ~ q`` is kept with probability ``min(1, p(x) / q(x))``; otherwise the
token is redrawn from the residual ``max(0, p - q)`` by acceptance-rejection with ``p`` as the proposal (a try
succeeds with probability ``max(0, 1 - q(y) / p(y))``). The result is distributed exactly as ``p``.

The residual has mass ``TV(p, q)`` and a try succeeds with exactly that probability, so ``max_tries`` tries fail
with probability ``(1 - TV)^max_tries``. What happens then is defined, not silent (the official code leaves the
token at zero): the token takes a fresh sample of ``p`` and is counted as a fallback. Given that a token was
rejected, this changes its distribution by at most ``(1 - TV)^max_tries`` in total variation; overall by at
most ``TV (1 - TV)^max_tries <= 1 / (e (max_tries + 1))`` (0.0036 for 100 tries).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

LOG_2PI = 1.8378770664093453


def log_density(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over the last axis (in float64: 16-dim ratios overflow)."""
    x, mean, std = x.double(), mean.double(), std.double()
    return (-0.5 * ((x - mean) / std) ** 2 - torch.log(std) - 0.5 * LOG_2PI).sum(-1)


def accept(x, mean_q, std_q, mean_p, std_p, uniform: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``[N]`` True where the drafted ``x [N, C]`` is kept: ``log u < (log p(x) - log q(x)) / temperature^2``.

    ``temperature`` 1 is the exact test. Above 1 the ratio is tempered towards 1 and more drafts are kept, at the
    price of exactness (the official release tempers with 42, inside the exponent)."""
    log_ratio = log_density(x, mean_p, std_p) - log_density(x, mean_q, std_q)
    return torch.log(uniform.double()) < log_ratio / temperature ** 2


class Residual(NamedTuple):
    sample: torch.Tensor  # [N, C]
    tries: torch.Tensor  # [N] tries used (max_tries + 1 where it fell back)
    fell_back: torch.Tensor  # [N] bool


def residual_sample(mean_p, std_p, mean_q, std_q, normals: torch.Tensor, uniforms: torch.Tensor) -> Residual:
    """Draw from ``max(0, p - q)`` with ``normals [N, T + 1, C]`` and ``uniforms [N, T]`` (``T`` tries; the last
    normal is the fallback's fresh sample of ``p``). Vectorised: every try is evaluated, the first success wins."""
    tries = uniforms.shape[1]
    y = mean_p[:, None] + std_p[:, None] * normals
    log_ratio = log_density(y[:, :tries], mean_q[:, None], std_q[:, None]) - \
        log_density(y[:, :tries], mean_p[:, None], std_p[:, None])
    ok = uniforms.double() < 1.0 - torch.exp(log_ratio)  # ratio q/p >= 1 never succeeds
    ok = torch.cat([ok, torch.ones_like(ok[:, :1])], 1)  # the fallback always "succeeds"
    first = ok.long().argmax(1)
    pick = first[:, None, None].expand(-1, 1, y.shape[-1])
    return Residual(y.gather(1, pick)[:, 0], first + 1, first == tries)
