"""Tree acceptance: greedy (longest path the target agrees with) and speculative sampling over the tree, both
optionally relaxed by LANTERN's latent neighbourhoods.

Sampling walks down from the root: at each node it tries the children in drafter order, accepting child ``x``
with probability ``p(x)`` (+ LANTERN's extra mass) under the current, residual-updated target distribution
``p``; a rejection zeroes ``p(x)`` (and the neighbours whose mass was lent to it) and renormalises. When no
child is accepted the next token is drawn from that residual. LANTERN's relaxation changes the output
distribution by design; without it this is exact. Drafts are deterministic top-k picks (q = 1),
so without relaxation this is exact sampling from the target (EAGLE-2's multi-candidate rejection).

The relaxation lends mass only to a code the target's filter keeps (``p(x) > 0`` before any rejection): top-k and
top-p say which codes may appear at all, and neighbours' mass must not bring back one they removed. The official
LANTERN and VVS code lends to any code, so with both filters on they can commit codes of target probability 0.
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

    def extra(self, mass: torch.Tensor, px: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mass that may move onto a token ``x`` of probability ``px [...]``: the longest prefix of its neighbours'
        probabilities ``mass [..., k]`` (nearest first) with total ≤ δ (``δ > 1``: ≤ (δ-1)·p(x)). Returns
        ``(extra [...], lenders [...])``, the second counting the neighbours in that prefix."""
        prefix = mass.cumsum(-1)
        bound = (self.delta - 1) * px[..., None] if self.delta > 1 else torch.full_like(prefix[..., :1], self.delta)
        m = (prefix <= bound).sum(-1)
        extra = torch.where(m > 0, prefix.gather(-1, (m - 1).clamp(min=0)[..., None]).squeeze(-1), 0.0)
        return extra, m


