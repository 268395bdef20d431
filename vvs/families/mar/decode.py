"""Decoding MAR-style continuous-token models: MAR's own sampler (mode ``ar``) and continuous speculative
decoding (mode ``cspd``, arXiv 2411.11925).

A MAR image is ``L`` continuous tokens generated over ``num_iter`` steps in a random order; each step the model
reads the known tokens (a bidirectional forward) and its diffusion head samples the next batch of tokens.

CSpD: the target runs the first steps; then the draft model runs the steps and, after every ``draft_steps`` of
them (and after the last), the target runs *one* forward over the context of the previous verification and
checks every token drafted since, each with the exact acceptance test of :mod:`vvs.families.mar.cspd`. Draft and
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
from typing import NamedTuple

import torch

from vvs.families.mar.cspd import (Gaussian, chain_log_density, keep, log_density, official_factor, official_log_ratio,
                              residual_sample, success)
from vvs.families.mar.options import MAROptions
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


class HeadOut(NamedTuple):
    """What a diffusion head gave tokens ``[n, k]``: the last step's Gaussian, the sample, the whole chain."""

    last: Gaussian  # [n, k, C]
    sample: torch.Tensor  # [n, k, C]
    chain: torch.Tensor  # [n, k, S + 1, C]

    @classmethod
    def cat(cls, parts: list["HeadOut"]) -> "HeadOut":
        return cls(Gaussian(*(torch.cat([getattr(h.last, f) for h in parts], 1) for f in ("mean", "std"))),
                   torch.cat([h.sample for h in parts], 1), torch.cat([h.chain for h in parts], 1))


class Conditions(NamedTuple):
    """A transformer's outputs at chosen tokens, flattened to rows ``[m, D]``, and each token's guidance."""

    cond: torch.Tensor
    uncond: torch.Tensor
    cfg: torch.Tensor  # [m]

    def rows(self, index: torch.Tensor) -> "Conditions":
        return Conditions(self.cond[index], self.uncond[index], self.cfg[index])

    @classmethod
    def cat(cls, parts: list["Conditions"], k: list[int]) -> "Conditions":
        """Concatenate per-image blocks: part j holds ``[n * k[j]]`` rows, image-major."""
        def join(name):
            blocks = [getattr(c, name).view(-1, kj, *getattr(c, name).shape[1:]) for c, kj in zip(parts, k)]
            return torch.cat(blocks, 1).flatten(0, 1)

        return cls(join("cond"), join("uncond"), join("cfg"))


