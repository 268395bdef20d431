"""Continuous speculative decoding's acceptance rules: goodness-of-fit tests on heads with known densities.

The toy heads are linear Gaussian denoising chains (every step ``x' = alpha x + a z + sigma eps``) started from
the token's shared noise, so the target's distribution of every token is known in closed form. The lossless rules
(``exact``, ``trajectory``) must pass; the released rule (``official``) and accepting every draft must fail the
same tests, at the same sample sizes and thresholds.
"""
import math

import numpy as np
import pytest
import torch
from scipy import stats

from vvs.families.mar.engines import MAREngineSet
from vvs.families.mar.model import MARConfig
from vvs.families.mar.cspd import (OFFICIAL_INNER_TEMPERATURE, Gaussian, keep, log_density, official_factor,
                              official_log_ratio, residual_sample)
from vvs.families.mar.options import MAROptions
from vvs.families.mar.pipeline import MARPipeline

P_THRESHOLD = 1e-3  # a correct sampler fails a test with this probability


def normal_cdf(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


# ----------------------------------------------------------------------------- the per-token test


def speculative(mean_q, std_q, mean_p, std_p, n, gen, tries=100):
    """Draft from q, accept or redraw: the whole per-token procedure, as the decoder runs it."""
    c = mean_q.shape[-1]
    x = mean_q + std_q * torch.randn(n, c, generator=gen, dtype=torch.float64)
    q, p = Gaussian(mean_q.expand(n, c), std_q.expand(n, c)), Gaussian(mean_p.expand(n, c), std_p.expand(n, c))
    kept = keep(log_density(x, p) - log_density(x, q), torch.rand(n, generator=gen, dtype=torch.float64))
    r = (~kept).nonzero().flatten()
    redrawn = residual_sample(Gaussian(p.mean[r], p.std[r]), Gaussian(q.mean[r], q.std[r]),
                              torch.randn(len(r), tries + 1, c, generator=gen, dtype=torch.float64),
                              torch.rand(len(r), tries, generator=gen, dtype=torch.float64))
    x[r] = redrawn.sample
    return x, kept, redrawn


@pytest.mark.parametrize("mean_q,std_q", [(0.8, 1.0), (-0.5, 0.6), (0.3, 1.7)])
def test_accepted_or_redrawn_tokens_follow_the_target(mean_q, std_q):
    gen = torch.Generator().manual_seed(1)
    p_mean, p_std = torch.tensor([[0.0, 1.0]], dtype=torch.float64), torch.tensor([[1.0, 0.5]], dtype=torch.float64)
    q_mean = torch.tensor([[mean_q, 1.0 - mean_q]], dtype=torch.float64)
    q_std = torch.tensor([[std_q, 0.5 * std_q]], dtype=torch.float64)
    x, kept, _ = speculative(q_mean, q_std, p_mean, p_std, 20000, gen)
    for d in range(2):
        assert stats.kstest(x[:, d].numpy(), "norm", args=(p_mean[0, d].item(), p_std[0, d].item())).pvalue > P_THRESHOLD
    assert 0.05 < kept.double().mean() < 0.95  # both branches were exercised


def test_accepting_every_draft_fails_the_same_test():
    """The test has power: without the acceptance step the draft's distribution is detected."""
    gen = torch.Generator().manual_seed(1)
    x = 0.3 + 1.7 * torch.randn(20000, generator=gen, dtype=torch.float64)
    assert stats.kstest(x.numpy(), "norm", args=(0.0, 1.0)).pvalue < P_THRESHOLD


def test_acceptance_probability_is_min_one_ratio():
    """p = N(0, 1), q = N(1, 1): p(x)/q(x) = exp(1/2 - x); a draft is kept exactly when u < that ratio."""
    x = torch.tensor([[1.5], [3.0], [-1.0]], dtype=torch.float64)
    mq, sq, mp, sp = (torch.tensor([[v]], dtype=torch.float64).expand(3, 1) for v in (1.0, 1.0, 0.0, 1.0))
    ratio = torch.exp(0.5 - x[:, 0])  # 0.37, 0.08, 4.5
    log_ratio = log_density(x, Gaussian(mp, sp)) - log_density(x, Gaussian(mq, sq))
    assert torch.equal(keep(log_ratio, ratio * 0.999), torch.tensor([True, True, True]))
    above = (ratio * 1.001).clamp(max=0.9999)
    assert torch.equal(keep(log_ratio, above), torch.tensor([False, False, True]))


def test_official_ratio_is_the_released_formula():
    """The release's ratio written out as its code computes it: unnormalised densities with both exponents divided
    by 42, times its trajectory factor exp(sum log sigma_p - log sigma_q), times prod sigma_q / prod sigma_p."""
    gen = torch.Generator().manual_seed(4)
    x, mq, mp = (torch.randn(5, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    sq, sp = (0.5 + torch.rand(5, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    log_std_q, log_std_p = torch.randn(5, generator=gen, dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
    t = OFFICIAL_INNER_TEMPERATURE
    q_x = torch.exp(-0.5 * (((x - mq) / sq / t) ** 2).sum(-1))
    p_x = torch.exp(-0.5 * (((x - mp) / sp / t) ** 2).sum(-1))
    released = p_x * torch.exp(log_std_p - log_std_q) * sq.prod(-1) / (q_x * sp.prod(-1))
    ours = official_log_ratio(x, Gaussian(mq, sq), Gaussian(mp, sp)) + official_factor(log_std_q, log_std_p)
    torch.testing.assert_close(torch.exp(ours), released, rtol=1e-12, atol=0)


def test_residual_try_succeeds_with_probability_tv_and_samples_the_residual():
    """The bound of the rejection sampler: one try succeeds with probability TV(p, q); what it returns follows
    max(0, p - q) / TV."""
    n, delta = 200000, 1.0
    gen = torch.Generator().manual_seed(2)
    mp, mq, s = (torch.full((n, 1), v, dtype=torch.float64) for v in (0.0, delta, 1.0))
    r = residual_sample(Gaussian(mp, s), Gaussian(mq, s), torch.randn(n, 2, 1, generator=gen, dtype=torch.float64),
                        torch.rand(n, 1, generator=gen, dtype=torch.float64))
    tv = 2 * normal_cdf(torch.tensor(delta / 2)) - 1
    rate = 1 - r.fell_back.double().mean()
    assert abs(rate - tv) < 4 * math.sqrt(tv * (1 - tv) / n)
    ok = r.sample[~r.fell_back, 0]
    grid = torch.linspace(-8, 8, 20001, dtype=torch.float64)
    dens = (torch.exp(-0.5 * grid ** 2) - torch.exp(-0.5 * (grid - delta) ** 2)).clamp(min=0)
    cdf = torch.cumsum(dens, 0) / dens.sum()
    assert stats.kstest(ok.numpy(), lambda v: np.interp(v, grid.numpy(), cdf.numpy())).pvalue > P_THRESHOLD
    assert (ok < delta / 2).all()  # the residual lives where p > q


def test_fallback_when_tries_run_out_is_a_fresh_target_sample():
    """p == q: the residual is empty, every try fails, and the token takes the fallback (a sample of p, counted)
    instead of the official code's silent zero."""
    n, tries = 5000, 100
    gen = torch.Generator().manual_seed(3)
    m, s = torch.full((n, 2), 2.0, dtype=torch.float64), torch.full((n, 2), 0.5, dtype=torch.float64)
    r = residual_sample(Gaussian(m, s), Gaussian(m, s), torch.randn(n, tries + 1, 2, generator=gen, dtype=torch.float64),
                        torch.rand(n, tries, generator=gen, dtype=torch.float64))
    assert r.fell_back.all() and (r.tries == tries + 1).all()
    assert stats.kstest(r.sample[:, 0].numpy(), "norm", args=(2.0, 0.5)).pvalue > P_THRESHOLD


# ----------------------------------------------------------------------------- the whole decoding loop


class ToyForward:
    """z of every position = the sum of the known tokens of its row (so later drafts depend on earlier ones)."""

    def run(self, tokens, mask, labels):
        total = (tokens[..., 0] * (~mask)).sum(1)
        return {"z": total[:, None, None].expand(-1, tokens.shape[1], 1).clone()}


class ToyHead:
    """A linear Gaussian denoising chain from the token's shared noise: every step ``x' = alpha x + a z + sigma
    eps`` (sigma times the temperature); ``run`` samples it, ``steps`` gives each step's Gaussian along a chain."""

    def __init__(self, alpha, a, sigma):
        self.alpha, self.a, self.sigma = alpha, a, sigma

    def gaussian(self, x, z, temperature):
        return self.alpha * x + self.a * z, self.sigma * temperature[:, None].expand_as(x)

    def run(self, z_cond, z_uncond, cfg, temperature, noise, step_noise):
        x, chain = noise, [noise]
        for k in range(step_noise.shape[1]):
            mean, std = self.gaussian(x, z_cond, temperature)
            x = mean + std * step_noise[:, k]
            chain.append(x)
        return {"mean": mean, "std": std, "sample": x, "chain": torch.stack(chain, 1)}


class ToySteps:
    def __init__(self, head: ToyHead):
        self.head = head

    def run(self, z_cond, z_uncond, cfg, temperature, chain):
        x = chain[:, :-1]
        mean = self.head.alpha * x + self.head.a * z_cond[:, None]
        return {"mean": mean, "std": self.head.sigma * temperature[:, None, None].expand_as(mean)}


TARGET = (0.6, 0.5, 0.6)
DRAFT = (0.3, 0.2, 0.9)
TOY = MARConfig(img_size=2, vae_stride=1, vae_embed_dim=1, class_num=2, num_sampling_steps="2")  # 4 tokens, 2 steps


def toy_pipeline(draft=DRAFT, **options):
    target, drafter = ToyHead(*TARGET), ToyHead(*draft)
    graphs = {"target_forward": ToyForward(), "draft_forward": ToyForward(), "target_head": target,
              "draft_head": drafter, "target_head_steps": ToySteps(target), "draft_head_steps": ToySteps(drafter),
              "latent_decode": None}
    engines = MAREngineSet("toy", TOY, TOY, graphs, torch.device("cpu"), 2)
    # one token per step; the target makes the first, the draft the other three, one verification checks them
    return MARPipeline(engines, MAROptions(num_iter=4, prefill_ratio=0.0, draft_steps=3, **options), max_batch=4000)


def marginal_cdf(x, z, alpha, a, sigma):
    """The token's law after two steps from a standard normal start, given z."""
    mean = a * z * (1 + alpha)
    std = math.sqrt(alpha ** 4 + sigma ** 2 * (1 + alpha ** 2))
    return normal_cdf((x - mean) / std)


def decode_toy(pipe, n=4000, options=None):
    gen = pipe.generate(torch.zeros(n, dtype=torch.long), mode="cspd", seed=11, decode_images=False,
                        **(options or {}))
    # position order per image -> the values in generation order
    orders = torch.stack([torch.randperm(4, generator=g) for g in
                          [torch.Generator().manual_seed(11 + i) for i in range(n)]])
    values = gen.tokens[..., 0].gather(1, orders.flip(1))
    return values, gen


def pit(values, alpha, a, sigma):
    """Probability integral transform under the target's schedule: the first token from an empty context, the
    three drafted ones each from the context of the first (the target decides them in one verification)."""
    first = marginal_cdf(values[:, 0], 0.0, alpha, a, sigma)
    rest = marginal_cdf(values[:, 1:], values[:, :1], alpha, a, sigma)
    return torch.cat([first[:, None], rest], 1)


@pytest.mark.parametrize("rule", ["exact", "trajectory"])
def test_lossless_rules_follow_the_target(rule):
    values, gen = decode_toy(toy_pipeline(accept_rule=rule))
    u = pit(values, *TARGET)
    for j in range(4):
        assert stats.kstest(u[:, j].numpy(), "uniform").pvalue > P_THRESHOLD, j
    # drafted tokens are conditionally independent given the verified context, as the target's one step makes them
    for i, j in ((1, 2), (1, 3), (2, 3)):
        assert stats.pearsonr(u[:, i].numpy(), u[:, j].numpy()).pvalue > P_THRESHOLD
    agg = gen.aggregate()
    assert agg["target_forwards"] == 2 * 4000 and agg["drafter_forwards"] == 3 * 4000
    assert 0.1 < agg["acceptance_rate"] < 0.9
    assert agg["residual_fallbacks"] == 0


@pytest.mark.parametrize("options", [dict(accept_rule="official"), dict(accept_rule="official", official_windows=True)])
def test_the_released_rule_fails_the_same_test(options):
    """The test has power: the released rule (noise-free draft means, the ratio tempered inside the exponents,
    the inverted trajectory factor) is caught by the same goodness-of-fit test."""
    values, gen = decode_toy(toy_pipeline(**options))
    u = pit(values, *TARGET)
    assert min(stats.kstest(u[:, j].numpy(), "uniform").pvalue for j in range(1, 4)) < P_THRESHOLD


@pytest.mark.parametrize("rule", ["exact", "trajectory", "official"])
def test_identical_draft_accepts_everything(rule):
    pipe = toy_pipeline(draft=TARGET, accept_rule=rule)
    _, gen = decode_toy(pipe, n=200)
    # the drafts condition on each other, the target's verification does not: equal heads still differ in z
    assert gen.aggregate()["acceptance_rate"] < 1.0
    same = pipe.generate(torch.zeros(50, dtype=torch.long), mode="cspd", seed=0, decode_images=False, draft_steps=1)
    assert same.aggregate()["acceptance_rate"] == 1.0
