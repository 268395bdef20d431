"""Drafter-free speculative Jacobi decoding: SJD (exact), SJD-PAC (exact) and GSD (lossy) in one window loop.

The target refines a window of drafted tokens by itself; there is no drafter. One iteration, for every image of
the batch at once::

    forward [root, x_1 … x_{L-1}]            # one target forward over the window, causal
    test x_i against p_{i-1}, in order       # accept with probability min(1, p(x) / q(x)), q: what x was drawn from
    commit root + the accepted prefix        # the new root: the first rejection's residual sample, or a bonus
    refresh the window past the commit       # the forward's own draws there (q := p), then random tokens

Why SJD is exact: the drafts of one window are drawn independently, each from its recorded ``q``, given
everything before the iteration; the test of ``x_i`` depends on the earlier drafts only through ``p_{i-1}``, so
conditioned on the prefix that was accepted, ``x_i`` is still a draw from ``q_i`` and speculative sampling's
argument applies at every position (Leviathan et al.; SJD, arXiv 2410.01699).

The modes differ in two places only:

- **refresh** -- SJD takes fresh draws from this forward's distributions. SJD-PAC's *adaptive continuation*
  (arXiv 2603.18599) instead keeps every position's own outcome past the first rejection: the old draft where its
  test passed, else its residual draw. That outcome is a draw from ``p`` (the maximal coupling of ``q`` and
  ``p``), so it is recorded with ``q := p`` and SJD's argument still holds, while the window stays put wherever
  the target already agrees, and later iterations accept it.
- **test** -- GSD (arXiv 2508.07747) accepts ``x`` with probability ``min(1, p(G) / q(G))`` over a group ``G`` of
  near-equivalent codes: those ranked next to ``x`` by the target, within ``gsd_prob_gap`` of its probability
  and close to it in the tokenizer's latent space (the codebook LANTERN measures with). The group lends ``x``
  its neighbours' mass, so GSD changes the distribution by design.

Greedy (temperature 0) is Jacobi decoding: a draft is accepted when it is the target's argmax.

Randomness: every iteration takes the same number of uniforms from each image's stream (one per test, one per
output position's draw, one per random refill), so tokens do not depend on the batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vvs.runtime.decode import Decoding, Plan, read_plan, release
from vvs.runtime.random import inverse_cdf


class Jacobi:
    """The window loop; ``d.opts.mode`` is ``"sjd"``, ``"sjd-pac"`` or ``"gsd"``."""

    def __init__(self, d: Decoding):
        self._setup(d)
        vocab = d.cfg.vocab_size
        self.drafts = torch.zeros(d.n, self.L - 1, dtype=torch.long, device=d.dev)
        self.q = torch.zeros(d.n, self.L - 1, vocab, device=d.dev)  # the distribution each draft was drawn from
        d.prefill()
        nothing = torch.zeros(d.n, 1, dtype=torch.long, device=d.dev)
        self.refresh(d.active, nothing.squeeze(1) + self.L, nothing, None, d.random.uniform(self.L - 1))
        self.plan = self.read()

    def _setup(self, d: Decoding) -> None:
        self.d, self.opts = d, d.opts
        self.L = d.opts.window_length
        self.continues = d.opts.mode == "sjd-pac"
        self.grouped = d.opts.mode == "gsd"
        self.offsets = torch.arange(self.L, device=d.dev)
        self.visible = torch.ones(self.L, self.L, dtype=torch.bool, device=d.dev).tril().expand(d.n, -1, -1)
        self.draws = 3 * self.L - 2  # tests, draws per output, refills
        self.latent = F.normalize(d.engines.codebook.float(), dim=-1) if self.grouped else None

    @classmethod
    def combine(cls, parts: list[tuple["Jacobi", torch.Tensor]]) -> "Jacobi":
        loop = cls.__new__(cls)
        loop._setup(Decoding.combine([(p.d, images) for p, images in parts]))
        loop.drafts = torch.cat([p.drafts[images] for p, images in parts])
        loop.q = torch.cat([p.q[images] for p, images in parts])
        loop.plan = loop.read()
        release(parts)
        return loop

    def read(self) -> Plan:
        return read_plan(self.d.active.long(), torch.zeros((), dtype=torch.long, device=self.d.dev))

    def step(self) -> None:
        """One iteration: forward the window → test the drafts → commit → refresh the window."""
        d, L, n = self.d, self.L, self.d.n
        active = d.active
        u = d.random.uniform(self.draws)
        tests, draws, refills = u[:, : L - 1], u[:, L - 1: 2 * L - 1], u[:, 2 * L - 1:]
        ids = torch.cat([d.root[:, None], self.drafts], 1)
        out = d.verify(ids, d.C + d.count[:, None] + self.offsets, self.visible, self.plan.verifying)
        p = d.proc.probs(d.force(out["logits"], d.count[:, None] + 1 + self.offsets))  # output j predicts x_{j+1}
        ok = self.test(p[:, :-1], tests)
        m = ok.long().cumprod(1).sum(1)  # accepted drafts: the prefix before the first rejection
        fresh = self.draw(p, draws)
        outcome = torch.cat([torch.where(ok, self.drafts, self.residual_draw(p[:, :-1], draws[:, :-1])),
                             fresh[:, -1:]], 1)  # per output: the kept draft or its residual draw; a bonus last
        root = outcome.gather(1, m[:, None]).squeeze(1)
        kept = torch.where(active, torch.minimum(m + 1, d.N - d.count), 0)  # nothing past the image's end
        d.kv.commit(out["new_kv"], self.offsets.expand(n, -1), kept)
        d.counters.record(active, "verify", *d.counted(d.count, kept))
        d.counters.add("target_forwards", active)
        d.append_tokens(ids, kept)
        d.root.copy_(torch.where(active, root, d.root))
        self.refresh(active, m, outcome if self.continues else fresh, p, refills)
        self.plan = self.read()

    def test(self, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``[n, L-1]``: whether each draft passes its test against ``p [n, L-1, V]`` (the distribution the
        previous output gives it)."""
        x = self.drafts
        if self.d.proc.greedy:
            best = p.argmax(-1)
            return self.in_group(p, x, best) if self.grouped else x == best
        mass_p, mass_q = p.gather(-1, x[..., None]).squeeze(-1), self.q.gather(-1, x[..., None]).squeeze(-1)
        if self.grouped:
            mass_p, mass_q = self.group_mass(p, x)
        return u * mass_q < mass_p

    def group(self, p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GSD's group of each draft, beside the draft itself: ``(codes [n, L-1, g], member [n, L-1, g])``, the codes
        ranked around ``x`` by ``p`` and whether each is close enough to ``x`` in probability and latent space."""
        opts, vocab = self.opts, p.shape[-1]
        g = opts.gsd_group_size
        order = p.argsort(-1, descending=True)
        px = p.gather(-1, x[..., None])
        rank = (p > px).sum(-1, keepdim=True)
        at = rank + torch.arange(-(g // 2), g - g // 2, device=p.device)
        codes = order.gather(-1, at.clamp(0, vocab - 1))
        distance = (self.latent[codes] - self.latent[x][..., None, :]).pow(2).sum(-1)
        member = ((at >= 0) & (at < vocab) & (codes != x[..., None]) & ((p.gather(-1, codes) - px).abs()
                  < opts.gsd_prob_gap) & (distance < opts.gsd_distance))
        return codes, member

    def group_mass(self, p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        codes, member = self.group(p, x)

        def mass(dist):
            own = dist.gather(-1, x[..., None]).squeeze(-1)
            return own + torch.where(member, dist.gather(-1, codes), 0.0).sum(-1)

        return mass(p), mass(self.q)

    def in_group(self, p: torch.Tensor, x: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
        codes, member = self.group(p, x)
        return (x == best) | (member & (codes == best[..., None])).any(-1)

    def draw(self, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """One token per position of ``p [n, T, V]`` with the uniforms ``u [n, T]`` (argmax when greedy)."""
        if self.d.proc.greedy:
            return p.argmax(-1)
        n, t, vocab = p.shape
        return inverse_cdf(p.reshape(n * t, vocab), u.reshape(-1)).view(n, t)

    def residual_draw(self, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """A draw from ``max(p - q, 0)`` (normalised) at every draft position: what a rejection commits."""
        if self.d.proc.greedy:
            return p.argmax(-1)
        residual = (p - self.q).clamp(min=0)
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)
        return self.draw(residual, u)

    def refresh(self, active: torch.Tensor, m: torch.Tensor, carry: torch.Tensor, p: torch.Tensor | None,
                u: torch.Tensor) -> None:
        """The next window after ``m`` accepted drafts: draft k (stream index ``count + k``, with ``count`` already
        advanced) is ``carry`` at output ``m + k`` with ``q := p`` there while the forward reached it, else a random
        code with a uniform ``q``; the family's forced tokens are placed, with a one-hot ``q``."""
        d, L = self.d, self.L
        vocab = self.q.shape[-1]
        j = m[:, None] + torch.arange(1, L, device=d.dev)
        inside = j < L
        tokens = (u * vocab).long().clamp(max=vocab - 1)
        q = torch.full_like(self.q, 1.0 / vocab)
        if p is not None:
            jj = j.clamp(max=L - 1)
            tokens = torch.where(inside, carry.gather(1, jj), tokens)
            q = torch.where(inside[..., None], p.gather(1, jj[..., None].expand(-1, -1, vocab)), q)
        if d.forced is not None:
            forced = d.forced[(d.count[:, None] + 1 + torch.arange(L - 1, device=d.dev)).clamp(max=len(d.forced) - 1)]
            tokens = torch.where(forced >= 0, forced, tokens)
            q = torch.where((forced >= 0)[..., None], F.one_hot(forced.clamp(min=0), vocab).to(q.dtype), q)
        self.drafts.copy_(torch.where(active[:, None], tokens, self.drafts))
        self.q.copy_(torch.where(active[:, None, None], q, self.q))