@dataclass
class Drafted:
    positions: torch.Tensor  # [n, k]
    head: HeadOut  # the draft's
    conditions: Conditions  # the draft's, at those tokens


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

    def conditions(self, z: torch.Tensor, positions: torch.Tensor, cfg: torch.Tensor) -> Conditions:
        """``z`` at ``positions [n, k]`` with guidance ``cfg [n, k]``, as rows ``[n * k, ...]``."""
        n = positions.shape[0]
        cond = _at(z[:n], positions).flatten(0, 1)
        uncond = _at(z[n:], positions).flatten(0, 1) if self.opts.guided else cond
        return Conditions(cond, uncond, cfg.flatten().float())

    def sample_head(self, role: str, c: Conditions, noise: torch.Tensor, step_noise: torch.Tensor) -> dict:
        """The diffusion sampler of ``role`` over rows."""
        return self.engines.graphs[f"{role}_head"].run(
            z_cond=c.cond, z_uncond=c.uncond, cfg=c.cfg, temperature=self._temperature(len(c.cfg)), noise=noise,
            step_noise=step_noise)

    def head_steps(self, role: str, c: Conditions, chain: torch.Tensor) -> Gaussian:
        """``role``'s Gaussian of every step along ``chain [m, S + 1, C]`` (rows)."""
        out = self.engines.graphs[f"{role}_head_steps"].run(
            z_cond=c.cond, z_uncond=c.uncond, cfg=c.cfg, temperature=self._temperature(len(c.cfg)), chain=chain)
        return Gaussian(out["mean"], out["std"])

    def head(self, role: str, c: Conditions, positions: torch.Tensor) -> HeadOut:
        """The sampler of ``role`` for the tokens at ``positions [n, k]``, with their shared noise."""
        n, k = positions.shape
        out = self.sample_head(role, c, _at(self.noise, positions).flatten(0, 1),
                               _at(self.step_noise, positions).flatten(0, 1))
        shaped = {name: v.view(n, k, *v.shape[1:]) for name, v in out.items()}
        return HeadOut(Gaussian(shaped["mean"], shaped["std"]), shaped["sample"], shaped["chain"])

    def _temperature(self, rows: int) -> torch.Tensor:
        return torch.full((rows,), self.opts.temperature, device=self.device)

    def write(self, positions: torch.Tensor, values: torch.Tensor) -> None:
        self.tokens.scatter_(1, positions[..., None].expand_as(values), values)
        self.known.scatter_(1, positions, True)

    def generate_step(self, role: str, step: int, positions: torch.Tensor) -> Drafted:
        self.watch.section("verify" if role == "target" else "draft")
        z = self.features(role, self.known)
        c = self.conditions(z, positions, torch.full(positions.shape, self.schedule.cfg(step, self.opts),
                                                     device=self.device))
        out = self.head(role, c, positions)
        self.watch.section("other")
        before = int(self.known[0].sum())
        # the released CSpD keeps MAR's sampler, whose last step returns its mean
        self.write(positions, out.last.mean if self.opts.accept_rule == "official" else out.sample)
        for s in self.stats:
            s.trace.append([role, before, positions.shape[1]])
            if role == "target":
                s.target_forwards += 1
            else:
                s.drafter_forwards += 1
        return Drafted(positions, out, c)

    # ------------------------------------------------------------------ verification

    def verify(self, drafted: list[Drafted], context: torch.Tensor, step: int) -> None:
        """One target forward over the context of the previous verification; every drafted token is tested by the
        options' rule and, if rejected, redrawn from the residual."""
        positions = torch.cat([d.positions for d in drafted], 1)
        n, k = positions.shape
        draft = HeadOut.cat([d.head for d in drafted])
        q_cond = Conditions.cat([d.conditions for d in drafted], [d.positions.shape[1] for d in drafted])
        cfg = q_cond.cfg.view(n, k)
        if self.opts.official_windows:  # the release guides every token of a window with its last step's scale
            cfg = torch.full_like(cfg, self.schedule.cfg(step, self.opts))
        self.watch.section("verify")
        p_cond = self.conditions(self.features("target", context), positions, cfg)
        target = self.head("target", p_cond, positions)
        self.watch.section("other")
        x = _at(self.tokens, positions)
        uniforms = self.random.uniform(k).to(self.device)
        rule = self.opts.accept_rule
        if rule == "exact":
            kept = keep(log_density(x, target.last) - log_density(x, draft.last), uniforms)
            redrawn, fallbacks = self.redraw_last_step(~kept, target.last, draft.last, 0.0)
        elif rule == "trajectory":
            chains = draft.chain.flatten(0, 1)
            log_p = chain_log_density(chains, self.head_steps("target", p_cond, chains)).view(n, k)
            log_q = chain_log_density(chains, self.head_steps("draft", q_cond, chains)).view(n, k)
            kept = keep(log_p - log_q, uniforms)
            redrawn, fallbacks = self.redraw_chains(~kept, positions, p_cond, q_cond)
        else:
            factor = official_factor(self.log_std("draft", draft.chain, q_cond),
                                     self.log_std("target", target.chain, p_cond)).view(n, k)
            kept = keep(official_log_ratio(x, draft.last, target.last) + factor, uniforms)
            redrawn, fallbacks = self.redraw_last_step(~kept, target.last, draft.last, -factor)
        x = torch.where(kept[..., None], x, redrawn.to(x.dtype))
        for i, s in enumerate(self.stats):
            accepted = int(kept[i].sum())
            s.residual_fallbacks += int(fallbacks[i])
            s.target_forwards += 1
            s.verified_lengths.append(k)
            s.accept_lengths.append(accepted)
            s.trace.append(["verify", k, accepted])
        self.tokens.scatter_(1, positions[..., None].expand(n, k, x.shape[-1]), x)

    def log_std(self, role: str, chain: torch.Tensor, c: Conditions) -> torch.Tensor:
        """Sum of log sigma (untempered) over every step but the last of ``role``'s own ``chain [n, k, S + 1, C]``:
        the release's trajectory term, ``[n * k]``."""
        std = self.head_steps(role, c, chain.flatten(0, 1)).std[:, :-1].double() / self.opts.temperature
        return torch.log(std).sum((1, 2))

    def redraw_chains(self, rejected: torch.Tensor, positions: torch.Tensor, p: Conditions,
                      q: Conditions) -> tuple[torch.Tensor, list[int]]:
        """Rejected tokens redrawn from ``max(0, P - Q)`` over denoising chains: target chains from the token's
        shared start, fresh step noise, each kept with probability ``1 - Q / P``. Tries run in rounds over every
        pending token of the batch, 1, 1, 2, 4, ... per token (most tokens succeed at once, a few need many tries:
        few rounds and few wasted chains); each image draws its noise from its own stream, in its own order."""
        n, k = rejected.shape
        steps, C = self.engines.sampling_steps, self.tokens.shape[-1]
        start = _at(self.noise, positions).flatten(0, 1)
        values = torch.zeros(n * k, C, device=self.device)
        pending = rejected.flatten().clone()
        tries = 0

        def draw(rows: torch.Tensor, per_row: int, shape: tuple, uniform: bool) -> torch.Tensor:
            counts = torch.bincount(rows // k, minlength=n).tolist()
            fn = torch.rand if uniform else torch.randn
            return torch.cat([fn(c, per_row, *shape, generator=g) for c, g in zip(counts, self.random.gens) if c]
                             ).to(self.device)

        while pending.any() and tries < self.opts.max_residual_tries:
            per_row = min(max(1, tries), self.opts.max_residual_tries - tries)
            rows = pending.nonzero().flatten()  # image-major, as the draws are
            normals, u = draw(rows, per_row, (steps, C), False), draw(rows, per_row, (), True)
            each = rows.repeat_interleave(per_row)
            chains = self.sample_head("target", p.rows(each), start[each], normals.flatten(0, 1))["chain"]
            log_p = chain_log_density(chains, self.head_steps("target", p.rows(each), chains))
            log_q = chain_log_density(chains, self.head_steps("draft", q.rows(each), chains))
            ok = success((log_q - log_p).view(-1, per_row), u)
            got = ok.any(1)
            first = ok.long().argmax(1)
            values[rows[got]] = chains.view(len(rows), per_row, steps + 1, C)[got, first[got], -1]
            pending[rows[got]] = False
            tries += per_row
        rows = pending.nonzero().flatten()
        if len(rows):  # tries exhausted: a fresh sample of the target, counted
            normals = draw(rows, 1, (steps, C), False)[:, 0]
            values[rows] = self.sample_head("target", p.rows(rows), start[rows], normals)["sample"]
        fallbacks = torch.bincount(rows // k, minlength=n).tolist()
        return values.view(n, k, C), fallbacks

    def redraw_last_step(self, rejected: torch.Tensor, p: Gaussian, q: Gaussian,
                         log_q_scale) -> tuple[torch.Tensor, list[int]]:
        """Rejected tokens redrawn from ``max(0, p - c q)`` of the last-step Gaussians, per image (the tries use
        the image's own random stream)."""
        tries = self.opts.max_residual_tries
        values = torch.zeros_like(p.mean)
        scale = torch.as_tensor(log_q_scale, dtype=torch.float64, device=self.device).expand(rejected.shape)
        fallbacks = []
        for i, g in enumerate(self.random.gens):
            r = rejected[i].nonzero().flatten()
            fallbacks.append(0)
            if len(r):
                C = p.mean.shape[-1]
                normals = torch.randn(len(r), tries + 1, C, generator=g).to(self.device)
                u = torch.rand(len(r), tries, generator=g).to(self.device)
                out = residual_sample(Gaussian(p.mean[i, r], p.std[i, r]), Gaussian(q.mean[i, r], q.std[i, r]),
                                      normals, u, scale[i, r])
                values[i, r] = out.sample.to(values.dtype)
                fallbacks[-1] = int(out.fell_back.sum())
        return values, fallbacks

    # ------------------------------------------------------------------ the loop

    def window_ends(self, step: int, drafted: int) -> bool:
        """Verify after every ``draft_steps`` draft steps (the release: at steps that are multiples of it)."""
        opts = self.opts
        if step == opts.num_iter - 1:
            return True
        return step % opts.draft_steps == 0 if opts.official_windows else drafted == opts.draft_steps

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
            drafted.append(self.generate_step("draft", step, positions))
            if self.window_ends(step, len(drafted)):
                self.verify(drafted, context, step)
                drafted, context = [], self.known.clone()
        seconds = self.watch.take()
        n = len(self.stats)
        for s in self.stats:
            s.seconds += sum(seconds.values()) / n
            s.draft_seconds += seconds["draft"] / n
            s.verify_seconds += seconds["verify"] / n
            s.other_seconds += seconds["other"] / n
        return self.tokens


def _at(t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``t [n, L, ...]`` at ``positions [n, k]``: ``[n, k, ...]``."""
    n, k = positions.shape
    return t.gather(1, positions.view(n, k, *([1] * (t.dim() - 2))).expand(n, k, *t.shape[2:]))
