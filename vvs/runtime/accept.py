"""Tree acceptance: greedy (longest path the target agrees with) and speculative sampling over the tree, both
optionally relaxed by LANTERN's latent neighbourhoods.

Sampling walks down from the root: at each node it tries the children in drafter order, accepting child ``x``
with probability ``p(x)`` (+ LANTERN's extra mass) under the current, residual-updated target distribution
``p``; a rejection zeroes ``p(x)`` (and the neighbours whose mass was lent to it) and renormalises. When no
child is accepted the next token is drawn from that residual. Drafts are deterministic top-k picks (q = 1),
so without relaxation this is exact sampling from the target (EAGLE-2's multi-candidate rejection).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vvs.runtime.random import inverse_cdf
from vvs.runtime.tree import DraftTree


@dataclass
class Accepted:
    nodes: torch.Tensor  # [n, max_path] accepted tree nodes, root first, -1 padded
    length: torch.Tensor  # [n] accepted nodes, root included (= accepted drafts + 1)
    bonus: torch.Tensor  # [n] the next root: sampled (or argmax) from the last accepted node's distribution


@dataclass
class Relaxation:
    """LANTERN: ``neighbours [V, k]`` are each code's nearest codes in latent space (nearest first)."""

    neighbours: torch.Tensor
    delta: float

    def lend(self, p: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mass that may move onto ``x``: the longest neighbour prefix with total ≤ δ (``δ > 1``: ≤ (δ-1)·p(x)).
        Returns ``(extra [...], prefix_len [...])`` for ``p [..., V]`` and tokens ``x [...]``."""
        nb = self.neighbours[x]
        prefix = p.gather(-1, nb).cumsum(-1)
        bound = (self.delta - 1) * p.gather(-1, x[..., None]) if self.delta > 1 else torch.full_like(prefix[..., :1], self.delta)
        m = (prefix <= bound).sum(-1)
        extra = torch.where(m > 0, prefix.gather(-1, (m - 1).clamp(min=0)[..., None]).squeeze(-1), 0.0)
        return extra, m


def greedy_accept(tree: DraftTree, logits: torch.Tensor, relax: Relaxation | None) -> Accepted:
    """``logits [n, T, V]`` of the tree nodes. A draft is accepted when it is its parent's argmax (LANTERN: when
    its probability plus the lent neighbour mass is at least every other token's)."""
    n, t = tree.tokens.shape
    img = torch.arange(n, device=logits.device)
    parent = tree.parent.clamp(min=0)
    parent_logits = logits[img[:, None], parent]  # [n, T, V]
    x = tree.tokens
    if relax is None:
        ok = parent_logits.argmax(-1) == x
    else:
        p = torch.softmax(parent_logits.float(), dim=-1)
        extra, _ = relax.lend(p, x)
        px = p.gather(-1, x[..., None]).squeeze(-1)
        others = p.scatter(-1, x[..., None], float("-inf")).amax(-1)
        ok = px + extra >= others
    ok[:, 0] = True
    # a node counts only if every node on its root path is accepted
    on_path_rejected = (tree.ancestors & ~ok[:, None, :]).any(-1)
    reach = ~on_path_rejected
    score = torch.where(reach, tree.depth * t - torch.arange(t, device=x.device), -1)  # deepest, then earliest
    last = score.argmax(-1)
    bonus = logits[img, last].argmax(-1)
    return Accepted(tree.path_nodes(last, tree.max_depth + 1), tree.depth[img, last] + 1, bonus)


def sample_accept(tree: DraftTree, probs: torch.Tensor, relax: Relaxation | None, max_children: int,
                  u: torch.Tensor) -> Accepted:
    """``probs [n, T, V]``: the processed target distribution at every node. ``u [n, >= accept_draws(...)]``:
    each image's uniforms, read by position — column 0 draws the bonus token, column ``1 + l * max_children + j``
    decides the j-th child tried at depth l — so an image consumes the same values whatever its batch holds.

    Nodes are visited once each, in index order: that is depth by depth (the drafter proposes level after level)
    and, among siblings, in drafter preference. A node is tried when its parent is where the walk stands, so the
    walk needs no early exit (which would read the device) and costs one pass over the tree."""
    n, t, _ = probs.shape
    dev = probs.device
    # each node's rank among its siblings, which picks its uniform
    earlier = torch.ones(t, t, dtype=torch.bool, device=dev).tril(-1)  # [node, other]: other comes first
    rank = ((tree.parent[:, :, None] == tree.parent[:, None, :]) & earlier).sum(-1)
    column = 1 + (tree.depth - 1).clamp(min=0) * max_children + rank
    node = torch.zeros(n, dtype=torch.long, device=dev)
    p = probs[:, 0].clone()
    path = torch.full((n, tree.max_depth + 1), -1, dtype=torch.long, device=dev)
    path[:, 0] = 0
    for child in range(1, t):
        x = tree.tokens[:, child]
        trying = tree.parent[:, child] == node
        px = p.gather(1, x[:, None]).squeeze(1)
        extra, lent = relax.lend(p, x) if relax is not None else (0.0, None)
        accept = trying & (u.gather(1, column[:, child : child + 1]).squeeze(1) < px + extra)
        # a rejection removes x (and the neighbours that lent it mass) from p, renormalised
        residual = p.scatter(1, x[:, None], 0.0)
        if relax is not None:
            nb = relax.neighbours[x]
            lender = torch.arange(nb.shape[1], device=dev) < lent[:, None]
            residual = residual.scatter(1, nb, torch.where(lender, 0.0, residual.gather(1, nb)))
        total = residual.sum(1, keepdim=True)
        residual = torch.where(total > 0, residual / total.clamp_min(1e-30), 1.0 / p.shape[1])
        p = torch.where(accept[:, None], probs[:, child], torch.where(trying[:, None], residual, p))
        node = torch.where(accept, child, node)
        path.scatter_(1, tree.depth[:, child : child + 1], torch.where(accept, child, path.gather(
            1, tree.depth[:, child : child + 1]).squeeze(1))[:, None])
    bonus = inverse_cdf(p, u[:, 0])
    return Accepted(path, (path >= 0).sum(1), bonus)


def accept_draws(max_depth: int, max_children: int) -> int:
    """Uniforms :func:`sample_accept` reads per image for trees up to ``max_depth`` drafts deep."""
    return 1 + max_depth * max_children
