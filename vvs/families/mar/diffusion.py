"""The DDPM of MAR's diffusion head: a cosine schedule of 1000 steps, respaced for sampling, epsilon prediction,
and a learned variance interpolated between the posterior's and beta (Improved DDPM's "learned range").

Only what MAR uses. Every step of sampling is a Gaussian ``x_{t-1} ~ N(mean, exp(log_var))``; its noise is an
input (:meth:`Schedule.step`), because continuous speculative decoding needs draft and target to share it. Unlike
MAR's sampler, the last step is sampled too (MAR returns its mean): then a token's final value has the density
of that Gaussian, which is what makes the speculative acceptance test exact (see ``vvs.runtime.continuous``).
"""
from __future__ import annotations

import math

import numpy as np
import torch

TRAIN_STEPS = 1000


def cosine_betas(steps: int = TRAIN_STEPS, max_beta: float = 0.999) -> np.ndarray:
    def alpha_bar(t):
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    return np.array([min(1 - alpha_bar((i + 1) / steps) / alpha_bar(i / steps), max_beta) for i in range(steps)])


def spaced_timesteps(steps: int, sections: str | int) -> list[int]:
    """The original timesteps kept when ``steps`` are respaced to ``sections`` ("100", or "10,20" for a count per
    equal part), as MAR's ``space_timesteps``: evenly strided within each part, rounded."""
    counts = [int(c) for c in str(sections).split(",")]
    size, extra = divmod(steps, len(counts))
    kept, start = [], 0
    for i, count in enumerate(counts):
        part = size + (1 if i < extra else 0)
        if not 1 <= count <= part:
            raise ValueError(f"cannot take {count} sampling steps from a part of {part} diffusion steps")
        stride = 1 if count <= 1 else (part - 1) / (count - 1)
        kept += [start + round(j * stride) for j in range(count)]
        start += part
    return sorted(set(kept))


class Schedule:
    """The diffusion process over ``timesteps`` (indices into the 1000 training steps). ``num_steps`` = its length;
    step ``i`` (0 = last) is evaluated by the network at original timestep ``timesteps[i]``."""

    def __init__(self, timesteps: list[int] | None = None):
        base = cosine_betas()
        timesteps = list(range(TRAIN_STEPS)) if timesteps is None else list(timesteps)
        alpha_bar = np.cumprod(1.0 - base)[timesteps]
        betas = 1.0 - alpha_bar / np.append(1.0, alpha_bar[:-1])
        prev = np.append(1.0, alpha_bar[:-1])
        post_var = betas * (1.0 - prev) / (1.0 - alpha_bar)
        self.timesteps = timesteps
        self.num_steps = len(timesteps)
        self.timestep_table = torch.tensor(timesteps, dtype=torch.float64)

        def t64(a):
            return torch.tensor(a, dtype=torch.float64)

        self.sqrt_alpha_bar = t64(np.sqrt(alpha_bar))
        self.sqrt_one_minus_alpha_bar = t64(np.sqrt(1.0 - alpha_bar))
        self.sqrt_recip_alpha_bar = t64(np.sqrt(1.0 / alpha_bar))
        self.sqrt_recipm1_alpha_bar = t64(np.sqrt(1.0 / alpha_bar - 1))
        # the posterior variance is 0 at the last step: its log is clipped to the next step's
        self.min_log = t64(np.log(np.append(post_var[1], post_var[1:]) if len(post_var) > 1 else post_var))
        self.max_log = t64(np.log(betas))
        self.coef_x0 = t64(betas * np.sqrt(prev) / (1.0 - alpha_bar))
        self.coef_xt = t64((1.0 - prev) * np.sqrt(1.0 - betas) / (1.0 - alpha_bar))

    @classmethod
    def sampling(cls, sections: str | int) -> "Schedule":
        return cls(spaced_timesteps(TRAIN_STEPS, sections))

    @staticmethod
    def at(table: torch.Tensor, i: int | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``table[i]`` for a step ``i``, or one value per row ``[N, 1]`` for steps ``i [N]``."""
        value = table.to(device=like.device)[i].to(like.dtype)
        return value if value.dim() == 0 else value[:, None]

    def gaussian(self, eps: torch.Tensor, var_values: torch.Tensor, x: torch.Tensor, i, clip: float = 0.0):
        """The mean and log-variance of ``x_{i-1} | x_i`` from the network's outputs (epsilon, variance values in
        [-1, 1]). ``clip`` > 0 clamps the implied ``x_0`` to ``[-clip, clip]`` (DDPM's ``clip_denoised``)."""
        x0 = self.at(self.sqrt_recip_alpha_bar, i, x) * x - self.at(self.sqrt_recipm1_alpha_bar, i, x) * eps
        if clip > 0:
            x0 = x0.clamp(-clip, clip)
        mean = self.at(self.coef_x0, i, x) * x0 + self.at(self.coef_xt, i, x) * x
        frac = (var_values + 1) / 2
        log_var = frac * self.at(self.max_log, i, x) + (1 - frac) * self.at(self.min_log, i, x)
        return mean, log_var

    def noised(self, x0: torch.Tensor, i: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return self.at(self.sqrt_alpha_bar, i, x0) * x0 + self.at(self.sqrt_one_minus_alpha_bar, i, x0) * noise

    def posterior(self, x0: torch.Tensor, xt: torch.Tensor, i: torch.Tensor):
        mean = self.at(self.coef_x0, i, xt) * x0 + self.at(self.coef_xt, i, xt) * xt
        return mean, self.at(self.min_log, i, xt)


def gaussian_kl(mean1, log_var1, mean2, log_var2) -> torch.Tensor:
    return 0.5 * (-1.0 + log_var2 - log_var1 + torch.exp(log_var1 - log_var2)
                  + (mean1 - mean2) ** 2 * torch.exp(-log_var2))


def gaussian_nll(x, mean, log_var) -> torch.Tensor:
    return 0.5 * (math.log(2 * math.pi) + log_var + (x - mean) ** 2 * torch.exp(-log_var))
