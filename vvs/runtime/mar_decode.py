"""Decoding MAR-style continuous-token models: MAR's own sampler (mode ``ar``) and continuous speculative
decoding (mode ``cspd``, arXiv 2411.11925).

A MAR image is ``L`` continuous tokens generated over ``num_iter`` steps in a random order; each step the model
reads the known tokens (a bidirectional forward) and its diffusion head samples the next batch of tokens.

CSpD: the target runs the first steps; then the draft model runs the steps and, after every ``draft_steps`` of
them (and after the last), the target runs *one* forward over the context of the previous verification and
checks every token drafted since, each with the exact acceptance test of :mod:`vvs.runtime.cspd`. Draft and
target share each token's diffusion noise (trajectory alignment), so both see the same starting point and
their last-step Gaussians are close. The target thus decides every token, as if it had generated each window of
drafted tokens in one step of its own: the output follows the target run on that coarser schedule, exactly.

Randomness is per image (:class:`~vvs.runtime.random.ImageRandom`): the order, then every token's noise, are drawn
up front from the image's seed, so ``ar`` and ``cspd`` with one seed start from the same noise, and an image does
not depend on its batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vvs.runtime.cspd import accept, residual_sample
from vvs.runtime.options import MAROptions
from vvs.runtime.random import ImageRandom
from vvs.runtime.stats import ImageStats, Stopwatch


class MaskSchedule:
    """MAR's cosine schedule: after step ``s``, ``masked_after[s]`` tokens (the first ones of the image's order) are
    still unknown; step ``s`` generates ``order[masked_after[s]:masked_before(s)]``."""

    def __init__(self, seq_len: int, num_iter: int):
        self.seq_len = seq_len
        self.masked_after: list[int] = []
        self.guidance_len: list[int] = []  # the "mask_len" MAR's linear guidance schedule reads
        masked = seq_len
        for step in range(num_iter):
            length = math.floor(seq_len * math.cos(math.pi / 2 * (step + 1) / num_iter))
            length = max(1, min(masked - 1, length))
            self.guidance_len.append(length)
            masked = 0 if step == num_iter - 1 else length
            self.masked_after.append(masked)

    def span(self, step: int) -> tuple[int, int]:
        return self.masked_after[step], (self.seq_len if step == 0 else self.masked_after[step - 1])

    def cfg(self, step: int, opts: MAROptions) -> float:
        if not opts.guided:
            return 1.0
        if opts.cfg_schedule == "constant":
            return opts.cfg_scale
        return 1 + (opts.cfg_scale - 1) * (self.seq_len - self.guidance_len[step]) / self.seq_len


@dataclass
class Drafted:
    positions: torch.Tensor  # [n, k]
    mean: torch.Tensor  # [n, k, C] the draft's last-step Gaussian
    std: torch.Tensor
    cfg: float


class MARDecoder:
    """One batch of images decoded together by :meth:`run`."""

    def __init__(self, engines, labels: torch.Tensor, seeds: list[int], opts: MAROptions):
        cfg = engines.target
        self.engines, self.opts = engines, opts
        self.device = engines.device
        n, L, C = len(labels), cfg.seq_len, cfg.token_embed_dim
        self.labels = labels.to(self.device)
        self.random = ImageRandom(seeds, torch.device("cpu"))
        self.orders = torch.stack([torch.randperm(L, generator=g) for g in self.random.gens]).to(self.device)
        steps = engines.sampling_steps
        self.noise = self.random.normal(L, C).to(self.device)
        self.step_noise = self.random.normal(L, steps, C).to(self.device)
        self.tokens = torch.zeros(n, L, C, device=self.device)
        self.known = torch.zeros(n, L, dtype=torch.bool, device=self.device)
        self.schedule = MaskSchedule(L, opts.num_iter)
        self.stats = [ImageStats(tokens=L) for _ in range(n)]
        self.watch = Stopwatch(self.device)

    # ------------------------------------------------------------------ one model step

    def features(self, role: str, known: torch.Tensor) -> torch.Tensor:
        """The transformer of ``role`` over the current tokens with ``known`` as context (guided: conditional rows
        then unconditional rows)."""
        labels, tokens, known_rows = self.labels, self.tokens, known
        if self.opts.guided:
            null = torch.full_like(labels, self.engines.target.null_label)
            labels, tokens, known_rows = torch.cat([labels, null]), tokens.repeat(2, 1, 1), known.repeat(2, 1)
        return self.engines.graphs[f"{role}_forward"].run(tokens=tokens, mask=~known_rows, labels=labels)["z"]

    def head(self, role: str, z: torch.Tensor, positions: torch.Tensor, cfg: torch.Tensor):
        """The diffusion head of ``role`` for the tokens at ``positions [n, k]`` with guidance ``cfg [n, k]``:
        the last step's Gaussian (mean, std) and the sample drawn from it, each ``[n, k, C]``."""
        n, k = positions.shape
        C = self.tokens.shape[-1]

        def rows(t):
            return t.gather(1, positions.view(n, k, *([1] * (t.dim() - 2))).expand(n, k, *t.shape[2:])).flatten(0, 1)

        z_cond = rows(z[:n])
        z_uncond = rows(z[n:]) if self.opts.guided else z_cond
        out = self.engines.graphs[f"{role}_head"].run(
            z_cond=z_cond, z_uncond=z_uncond, cfg=cfg.flatten().float(),
            temperature=torch.full((n * k,), self.opts.temperature, device=self.device),
            noise=rows(self.noise), step_noise=rows(self.step_noise))
        return tuple(out[name].view(n, k, C) for name in ("mean", "std", "sample"))

    def write(self, positions: torch.Tensor, values: torch.Tensor) -> None:
        self.tokens.scatter_(1, positions[..., None].expand_as(values), values)
        self.known.scatter_(1, positions, True)

    def generate_step(self, role: str, step: int, positions: torch.Tensor):
        self.watch.section("verify" if role == "target" else "draft")
        z = self.features(role, self.known)
        cfg = torch.full(positions.shape, self.schedule.cfg(step, self.opts), device=self.device)
        mean, std, sample = self.head(role, z, positions, cfg)
        self.watch.section("other")
        before = int(self.known[0].sum())
        self.write(positions, sample)
        for s in self.stats:
            s.trace.append([role, before, positions.shape[1]])
            if role == "target":
                s.target_forwards += 1
            else:
                s.drafter_forwards += 1
        return mean, std

    # ------------------------------------------------------------------ verification

    def verify(self, drafted: list[Drafted], context: torch.Tensor) -> None:
        positions = torch.cat([d.positions for d in drafted], 1)
        mean_q = torch.cat([d.mean for d in drafted], 1)
        std_q = torch.cat([d.std for d in drafted], 1)
        cfg = torch.cat([torch.full(d.positions.shape, d.cfg, device=self.device) for d in drafted], 1)
        self.watch.section("verify")
        z = self.features("target", context)
        mean_p, std_p, _ = self.head("target", z, positions, cfg)
        self.watch.section("other")
        n, k, C = mean_q.shape
        x = self.tokens.gather(1, positions[..., None].expand(n, k, C))
        uniforms = self.random.uniform(k).to(self.device)
        kept = accept(x, mean_q, std_q, mean_p, std_p, uniforms, self.opts.accept_temperature)
        tries = self.opts.max_residual_tries
        for i, s in enumerate(self.stats):
            rejected = (~kept[i]).nonzero().flatten()
            if len(rejected):
                g = self.random.gens[i]
                normals = torch.randn(len(rejected), tries + 1, C, generator=g).to(self.device)
                u = torch.rand(len(rejected), tries, generator=g).to(self.device)
                redrawn = residual_sample(mean_p[i, rejected], std_p[i, rejected], mean_q[i, rejected],
                                          std_q[i, rejected], normals, u)
                x[i, rejected] = redrawn.sample.to(x.dtype)
                s.residual_fallbacks += int(redrawn.fell_back.sum())
            s.target_forwards += 1
            s.verified_lengths.append(k)
            s.accept_lengths.append(k - len(rejected))
            s.trace.append(["verify", k, k - len(rejected)])
        self.tokens.scatter_(1, positions[..., None].expand(n, k, C), x)

    # ------------------------------------------------------------------ the loop

    def run(self) -> torch.Tensor:
        """Decode; returns the latents ``[n, L, C]``."""
        opts = self.opts
        speculative = opts.mode == "cspd"
        drafted: list[Drafted] = []
        context = self.known.clone()  # what the target saw when it last decided tokens
        for step in range(opts.num_iter):
            lo, hi = self.schedule.span(step)
            if hi == lo:
                continue
            positions = self.orders[:, lo:hi]
            if not speculative or step < opts.prefill_steps:
                self.generate_step("target", step, positions)
                if speculative:
                    for s in self.stats:
                        s.prefill_forwards += 1
                context = self.known.clone()
                continue
            mean, std = self.generate_step("draft", step, positions)
            drafted.append(Drafted(positions, mean, std, self.schedule.cfg(step, opts)))
            if len(drafted) == opts.draft_steps or step == opts.num_iter - 1:
                self.verify(drafted, context)
                drafted, context = [], self.known.clone()
        seconds = self.watch.take()
        n = len(self.stats)
        for s in self.stats:
            s.seconds += sum(seconds.values()) / n
            s.draft_seconds += seconds["draft"] / n
            s.verify_seconds += seconds["verify"] / n
            s.other_seconds += seconds["other"] / n
        return self.tokens
