"""Sampled tree acceptance as a sequential walk over the tree's nodes in index order, the way the runtime did it
before it vectorised the walk over sibling ranks. Kept only as the reference the runtime must equal."""
from __future__ import annotations

import torch

from vvs.runtime.accept import Accepted
from vvs.runtime.random import inverse_cdf


def walk_accept(tree, probs, relax, max_children, u) -> Accepted:
    n, t, vocab = probs.shape
    earlier = torch.ones(t, t, dtype=torch.bool).tril(-1)
    rank = ((tree.parent[:, :, None] == tree.parent[:, None, :]) & earlier).sum(-1)
    column = 1 + (tree.depth - 1).clamp(min=0) * max_children + rank
    node = torch.zeros(n, dtype=torch.long)
    p = probs[:, 0].clone()
    path = torch.full((n, tree.max_depth + 1), -1, dtype=torch.long)
    path[:, 0] = 0
    for child in range(1, t):
        x = tree.tokens[:, child]
        trying = tree.parent[:, child] == node
        px = p.gather(1, x[:, None]).squeeze(1)
        if relax is None:
            extra, lent = 0.0, None
        else:
            extra, lent = relax.extra(p.gather(1, relax.neighbours[x]), px)
        accept = trying & (u.gather(1, column[:, child : child + 1]).squeeze(1) < px + extra)
        residual = p.scatter(1, x[:, None], 0.0)
        if relax is not None:
            nb = relax.neighbours[x]
            lender = torch.arange(nb.shape[1]) < lent[:, None]
            residual = residual.scatter(1, nb, torch.where(lender, 0.0, residual.gather(1, nb)))
        total = residual.sum(1, keepdim=True)
        residual = torch.where(total > 0, residual / total.clamp_min(1e-30), p)
        p = torch.where(accept[:, None], probs[:, child], torch.where(trying[:, None], residual, p))
        node = torch.where(accept, child, node)
        depth = tree.depth[:, child : child + 1]
        path.scatter_(1, depth, torch.where(accept, child, path.gather(1, depth).squeeze(1))[:, None])
    return Accepted(path, (path >= 0).sum(1), inverse_cdf(p, u[:, 0]))
