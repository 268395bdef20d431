"""MAR's diffusion head ("Diffusion Loss"): a small MLP with adaptive LayerNorm that denoises one token's latent,
conditioned on the transformer's feature ``z`` for that token.

Module and parameter names follow LTH14/mar ``models/diffloss.py`` (``diffloss.net.res_blocks.0.mlp.0.weight``
...), so the released checkpoints load strictly.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vvs.families.mar.diffusion import TRAIN_STEPS, Schedule, gaussian_kl, gaussian_nll


def modulate(x, shift, scale):
    return x * (1 + scale) + shift


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int, frequencies: int = 256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(frequencies, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.frequencies = frequencies

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.frequencies // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], -1).to(self.mlp[0].weight.dtype))


class ResBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(channels, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(channels, channels), nn.SiLU(), nn.Linear(channels, channels))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(channels, 3 * channels))

    def forward(self, x, y):
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, channels: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(channels, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(channels, out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(channels, 2 * channels))

    def forward(self, x, y):
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class SimpleMLPAdaLN(nn.Module):
    """``(x_t [N, C], t [N] original timesteps, c [N, z_channels]) -> [N, 2C]``: epsilon, then the variance values."""

    def __init__(self, in_channels: int, model_channels: int, out_channels: int, z_channels: int, num_res_blocks: int):
        super().__init__()
        self.time_embed = TimestepEmbedder(model_channels)
        self.cond_embed = nn.Linear(z_channels, model_channels)
        self.input_proj = nn.Linear(in_channels, model_channels)
        self.res_blocks = nn.ModuleList(ResBlock(model_channels) for _ in range(num_res_blocks))
        self.final_layer = FinalLayer(model_channels, out_channels)
        self._init_weights()

    def _init_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.time_embed.mlp[0].weight, std=0.02)
        nn.init.normal_(self.time_embed.mlp[2].weight, std=0.02)
        # every block starts as the identity and the output at zero (DiT's adaLN-zero)
        for m in [b.adaLN_modulation[-1] for b in self.res_blocks] + [self.final_layer.adaLN_modulation[-1],
                                                                      self.final_layer.linear]:
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x, t, c):
        x = self.input_proj(x)
        y = self.time_embed(t) + self.cond_embed(c)
        for block in self.res_blocks:
            x = block(x, y)
        return self.final_layer(x, y)


class DiffLoss(nn.Module):
    """The head and its two diffusion processes: 1000 steps for training, ``num_sampling_steps`` for sampling."""

    def __init__(self, target_channels: int, z_channels: int, depth: int, width: int, num_sampling_steps: str,
                 clip: float = 0.0):
        super().__init__()
        self.in_channels, self.clip = target_channels, clip
        self.net = SimpleMLPAdaLN(target_channels, width, target_channels * 2, z_channels, depth)
        self.train_schedule = Schedule()
        self.sample_schedule = Schedule.sampling(num_sampling_steps)

    def loss(self, target: torch.Tensor, z: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
        """Per-token training loss ``[N]``: epsilon MSE plus the variational bound for the variance (in bits, with
        the mean's gradient stopped, as Improved DDPM's hybrid loss)."""
        s = self.train_schedule
        t = torch.randint(0, TRAIN_STEPS, (len(target),), generator=gen).to(target.device)
        noise = torch.randn(target.shape, generator=gen).to(target)
        xt = s.noised(target, t, noise)
        out = self.net(xt, t, z)
        eps, var_values = out[:, : self.in_channels], out[:, self.in_channels :]
        mse = ((eps - noise) ** 2).mean(-1)
        mean, log_var = s.gaussian(eps.detach(), var_values, xt, t)
        true_mean, true_log_var = s.posterior(target, xt, t)
        kl = gaussian_kl(true_mean, true_log_var, mean, log_var).mean(-1)
        nll = gaussian_nll(target, mean, log_var).mean(-1)  # the last step's term: the data's likelihood
        vb = torch.where(t == 0, nll, kl) / math.log(2.0)
        return mse + vb

    def step(self, x, i, z_cond, z_uncond=None, cfg=None):
        """The Gaussian of ``x_{i-1} | x_i`` (mean, log-variance) for a step ``i``, or one step per row ``i [N]``.
        With ``z_uncond`` and ``cfg [N]``: classifier-free guidance on epsilon, the conditional half's variance (as
        MAR's ``forward_with_cfg``)."""
        s, n, c = self.sample_schedule, x.shape[0], self.in_channels
        t = s.at(s.timestep_table, i, x).reshape(-1).expand(n)  # the network sees the original timestep
        if z_uncond is None:
            out = self.net(x, t, z_cond)
            eps, var_values = out[:, :c], out[:, c:]
        else:
            out = self.net(torch.cat([x, x]), torch.cat([t, t]), torch.cat([z_cond, z_uncond]))
            eps_c, eps_u, var_values = out[:n, :c], out[n:, :c], out[:n, c:]
            eps = eps_u + cfg[:, None] * (eps_c - eps_u)
        return s.gaussian(eps, var_values, x, i, self.clip)

    def sample(self, noise, step_noise, temperature, z_cond, z_uncond=None, cfg=None):
        """Denoise ``noise [N, C]`` with ``step_noise [N, S, C]`` (column k drives the k-th of the S steps, the last
        one included). Returns the last step's Gaussian (mean, std — temperature applied), the sample drawn from
        it with the last column, and the whole chain ``[N, S + 1, C]`` (the noise first, the sample last)."""
        x = noise
        chain = [x]
        steps = self.sample_schedule.num_steps
        for k in range(steps):
            mean, log_var = self.step(x, steps - 1 - k, z_cond, z_uncond, cfg)
            std = torch.exp(0.5 * log_var) * temperature[:, None]
            x = mean + std * step_noise[:, k]
            chain.append(x)
        return mean, std, x, torch.stack(chain, 1)

    def steps(self, chain, temperature, z_cond, z_uncond=None, cfg=None):
        """The Gaussians of every step along a given ``chain [N, S + 1, C]``: ``mean, std [N, S, C]``, the k-th
        being the law of ``chain[:, k + 1]`` given ``chain[:, k]``. The steps are independent given the chain, so
        all of them run as one batch (the density of a whole trajectory costs one network call, not S)."""
        n, length, c = chain.shape
        steps = length - 1
        i = torch.arange(steps - 1, -1, -1, device=chain.device)[None].expand(n, steps).reshape(-1)

        def per_step(t):
            return t[:, None].expand(n, steps, *t.shape[1:]).reshape(n * steps, *t.shape[1:])

        x = chain[:, :steps].reshape(n * steps, c)
        mean, log_var = self.step(x, i, per_step(z_cond), None if z_uncond is None else per_step(z_uncond),
                                  None if cfg is None else per_step(cfg))
        std = torch.exp(0.5 * log_var) * per_step(temperature)[:, None]
        return mean.view(n, steps, c), std.view(n, steps, c)
