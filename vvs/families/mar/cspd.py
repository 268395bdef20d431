"""Continuous speculative acceptance (Wang et al., arXiv 2411.11925): the tests that keep or reject a drafted
continuous token, and the residual samplers that redraw a rejected one.

Draft and target share every noise of a token's diffusion sampler (its start and every step) except the test's
own randomness, so each model's last step is a diagonal Gaussian given that noise, and each model gives the whole
denoising chain a density (the product of its steps' Gaussians). Three rules, named for what they test:

``exact``
    The drafted token ``x`` (the draft's sample) against the two models' *last-step* Gaussians, each on its own
    chain: keep with probability ``min(1, p(x) / q(x))``, else redraw from ``max(0, p - q)``. Lossless. The two
    last steps sit on different chains, so their Gaussians rarely overlap: little is kept.
``trajectory``
    The draft's whole chain against both models' densities *of that chain*: keep with probability
    ``min(1, P(chain) / Q(chain))``, else redraw a chain from ``max(0, P - Q)`` (target chains from the same start,
    each kept with probability ``1 - Q / P``). Lossless: the chain, hence the token, follows the target.
``official``
    The released code's rule, reproduced to compare with the paper (lossy): the drafted token is the draft's
    noise-free last-step mean ``mu_q``; the ratio divides both exponents by an inner temperature of 42 and is
    multiplied by ``prod sigma_p / sigma_q`` over every step but the last of each model's own chain (the inverse of
    the factor a density ratio of chains has); a rejected token is redrawn from ``N(mu_p, sigma_p)`` with that
    factor dividing ``q``.

Redraws use acceptance-rejection with the target as the proposal. A residual of mass ``m`` succeeds per try with
probability ``m``, so ``max_tries`` tries all fail with probability ``(1 - m)^max_tries``; the token then takes a
fresh sample of the target and is counted as a fallback (the released code leaves it at zero). For the lossless
rules this changes a rejected token's law by at most ``(1 - m)^max_tries`` in total variation, overall by at most
``m (1 - m)^max_tries <= 1 / (e (max_tries + 1))`` (0.0036 for 100 tries).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

OFFICIAL_INNER_TEMPERATURE = 42.0
LOG_2PI = 1.8378770664093453


class Gaussian(NamedTuple):
    """A diagonal Gaussian ``[..., C]`` (or one per step, ``[..., S, C]``)."""

    mean: torch.Tensor
    std: torch.Tensor


def log_density(x: torch.Tensor, g: Gaussian) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over the last axis (in float64: 16-dim ratios overflow)."""
    x, mean, std = x.double(), g.mean.double(), g.std.double()
    return (-0.5 * ((x - mean) / std) ** 2 - torch.log(std) - 0.5 * LOG_2PI).sum(-1)


def chain_log_density(chain: torch.Tensor, steps: Gaussian) -> torch.Tensor:
    """Log-density of a denoising ``chain [..., S + 1, C]`` given its start, under per-step Gaussians
    ``[..., S, C]``."""
    return log_density(chain[..., 1:, :], steps).sum(-1)


def keep(log_ratio: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """``min(1, ratio)`` acceptance: True where ``log u < log_ratio``."""
    return torch.log(uniform.double()) < log_ratio


def official_log_ratio(x: torch.Tensor, q: Gaussian, p: Gaussian) -> torch.Tensor:
    """The released acceptance ratio (log) of ``x`` given the last-step Gaussians, before the trajectory factor
    (:func:`official_factor`)."""
    t = OFFICIAL_INNER_TEMPERATURE

    def exponent(g: Gaussian) -> torch.Tensor:
        return (-0.5 * ((x.double() - g.mean.double()) / g.std.double() / t) ** 2).sum(-1)

    normalisers = torch.log(q.std.double()).sum(-1) - torch.log(p.std.double()).sum(-1)
    return exponent(p) - exponent(q) + normalisers


def official_factor(q_log_std: torch.Tensor, p_log_std: torch.Tensor) -> torch.Tensor:
    """Log of the release's trajectory factor ``prod sigma_p / sigma_q`` from ``*_log_std``, each model's sum of
    log sigma (untempered) over every step but the last of its own chain."""
    return p_log_std.double() - q_log_std.double()


class Residual(NamedTuple):
    sample: torch.Tensor  # [N, C]
    tries: torch.Tensor  # [N] tries used (max_tries + 1 where it fell back)
    fell_back: torch.Tensor  # [N] bool


def residual_sample(p: Gaussian, q: Gaussian, normals: torch.Tensor, uniforms: torch.Tensor,
                    log_q_scale: torch.Tensor | float = 0.0) -> Residual:
    """Draw from ``max(0, p - c q)`` (``c = exp(log_q_scale)``, 1 for the exact rule) with ``normals [N, T + 1, C]``
    and ``uniforms [N, T]`` (``T`` tries; the last normal is the fallback's fresh sample of ``p``). Vectorised:
    every try is evaluated, the first success wins."""
    tries = uniforms.shape[1]
    y = p.mean[:, None] + p.std[:, None] * normals
    expand = Gaussian(p.mean[:, None], p.std[:, None]), Gaussian(q.mean[:, None], q.std[:, None])
    log_q_over_p = log_density(y[:, :tries], expand[1]) - log_density(y[:, :tries], expand[0])
    scale = torch.as_tensor(log_q_scale, dtype=torch.float64, device=y.device)
    ok = success(log_q_over_p + (scale[:, None] if scale.dim() else scale), uniforms)
    return first_success(y, ok)


def success(log_q_over_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """A residual try succeeds with probability ``max(0, 1 - q / p)`` (a ratio q/p >= 1 never does)."""
    return uniforms.double() < 1.0 - torch.exp(log_q_over_p)


def first_success(candidates: torch.Tensor, ok: torch.Tensor) -> Residual:
    """``candidates [N, T + 1, ...]`` (the last is the fallback), ``ok [N, T]``: the first that succeeded."""
    tries = ok.shape[1]
    ok = torch.cat([ok, torch.ones_like(ok[:, :1])], 1)  # the fallback always "succeeds"
    first = ok.long().argmax(1)
    pick = first.view(-1, *([1] * (candidates.dim() - 1))).expand(-1, 1, *candidates.shape[2:])
    return Residual(candidates.gather(1, pick)[:, 0], first + 1, first == tries)