def greedy_accept(tree: DraftTree, logits: torch.Tensor, relax: Relaxation | None) -> Accepted:
    """``logits [n, T, V]`` of the tree nodes. A draft is accepted when it is its parent's argmax (LANTERN: when
    its probability plus the lent neighbour mass is at least every other token's)."""
    n, t = tree.tokens.shape
    img = torch.arange(n, device=logits.device)
    parent = tree.parent.clamp(min=0)
    x = tree.tokens
    if relax is None:
        ok = logits.argmax(-1).gather(1, parent) == x
    else:
        p = torch.softmax(logits.float(), dim=-1)
        top2 = p.topk(2, dim=-1)  # the best token other than x: the first of the two that is not x
        px = _at_parent(p, parent, x[..., None])[..., 0]
        first, second = (top2.indices.gather(1, parent[..., None].expand(-1, -1, 2))).unbind(-1)
        best_value, second_value = (top2.values.gather(1, parent[..., None].expand(-1, -1, 2))).unbind(-1)
        others = torch.where(first == x, second_value, best_value)
        nb = relax.neighbours[x]
        extra, _ = relax.extra(_at_parent(p, parent, nb), px)
        ok = (px + extra >= others) & (px > 0)
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

    The walk (from the root, try the children in order until one is accepted, move there) is computed for every
    node at once: the test a child faces depends only on its parent's distribution and on which of its earlier
    siblings were rejected, so all parents advance together, sibling rank by sibling rank (at most
    ``max_children`` steps, each over the nodes of that rank and their candidate codes), and the walk is then read
    off as the chain of accepted children. Nothing is sized by the vocabulary except one mask of what each parent's
    rejections removed."""
    n, t, vocab = probs.shape
    dev = probs.device
    earlier = torch.ones(t, t, dtype=torch.bool, device=dev).tril(-1)  # [node, other]: other comes first
    rank = ((tree.parent[:, :, None] == tree.parent[:, None, :]) & earlier).sum(-1)
    rank[:, 0] = max_children  # the root is nobody's child
    column = 1 + (tree.depth - 1).clamp(min=0) * max_children + rank.clamp(max=max_children - 1)
    parent = tree.parent.clamp(min=0)
    flat = probs.reshape(n, t * vocab)
    # removed[i, P * V + c]: code c left parent P's residual (a rejected child, or a neighbour that lent it mass);
    # the spare last column takes the writes of nodes that do not change anything
    removed = torch.zeros(n, t * vocab + 1, dtype=torch.bool, device=dev)
    removed_mass = torch.zeros(n, t, dtype=probs.dtype, device=dev)  # per parent
    settled = torch.zeros(n, t, dtype=torch.bool, device=dev)  # per parent: a child was accepted
    accepted = torch.zeros(n, t, dtype=torch.bool, device=dev)  # per node
    x = tree.tokens
    candidates = x[..., None] if relax is None else torch.cat([x[..., None], relax.neighbours[x]], -1)  # [n, T, c]
    index = parent[..., None] * vocab + candidates
    width = candidates.shape[-1]
    for r in range(max_children):
        # the nodes of rank r, first: siblings are disjoint, so at most (T - 1) // (r + 1) of them exist
        sel = torch.sort((rank != r).to(torch.int8), dim=1, stable=True).indices[:, : max(1, (t - 1) // (r + 1))]
        own_parent = parent.gather(1, sel)
        trying = (rank.gather(1, sel) == r) & ~settled.gather(1, own_parent)
        at = index.gather(1, sel[..., None].expand(-1, -1, width)).reshape(n, -1)
        filtered = flat.gather(1, at)
        mass = torch.where(removed.gather(1, at), 0.0, filtered).view(n, -1, width)
        left = 1.0 - removed_mass.gather(1, own_parent)
        residual = mass / left.clamp_min(1e-30)[..., None]  # the parent's renormalised residual at the candidates
        px = residual[..., 0]
        if relax is None:
            extra, lent = 0.0, torch.zeros_like(own_parent)
        else:
            extra, lent = relax.extra(residual[..., 1:], px)
        supported = filtered.view(n, -1, width)[..., 0] > 0
        ok = trying & (left > 0) & supported & (u.gather(1, column.gather(1, sel)) < px + extra)
        rejected = trying & ~ok
        # a rejection removes x and its lenders from the parent's residual
        gone = rejected[..., None] & (torch.arange(width, device=dev) <= lent[..., None])
        removed_mass.scatter_add_(1, own_parent, (mass * gone).sum(-1))
        removed.scatter_(1, torch.where(gone.reshape(n, -1), at, t * vocab), True)
        accepted |= torch.zeros_like(accepted).scatter_(1, sel, ok)
        settled |= _parents_of(ok, own_parent, t)
    accepted[:, 0] = True
    reach = ~(tree.ancestors & ~accepted[:, None, :]).any(-1)
    last = torch.where(reach, tree.depth * t - torch.arange(t, device=dev), -1).argmax(-1)  # the deepest reached
    img = torch.arange(n, device=dev)
    residual = torch.where(removed[:, :-1].view(n, t, vocab)[img, last], 0.0, probs[img, last])
    total = residual.sum(-1, keepdim=True)
    bonus = inverse_cdf(torch.where(total > 0, residual, probs[img, last]), u[:, 0])
    return Accepted(tree.path_nodes(last, tree.max_depth + 1), tree.depth[img, last] + 1, bonus)


def _at_parent(p: torch.Tensor, parent: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """``p [n, T, V]`` at ``codes [n, T, k]`` of each node's parent: ``[n, T, k]``."""
    n, t, vocab = p.shape
    return p.reshape(n, t * vocab).gather(1, (parent[..., None] * vocab + codes).reshape(n, -1)).view_as(codes)


def _parents_of(flags: torch.Tensor, parent: torch.Tensor, size: int) -> torch.Tensor:
    """``[n, size]`` bool per node P: one of the nodes whose ``parent`` is P has its flag set."""
    out = torch.zeros(flags.shape[0], size, dtype=torch.long, device=flags.device)
    return out.scatter_add_(1, parent, flags.long()) > 0


def accept_draws(max_depth: int, max_children: int) -> int:
    """Uniforms :func:`sample_accept` reads per image for trees up to ``max_depth`` drafts deep."""
    return 1 + max_depth * max_children
