"""EAGLE-2 dynamic draft trees, built for every image of a batch at once, in one drafter graph call.

The ``draft_tree`` graph (:class:`vvs.discrete.graphs.DraftTreeGraph`) consumes the drafter's new stable slots and
expands ``depth`` levels of the ``draft_top_k`` best nodes; of all proposals the ``tree_size - 1`` best by
cumulative log-probability form the tree, in proposal order so that parents precede children. The runtime keeps
the drafter's stable cache and commits the keys/values of the new stable slots the graph returns.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vvs.runtime.cache import KVCache, RowLayout


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [n, T] node 0 is the root (the token the target has not seen yet)
    parent: torch.Tensor  # [n, T] parent node index, -1 for the root
    depth: torch.Tensor  # [n, T] 0 for the root
    ancestors: torch.Tensor  # [n, T, T] bool, ancestors[i, a, b]: b is on the root path of a (a itself included)
    max_depth: int  # no node is deeper (the tree's depth setting + 1), so path widths are static

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def children(self, width: int) -> torch.Tensor:
        """``[n, T, width]`` child node indices in ascending order (= drafter preference), -1 padded."""
        t = self.size
        idx = torch.arange(t, device=self.tokens.device)
        is_child = self.parent[:, None, :] == idx[None, :, None]  # [n, parent, child]
        ordered = torch.where(is_child, idx, t).sort(dim=-1).values[..., :width]
        return torch.where(ordered == t, -1, ordered)

    def is_leaf(self) -> torch.Tensor:
        idx = torch.arange(self.size, device=self.tokens.device)
        has_child = (self.parent[:, None, :] == idx[None, :, None]).any(-1)
        return ~has_child & (idx > 0)

    def path_nodes(self, node: torch.Tensor, width: int) -> torch.Tensor:
        """``[n, width]`` node indices on the root path of ``node[i]``, root first, -1 padded."""
        n = self.tokens.shape[0]
        on_path = self.ancestors[torch.arange(n), node]  # [n, T]; parents precede children, so index order = depth order
        idx = torch.arange(self.size, device=node.device)
        ordered = torch.where(on_path, idx, self.size).sort(dim=-1).values[:, :width]
        ordered = torch.nn.functional.pad(ordered, (0, width - ordered.shape[1]), value=self.size)
        return torch.where(ordered == self.size, -1, ordered)


def ancestor_matrix(parent: torch.Tensor, max_depth: int) -> torch.Tensor:
    """``[n, T, T]`` bool: ``[i, a, b]`` when node b is on the root path of node a (a itself included)."""
    t = parent.shape[1]
    step = (parent[..., None] == torch.arange(t, device=parent.device)).float()  # [n, node, its parent]
    reach = torch.eye(t, device=parent.device).expand(parent.shape[0], t, t)
    anc = reach
    for _ in range(max_depth):
        reach = reach @ step
        anc = anc + reach
    return anc > 0


class TreeDrafter:
    """Runs the ``draft_tree`` graph: one call per cycle grows one tree per image. Owns the drafter's KV cache."""

    def __init__(self, engine, layout: RowLayout, kv: torch.Tensor, max_depth: int):
        """``kv``: a zeroed drafter cache ``[layers, 2, rows, heads, capacity, head_dim]``."""
        self.engine, self.layout = engine, layout
        self.max_depth = max_depth  # nodes below the root on the longest possible path
        self.cache = KVCache(layout, kv)

    def combined(self, layout: RowLayout, kv: torch.Tensor, parts: list[tuple["TreeDrafter", torch.Tensor]]):
        """A drafter like this one over the chosen images of ``parts``, their caches copied into ``kv``."""
        drafter = TreeDrafter(self.engine, layout, kv, self.max_depth)
        drafter.cache = KVCache.combine(layout, kv, [(p.cache, images) for p, images in parts])
        return drafter

    def draft(self, tokens, features, positions, count, root, root_position, graph_inputs) -> DraftTree:
        """Feed new stable slots (``tokens/positions [n, m]``, ``features [rows, m, D]``, ``count[i]`` valid, the
        last valid one holding ``root``) and grow the tree under ``root`` at ``root_position``."""
        out = self.engine.run(features=features, input_ids=self.layout.expand(tokens),
                              position_ids=self.layout.expand(positions), past_kv=self.cache.kv,
                              past_len=self.cache.length, new_count=count, root_position=root_position,
                              **graph_inputs)
        m = tokens.shape[1]
        self.cache.commit(out["stable_kv"], torch.arange(m, device=tokens.device).expand(tokens.shape[0], m), count)
        return DraftTree(torch.cat([root[:, None], out["tokens"]], 1), out["parent"], out["depth"],
                         out["ancestors"], self.max_depth)


def select_tree(tokens, scores, parent, depth, tree_size: int, max_depth: int):
    """Keep the ``tree_size - 1`` best proposals in proposal order, and index parents within the tree. Returns
    the kept tokens ``[n, T - 1]`` and, for the tree with its root as node 0, ``parent``, ``depth`` and the
    ancestor matrix (``[n, T]``, ``[n, T]``, ``[n, T, T]``).

    A child's score is its parent's plus a log-probability (<= 0), and a parent is proposed before its children,
    so a stable descending sort ranks every parent ahead of its children — also among equal scores, including the
    ``-inf`` of candidates the sampling filter removed. Every kept node's parent is therefore kept."""
    pool = scores.shape[1]
    idx = torch.arange(pool, device=scores.device)
    # each proposal's place in that stable sort, by pairwise comparison (ONNX has no stable sort)
    ahead = (scores[:, None, :] > scores[:, :, None]) | ((scores[:, None, :] == scores[:, :, None]) & (idx < idx[:, None]))
    kept = ahead.sum(-1) < tree_size - 1
    # [n, T-1] the kept pool indices, ascending (parents precede children): the largest of pool - index
    chosen = torch.where(kept, pool - idx, 0).topk(tree_size - 1, dim=-1).values
    chosen = pool - chosen
    node_parent_pool = parent.gather(1, chosen)
    # the parent's place among the chosen (they are sorted): how many chosen pool indices lie below it
    parent_node = (chosen[:, None, :] < node_parent_pool[:, :, None]).sum(-1) + 1
    parent_node = torch.where(node_parent_pool < 0, 0, parent_node)
    n = tokens.shape[0]
    tree_parent = torch.cat([torch.full((n, 1), -1, dtype=torch.long, device=tokens.device), parent_node], dim=1)
    tree_depth = torch.cat([torch.zeros(n, 1, dtype=torch.long, device=tokens.device), depth.gather(1, chosen)], dim=1)
    return tokens.gather(1, chosen), tree_parent, tree_depth, ancestor_matrix(tree_parent, max_depth)
