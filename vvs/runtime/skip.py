"""VVS: when to skip a verification, and which drafted tokens to accept without one.

Skip schedules (never two skips in a row, never before ``skip_warmup_tokens`` image tokens exist, and never where
the skip could finish the image: a verification checks every skipped path, see ``Speculation.check_chain``):
- ``uniform``: the verification of cycles 1, 1 + I, 1 + 2I, ... is skipped (cycle 0 is the first draft);
- ``dynamic``: skip when the drafted root-to-leaf paths look alike in the codebook's latent space — the mean
  over path pairs of the depth-weighted (``decay**l``) cosine similarity of their code vectors reaches
  ``sim_threshold``. (The official code uses every other path; we use all of them.)

Verification-free selection: a uniformly random root-to-leaf path, truncated to the mean path length
(``a = min(its drafts, floor(mean nodes per path) - 1)``, always ≥ 1). Its first ``a`` tokens (root included)
are committed unverified and its token ``a`` becomes the next root, as in the official release.
"""
from __future__ import annotations

import torch

from vvs.runtime.options import DecodeOptions
from vvs.runtime.random import inverse_cdf
from vvs.runtime.tree import DraftTree


def uniform_due(cycle: torch.Tensor, interval: int) -> torch.Tensor:
    return (cycle % interval) == (1 % interval) if interval > 1 else torch.zeros_like(cycle, dtype=torch.bool)


def path_similarity(tree: DraftTree, codebook: torch.Tensor, decay: float) -> torch.Tensor:
    """``[n]`` mean pairwise depth-weighted cosine similarity of the drafted root-to-leaf paths.

    Depth weights are normalised over each image's own longest path (``w_l = decay**l / sum_{l < L_i}``), so an
    image's value never depends on the other trees of its batch."""
    n, t = tree.tokens.shape
    leaf = tree.is_leaf()
    depth_cols = tree.size - 1  # deeper than any path can be
    # per leaf, its path without the root, by depth: the node at depth d sits in column d - 1
    on_path = tree.ancestors & (tree.depth[:, None, :] > 0)  # [n, leaf, node]
    levels = torch.arange(depth_cols, device=tree.depth.device)
    col = ((tree.depth - 1).clamp(min=0)[..., None] == levels).float()  # [n, node, l] (one_hot would read the device)
    vec = torch.nn.functional.normalize(codebook[tree.tokens].float(), dim=-1)  # [n, node, e]
    paths = torch.einsum("nij,njl,nje->nile", on_path.float(), col, vec)  # [n, leaf, l, e], zero past a path's end
    longest = (tree.depth * leaf).amax(1)  # [n]
    weights = (decay ** levels.float())[None, :] * (levels[None, :] < longest[:, None])
    weights = weights / weights.sum(1, keepdim=True).clamp_min(1e-30)  # [n, l]
    cos = torch.einsum("nile,njle->nijl", paths, paths)  # zero where either path has no token at that depth
    sim = torch.einsum("nijl,nl->nij", cos, weights)
    pair = leaf[:, :, None] & leaf[:, None, :] & torch.ones(t, t, dtype=torch.bool, device=vec.device).triu(1)
    count = pair.sum((1, 2))
    return torch.where(count > 0, (sim * pair).sum((1, 2)) / count.clamp(min=1), 0.0)


def decide_skip(opts: DecodeOptions, tree: DraftTree, cycle, tokens_done, num_tokens: int, last_skipped,
                codebook) -> torch.Tensor:
    """``[n]`` bool: skip this cycle's verification."""
    verified_after = tokens_done + opts.max_path_tokens < num_tokens  # the image is not done after the skip
    allowed = ~last_skipped & (tokens_done > opts.skip_warmup_tokens) & verified_after
    if opts.skip_policy == "uniform":
        return allowed & uniform_due(cycle, opts.skip_interval)
    return allowed & (path_similarity(tree, codebook, opts.sim_decay) >= opts.sim_threshold)


def select_unverified(tree: DraftTree, width: int, u: torch.Tensor):
    """Pick a random leaf path (``u [n]``: one uniform in [0, 1) per image) and truncate it. Returns
    ``(path [n, width], a [n], next_root [n])``: ``path`` holds the picked path's tokens (root first),
    ``path[i, :a[i]]`` are committed without verification."""
    n = tree.tokens.shape[0]
    img = torch.arange(n, device=tree.tokens.device)
    leaf = tree.is_leaf()
    mean_nodes = ((tree.depth + 1) * leaf).sum(1) // leaf.sum(1)  # floor(mean path length, root included)
    pick = inverse_cdf(leaf.float(), u)
    a = torch.minimum(tree.depth[img, pick], mean_nodes - 1)
    nodes = tree.path_nodes(pick, width)
    tokens = tree.tokens.gather(1, nodes.clamp(min=0))
    return tokens, a, tokens[img, a]
