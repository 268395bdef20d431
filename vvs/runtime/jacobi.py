"""Drafter-free speculative Jacobi decoding: SJD (exact), SJD-PAC (exact) and GSD (lossy) in one window loop.

The target refines a window of drafted tokens by itself; there is no drafter. One iteration, for every image of
the batch at once::

    forward [root, drafts]                   # one target forward over the window (a fixed tree-then-chain shape)
    walk the drafts from the root            # accept x with probability min(1, p(x) / q(x)), q: what x was drawn from
    commit root + the accepted path          # the new root: the rejection's residual draw, or a bonus draw
    refresh the window past the commit       # this forward's draws there (q := p), then random tokens

Why SJD is exact: the drafts of one window are drawn independently per position, each from its recorded ``q``,
given everything before the iteration; the test at position ``c`` depends on the earlier drafts only through
``p_{c-1}``, so conditioned on the accepted prefix the draft at ``c`` is still a draw from ``q_c``, and speculative
sampling's argument applies at every position (SJD, arXiv 2410.01699).

SJD-PAC (arXiv 2603.18599) adds two things, both kept exact here:

- **Adaptive continuation** -- past the first rejection SJD takes fresh draws from this forward's distributions;
  SJD-PAC keeps each position's own outcome instead: the old draft where its test (against the main path's
  output) passed, else a residual draw. That outcome is a draw from ``p`` (the maximal coupling of ``q`` and
  ``p``), so it is recorded with ``q := p``, and the window stays put wherever the target already agrees.
- **Proactive drafting** -- the window opens with a tree: ``K`` candidates at each of its first ``D - 1``
  positions, drawn without replacement from that position's ``q`` (the first is the continued draft), every node
  at a position holding that position's candidates as children. The walk tries a node's children in order,
  recursive rejection sampling for drafts drawn without replacement (after a rejected ``x``: ``p`` becomes its
  normalised residual ``max(p - q, 0)``, ``q`` loses ``x`` and is renormalised); the first accepted child is
  taken. Past the tree, a chain continues the first candidate's path ("the main path").

``pac_rule="official"`` walks the tree as SJD-PAC's released code does, to compare with the paper: every node is
tested as if its earlier siblings had been rejected, the longest accepted path is taken, and the other candidates
are drawn from the first one's residual, with replacement. A later sibling then wins only because its subtree went
deeper, and the candidates are not the draws the test assumes, so this rule changes the distribution (the PIT test
fails it); the default rule is exact.

GSD (arXiv 2508.07747) accepts ``x`` with probability ``min(1, p(G) / q(G))`` over a group ``G`` of
near-equivalent codes: those the target ranks next to ``x``, within ``gsd_prob_gap`` of its probability and close
to it in the tokenizer's latent space (the released code measures the target's input embeddings; vvs the
codebook, as LANTERN does). The group lends ``x`` its neighbours' mass, so GSD changes the distribution by design;
it lends only to a code the target's filter keeps (``p(x) > 0``), as LANTERN's relaxation does, so no draft that
top-k or top-p removed is committed.

Greedy (temperature 0) is Jacobi decoding: a draft is accepted when it is the target's argmax (GSD: when the
argmax is in its group).

Randomness: every iteration takes the same number of uniforms from each image's stream, each read by position,
so tokens do not depend on the batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vvs.runtime.decode import Decoding, Plan, read_active, release
from vvs.runtime.random import inverse_cdf


class WindowLayout:
    """The fixed shape of one window forward: ``length`` nodes; a tree of ``width`` candidates at each of the first
    ``levels`` positions; then a chain under the main path (every node's first child) to fill the window.

    Candidates belong to positions: every node at position ``c`` that is a ``b``-th child holds the ``b``-th
    candidate drawn for ``c``, so an image's window is ``candidates [n, positions, width]``."""

    def __init__(self, length: int, width: int, levels: int, device):
        column, sibling, parent = [0], [0], [-1]
        frontier = [0]
        for level in range(1, levels + 1):
            frontier_next = []
            for p in frontier:
                for b in range(width):
                    column.append(level)
                    sibling.append(b)
                    parent.append(p)
                    frontier_next.append(len(column) - 1)
            frontier = frontier_next
        main = [0]
        for _ in range(levels):
            main.append(next(i for i in range(len(column)) if parent[i] == main[-1] and sibling[i] == 0))
        if len(column) >= length:
            raise ValueError(f"a window of {length} has no room past its tree of {len(column)} nodes")
        while len(column) < length:
            column.append(column[main[-1]] + 1)
            sibling.append(0)
            parent.append(main[-1])
            main.append(len(column) - 1)
        self.length, self.width, self.levels = length, width, levels
        self.positions = len(main) - 1
        self.column = torch.tensor(column, device=device)
        self.sibling = torch.tensor(sibling, device=device)
        self.main = torch.tensor(main, device=device)
        child = torch.full((length, width), -1, dtype=torch.long)
        ancestors = torch.eye(length, dtype=torch.bool)
        for i in range(1, length):
            child[parent[i], sibling[i]] = i
            ancestors[i] |= ancestors[parent[i]]
        self.child = child.to(device)
        self.ancestors = ancestors.to(device)
        rows = []  # the tree's root-to-leaf paths, the main path first (breadth-first order puts it there)
        for leaf in (i for i in range(length) if column[i] == levels):
            nodes = [leaf]
            while parent[nodes[0]] >= 0:
                nodes.insert(0, parent[nodes[0]])
            rows.append(nodes)
        self.rows = torch.tensor(rows, device=device)  # [K^levels, levels + 1]
        self.level_nodes = [[i for i in range(length) if column[i] == c] for c in range(levels)]


class Jacobi:
    """The window loop; ``d.opts.mode`` is ``"sjd"``, ``"sjd-pac"`` or ``"gsd"`` (greedy SJD-PAC walks its tree the
    same way under either rule: the rules differ in how they sample)."""

    def __init__(self, d: Decoding):
        self._setup(d)
        w = self.window
        self.candidates = torch.zeros(d.n, w.positions, w.width, dtype=torch.long, device=d.dev)
        self.q = torch.zeros(d.n, w.positions, d.cfg.vocab_size, device=d.dev)  # what each position's drafts came from
        d.prefill()
        outside = torch.full((d.n,), w.positions + 1, dtype=torch.long, device=d.dev)  # nothing carried: all random
        u = d.random.uniform(w.positions * w.width)
        siblings = u[:, : w.positions * (w.width - 1)].view(d.n, w.positions, w.width - 1)
        self.refresh(d.active, outside, None, None, siblings, u[:, w.positions * (w.width - 1):])
        self.plan = self.read()

    def _setup(self, d: Decoding) -> None:
        opts = d.opts
        self.d, self.opts = d, opts
        self.continues = opts.mode == "sjd-pac"
        self.grouped = opts.mode == "gsd"
        self.official = self.continues and opts.pac_rule == "official"
        width, depth = (opts.pac_tree_width, opts.pac_tree_depth) if self.continues else (1, 1)
        if width == 1 or depth == 1:  # a plain chain
            width, depth = 1, 1
        self.window = WindowLayout(opts.window_length, width, depth - 1, d.dev)
        positions = self.window.positions
        # tests per candidate, one draw per position and one past the window, sibling draws, random refills
        self.uniforms_per_step = positions * width + positions + 1 + positions * (width - 1) + positions
        self.latent = F.normalize(d.engines.codebook.float(), dim=-1) if self.grouped else None

    @classmethod
    def combine(cls, parts: list[tuple["Jacobi", torch.Tensor]]) -> "Jacobi":
        loop = cls.__new__(cls)
        loop._setup(Decoding.combine([(p.d, images) for p, images in parts]))
        loop.candidates = torch.cat([p.candidates[images] for p, images in parts])
        loop.q = torch.cat([p.q[images] for p, images in parts])
        loop.plan = loop.read()
        release(parts)
        return loop

    def read(self) -> Plan:
        return read_active(self.d)

    def step(self) -> None:
        """One iteration: forward the window → walk the drafts → commit → refresh the window."""
        d, w, n = self.d, self.window, self.d.n
        P, K = w.positions, w.width
        active = d.active
        u = d.random.uniform(self.uniforms_per_step)
        tests, u = u[:, : P * K].view(n, P, K), u[:, P * K:]
        draws, u = u[:, : P + 1], u[:, P + 1:]
        siblings, refills = u[:, : P * (K - 1)].view(n, P, K - 1), u[:, P * (K - 1):]
        ids = torch.cat([d.root[:, None], self.candidates[:, w.column[1:] - 1, w.sibling[1:]]], 1)
        out = d.verify(ids, d.C + d.count[:, None] + w.column, w.ancestors.expand(n, -1, -1), self.plan.verifying)
        # node i's output predicts position column[i] + 1
        p = d.proc.probs(d.force(out["logits"], d.count[:, None] + 1 + w.column))
        along = p[:, w.main]  # [n, P + 1, V]: the main path's outputs; along[:, c] predicts position c + 1
        first = self.candidates[:, :, 0]
        # once per position, for the walk's chain and SJD-PAC's continuation alike: whether the first candidate
        # passes its test against the main path, and what a rejection there draws (past the window: a bonus)
        passes = self.test(along[:, :P], first, self.q, tests[:, :, 0])
        outcomes = torch.cat([self.residual_draw(along[:, :P], self.q, draws[:, :P]),
                              self.draw(along[:, P:], draws[:, P:])], 1)
        path, accepted, root = self.walk(p, tests, draws, passes, outcomes)
        kept = torch.where(active, torch.minimum(accepted + 1, d.N - d.count), 0)  # nothing past the image's end
        d.kv.commit(out["new_kv"], path, kept)
        d.counters.record(active, "verify", *d.counted(d.count, kept))
        d.counters.add("target_forwards", active)
        d.append_tokens(ids.gather(1, path), kept)
        d.root.copy_(torch.where(active, root, d.root))
        if self.continues:  # each position's own outcome: the first candidate where it passed, else its residual draw
            carry = torch.cat([torch.where(passes, first, outcomes[:, :P]), outcomes[:, P:]], 1)
        else:
            carry = self.draw(along, draws)
        self.refresh(active, accepted, carry, along, siblings, refills)
        self.plan = self.read()

    def walk(self, p: torch.Tensor, tests: torch.Tensor, draws: torch.Tensor, passes: torch.Tensor,
             outcomes: torch.Tensor):
        """From the root: the tree's candidates, then the chain along the main path (``passes`` and ``outcomes`` past
        the tree). Returns the nodes of the committed tokens ``[n, P + 1]``, the accepted drafts ``[n]`` and the new
        root ``[n]``."""
        d, w = self.d, self.window
        walk_tree = self.tree_official if self.official and not d.proc.greedy else self.tree_walk
        path, cur, alive, accepted, root = walk_tree(p, tests, draws)
        on_main = alive & (cur == w.main[w.levels])  # the window always has a chain past its tree
        leaf = alive & ~on_main  # a walk that left the main path ends with the tree: a bonus draw there
        root = torch.where(leaf, self.draw(p[d.arange, cur][:, None], draws[:, w.levels: w.levels + 1])[:, 0], root)
        m = passes[:, w.levels:].long().cumprod(1).sum(1)
        root = torch.where(on_main, outcomes[:, w.levels:].gather(1, m[:, None])[:, 0], root)
        accepted += torch.where(on_main, m, 0)
        return path, accepted, root

    def tree_walk(self, p: torch.Tensor, tests: torch.Tensor, draws: torch.Tensor):
        """Recursive rejection over the tree's candidates, level by level: the first accepted child is taken.
        Returns ``(path, node reached, still going, accepted drafts, root where it stopped)``."""
        d, w = self.d, self.window
        img, greedy = d.arange, d.proc.greedy
        path = w.main.expand(d.n, -1).clone()
        cur = torch.zeros(d.n, dtype=torch.long, device=d.dev)
        alive = torch.ones(d.n, dtype=torch.bool, device=d.dev)
        accepted = torch.zeros(d.n, dtype=torch.long, device=d.dev)
        root = torch.zeros(d.n, dtype=torch.long, device=d.dev)
        for c in range(1, w.levels + 1):
            target, q = p[img, cur], self.q[:, c - 1]
            taken, nxt = torch.zeros_like(alive), cur.clone()
            for b in range(w.width):
                x = self.candidates[:, c - 1, b]
                trying = alive & ~taken
                px, qx = target.gather(1, x[:, None])[:, 0], q.gather(1, x[:, None])[:, 0]
                ok = trying & ((x == target.argmax(-1)) if greedy else (tests[:, c - 1, b] * qx < px))
                nxt = torch.where(ok, w.child[cur, b], nxt)
                taken |= ok
                if not greedy:
                    rejected = (trying & ~ok)[:, None]
                    after = self.reject(target, q, x)
                    target, q = (torch.where(rejected, new, old) for new, old in zip(after, (target, q)))
            stop = alive & ~taken
            root = torch.where(stop, self.draw(target[:, None], draws[:, c - 1: c])[:, 0], root)
            accepted += (alive & taken).long()
            cur = torch.where(alive & taken, nxt, cur)
            path[:, c] = cur
            alive &= taken
        return path, cur, alive, accepted, root

    def tree_official(self, p: torch.Tensor, tests: torch.Tensor, draws: torch.Tensor):
        """The released code's walk: every child tested against its parent's residual after its earlier siblings,
        whether they were accepted or not, and the longest accepted root-to-leaf path taken (the main path on a
        tie). Same returns as :meth:`tree_walk`."""
        d, w = self.d, self.window
        ok = torch.ones(d.n, w.length, dtype=torch.bool, device=d.dev)
        residual = {}  # per parent node: what is left of its distribution after all its children
        for c in range(1, w.levels + 1):
            q0 = self.q[:, c - 1]
            for parent in w.level_nodes[c - 1]:
                target, q = p[:, parent], q0
                for b in range(w.width):
                    x = self.candidates[:, c - 1, b]
                    px, qx = target.gather(1, x[:, None])[:, 0], q.gather(1, x[:, None])[:, 0]
                    ok[:, w.child[parent, b]] = tests[:, c - 1, b] * qx < px
                    target, q = self.reject(target, q, x)
                residual[parent] = target
        lengths = ok[:, w.rows[:, 1:]].long().cumprod(-1).sum(-1)  # [n, rows]
        best = lengths.argmax(-1)  # the first longest: the main path wins ties
        accepted = lengths.gather(1, best[:, None])[:, 0]
        path = w.main.expand(d.n, -1).clone()
        path[:, : w.levels + 1] = w.rows[best]
        cur = path.gather(1, accepted[:, None])[:, 0]
        left = p.clone()
        for node, dist in residual.items():
            left[:, node] = dist
        root = self.draw(left[d.arange, cur][:, None], draws.gather(1, accepted[:, None]))[:, 0]
        return path, cur, accepted == w.levels, accepted, root

    @staticmethod
    def reject(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the next candidate faces after ``x`` was rejected: ``p``'s normalised residual, and ``q`` without
        ``x`` (the candidates are drawn without replacement), renormalised."""
        return _normalised((p - q).clamp(min=0), p), _normalised(q.scatter(1, x[:, None], 0.0), q)

    def test(self, p: torch.Tensor, x: torch.Tensor, q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Whether each draft ``x [n, T]``, drawn from ``q [n, T, V]``, passes its test against ``p [n, T, V]``."""
        if self.d.proc.greedy:
            best = p.argmax(-1)
            return self.in_group(p, x, best) if self.grouped else x == best
        if self.grouped:
            mass_p, mass_q = self.group_mass(p, q, x)
        else:
            mass_p, mass_q = p.gather(-1, x[..., None]).squeeze(-1), q.gather(-1, x[..., None]).squeeze(-1)
        return u * mass_q < mass_p

    def group(self, p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GSD's group of each draft, beside the draft itself: ``(codes [..., g], member [..., g])``, the codes ranked
        around ``x`` by ``p`` and whether each is close enough to ``x`` in probability and latent space."""
        # only sampled codes can join a group: codes above them (an inflated head's, a forced end-of-line token)
        # have no latent and no mass where the model chooses; a forced draft forms no group
        p = p[..., : len(self.d.cfg.sampled_ids)]
        opts, vocab = self.opts, p.shape[-1]
        free = x < vocab
        x = x.clamp(max=vocab - 1)
        g = opts.gsd_group_size
        order = p.argsort(-1, descending=True)
        px = p.gather(-1, x[..., None])
        rank = (p > px).sum(-1, keepdim=True)
        at = rank + torch.arange(-(g // 2), g - g // 2, device=p.device)
        codes = order.gather(-1, at.clamp(0, vocab - 1))
        distance = (self.latent[codes] - self.latent[x][..., None, :]).pow(2).sum(-1)
        # a draft the target's filter removed forms no group, so its test fails on its own mass of 0: top-k and top-p
        # say which codes may appear at all, and the kept codes ranked just above it must not lend it theirs
        member = (free[..., None] & (px > 0) & (at >= 0) & (at < vocab) & (codes != x[..., None])
                  & ((p.gather(-1, codes) - px).abs() < opts.gsd_prob_gap) & (distance < opts.gsd_distance))
        return codes, member

    def group_mass(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        codes, member = self.group(p, x)

        def mass(dist):
            own = dist.gather(-1, x[..., None]).squeeze(-1)
            return own + torch.where(member, dist.gather(-1, codes), 0.0).sum(-1)

        return mass(p), mass(q)

    def in_group(self, p: torch.Tensor, x: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
        codes, member = self.group(p, x)
        return (x == best) | (member & (codes == best[..., None])).any(-1)

    def draw(self, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """One token per position of ``p [n, T, V]`` with the uniforms ``u [n, T]`` (argmax when greedy)."""
        if self.d.proc.greedy:
            return p.argmax(-1)
        n, t, vocab = p.shape
        return inverse_cdf(p.reshape(n * t, vocab), u.reshape(-1)).view(n, t)

    def residual_draw(self, p: torch.Tensor, q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """A draw from ``max(p - q, 0)`` (normalised) at every position: what a rejection commits."""
        if self.d.proc.greedy:
            return p.argmax(-1)
        return self.draw(_normalised((p - q).clamp(min=0), p), u)

    def refresh(self, active: torch.Tensor, accepted: torch.Tensor, carry: torch.Tensor | None,
                along: torch.Tensor | None, siblings: torch.Tensor, refills: torch.Tensor) -> None:
        """The next window after ``accepted`` drafts. Position k (stream index ``count + k``, ``count`` already
        advanced) was position ``accepted + 1 + k`` of this window: its first candidate is ``carry`` there, with
        ``q :=`` the main path's distribution, while the forward reached it, else a random code with a uniform
        ``q`` over the codes the model samples; the tree's other candidates are drawn from ``q`` without replacement; forced tokens are placed with a
        one-hot ``q``."""
        d, w = self.d, self.window
        vocab, codes = self.q.shape[-1], d.cfg.sampled_ids
        P = w.positions
        first = codes.start + (refills * len(codes)).long().clamp(max=len(codes) - 1)
        q = torch.zeros_like(self.q)
        q[..., codes.start : codes.stop] = 1.0 / len(codes)
        if carry is not None:
            j = accepted[:, None] + torch.arange(1, P + 1, device=d.dev)  # index of the old position - 1
            inside, jj = j <= P, j.clamp(max=P)
            first = torch.where(inside, carry.gather(1, jj), first)
            q = torch.where(inside[..., None], along.gather(1, jj[..., None].expand(-1, -1, vocab)), q)
        candidates = first[..., None].repeat(1, 1, w.width)
        others = None
        if self.official and not d.proc.greedy:  # the released code: from the old draft's residual where one was
            # tested, with replacement (greedy draws are argmaxes: they would repeat the first candidate)
            others = q
            if carry is not None:
                old = self.q.gather(1, jj.clamp(max=P - 1)[..., None].expand(-1, -1, vocab))
                others = torch.where((inside & (j < P))[..., None], _normalised((q - old).clamp(min=0), q), q)
        for c in range(w.levels):
            left = q[:, c].scatter(1, first[:, c, None], 0.0)
            for b in range(1, w.width):
                u = siblings[:, c, b - 1: b]
                if others is None:  # without replacement from q
                    pick = self.draw(_normalised(left, q[:, c])[:, None], u)[:, 0]
                    left = left.scatter(1, pick[:, None], 0.0)
                else:
                    pick = self.draw(others[:, c, None], u)[:, 0]
                candidates[:, c, b] = pick
        if d.forced is not None:
            forced = d.forced[(d.count[:, None] + 1 + torch.arange(P, device=d.dev)).clamp(max=len(d.forced) - 1)]
            candidates = torch.where((forced >= 0)[..., None], forced[..., None], candidates)
            q = torch.where((forced >= 0)[..., None], F.one_hot(forced.clamp(min=0), vocab).to(q.dtype), q)
        self.candidates.copy_(torch.where(active[:, None, None], candidates, self.candidates))
        self.q.copy_(torch.where(active[:, None, None], q, self.q))


def _normalised(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``weights`` over the last axis normalised to 1; where they are all zero, ``fallback``."""
    total = weights.sum(-1, keepdim=True)
    return torch.where(total > 0, weights / total.clamp_min(1e-30), fallback)
