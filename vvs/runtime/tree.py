"""EAGLE-2 dynamic draft trees, built for every image of a batch at once.

One drafter call over the new stable slots gives the root's top-k children; each of ``depth`` expansion calls
forwards the current frontier (the ``draft_top_k`` best nodes by cumulative log-probability) and proposes
``draft_top_k`` children per frontier node. Of all proposals the ``tree_size - 1`` best by cumulative
log-probability form the tree, sorted by proposal order so that parents precede children.

Frontier keys/values live in a scratch region of the drafter cache (slots ``scratch_start ...``), shared by all
images; the committed ("stable") drafter slots of each image stay in front of it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vvs.runtime.cache import KVCache, RowLayout, attention_mask, causal_within


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [n, T] node 0 is the root (the token the target has not seen yet)
    parent: torch.Tensor  # [n, T] parent node index, -1 for the root
    depth: torch.Tensor  # [n, T] 0 for the root
    ancestors: torch.Tensor  # [n, T, T] bool, ancestors[i, a, b]: b is on the root path of a (a itself included)

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
    n, t = parent.shape
    step = torch.zeros(n, t, t, dtype=torch.float32, device=parent.device)
    has_parent = parent >= 0
    rows = has_parent.nonzero(as_tuple=True)
    step[rows[0], rows[1], parent[has_parent]] = 1.0
    reach = torch.eye(t, device=parent.device).expand(n, t, t).clone()
    anc = reach.clone()
    for _ in range(max_depth):
        reach = reach @ step
        anc = anc + reach
    return anc > 0


class TreeDrafter:
    """Runs the drafter graph to grow one tree per image. Owns the drafter's KV cache."""

    def __init__(self, engine, layout: RowLayout, kv: torch.Tensor, stable_capacity: int, depth: int, top_k: int,
                 max_position: int):
        """``kv``: a zeroed drafter cache ``[layers, 2, rows, heads, stable_capacity + depth * top_k, head_dim]``."""
        self.engine, self.layout = engine, layout
        self.max_position = max_position  # positions past the last image token only occur in discarded branches
        self.depth, self.k = depth, top_k
        self.scratch_start = stable_capacity
        self.cache = KVCache(layout, kv)
        self.forwards = 0  # drafter graph calls so far

    def combined(self, layout: RowLayout, kv: torch.Tensor, parts: list[tuple["TreeDrafter", torch.Tensor]]):
        """A drafter like this one over the chosen images of ``parts``, their caches copied into ``kv``."""
        drafter = TreeDrafter(self.engine, layout, kv, self.scratch_start, self.depth, self.k, self.max_position)
        drafter.cache = KVCache.combine(layout, kv, [(p.cache, images) for p, images in parts])
        return drafter

    def _call(self, graph_inputs, position_ids, **inputs):
        self.forwards += 1
        return self.engine.run(past_kv=self.cache.kv, position_ids=position_ids.clamp(max=self.max_position),
                               **inputs, **graph_inputs)

    def extend(self, tokens, features, positions, count, graph_inputs):
        """Feed new stable slots (``tokens/positions [n, m]``, ``features [rows, m, D]``, ``count[i]`` valid)
        and return the last valid slot's ``(hidden [rows, D], topk_logp [n, K], topk_ids [n, K])``."""
        n, m = tokens.shape
        past = self.cache.prefix_visible(m) & (torch.arange(self.cache.capacity, device=tokens.device) < self.scratch_start)
        mask = attention_mask(self.layout, past, causal_within(count, m))
        out = self._call(graph_inputs, features=features, input_ids=self.layout.expand(tokens),
                         position_ids=self.layout.expand(positions), attn_mask=mask)
        self.cache.commit(out["new_kv"], torch.arange(m, device=tokens.device).expand(n, m), count)
        last = count - 1
        rows = torch.arange(self.layout.rows, device=tokens.device)
        hidden = out["hidden"][rows, self.layout.expand(last)]
        img = torch.arange(n, device=tokens.device)
        return hidden, out["topk_logp"][img, last], out["topk_ids"][img, last]

    def grow(self, root: torch.Tensor, root_position: torch.Tensor, first, tree_size: int, graph_inputs) -> DraftTree:
        """Expand from the root's proposals ``first = (hidden, logp, ids)`` into a tree of ``tree_size`` nodes."""
        hidden, logp, ids = first
        n, k, dev = root.shape[0], self.k, root.device
        img = torch.arange(n, device=dev)
        pool_tokens, pool_scores = [ids[:, :k]], [logp[:, :k].float()]
        pool_parent = [torch.full((n, k), -1, device=dev)]
        pool_depth = [torch.ones(n, k, dtype=torch.long, device=dev)]
        frontier_pool = torch.arange(k, device=dev).expand(n, k)  # pool index of each frontier node
        frontier_tokens, frontier_scores = ids[:, :k], logp[:, :k].float()
        frontier_hidden = hidden[:, None, :].expand(-1, k, -1)
        scratch = self.cache.capacity - self.scratch_start
        frontier_anc = torch.zeros(n, k, scratch, dtype=torch.bool, device=dev)
        stable = self.cache.prefix_visible(k) & (torch.arange(self.cache.capacity, device=dev) < self.scratch_start)
        offset = k
        for level in range(1, self.depth + 1):
            past = stable.clone()
            past[:, :, self.scratch_start :] = frontier_anc
            mask = attention_mask(self.layout, past, torch.eye(k, dtype=torch.bool, device=dev).expand(n, k, k))
            positions = (root_position + level)[:, None].expand(n, k)
            out = self._call(graph_inputs, features=frontier_hidden, input_ids=self.layout.expand(frontier_tokens),
                             position_ids=self.layout.expand(positions), attn_mask=mask)
            slots = self.scratch_start + (level - 1) * k + torch.arange(k, device=dev)
            self.cache.write(out["new_kv"], torch.arange(k, device=dev).expand(n, k), slots.expand(n, k),
                             torch.ones(n, k, dtype=torch.bool, device=dev))
            child_scores = (frontier_scores[:, :, None] + out["topk_logp"][:, :, :k].float()).reshape(n, k * k)
            child_tokens = out["topk_ids"][:, :, :k].reshape(n, k * k)
            pool_tokens.append(child_tokens)
            pool_scores.append(child_scores)
            pool_parent.append(frontier_pool.repeat_interleave(k, dim=1))
            pool_depth.append(torch.full((n, k * k), level + 1, dtype=torch.long, device=dev))
            best = child_scores.topk(k, dim=-1).indices  # next frontier, as indices into this level's k*k
            parent_slot = best // k
            frontier_pool = offset + best
            frontier_tokens = child_tokens.gather(1, best)
            frontier_scores = child_scores.gather(1, best)
            rows = torch.arange(self.layout.rows, device=dev)[:, None]
            frontier_hidden = out["hidden"][rows, self.layout.expand(parent_slot)]
            own = torch.zeros(n, k, scratch, dtype=torch.bool, device=dev)
            own[img[:, None], torch.arange(k, device=dev)[None], (level - 1) * k + parent_slot] = True
            frontier_anc = frontier_anc[img[:, None], parent_slot] | own
            offset += k * k
        return select_tree(root, torch.cat(pool_tokens, 1), torch.cat(pool_scores, 1), torch.cat(pool_parent, 1),
                           torch.cat(pool_depth, 1), tree_size, self.depth + 1)


def select_tree(root, tokens, scores, parent, depth, tree_size: int, max_depth: int) -> DraftTree:
    """Keep the ``tree_size - 1`` best proposals in proposal order, and index parents within the tree.

    A child's score is its parent's plus a log-probability (<= 0), and a parent is proposed before its children,
    so a stable descending sort ranks every parent ahead of its children — also among equal scores, including the
    ``-inf`` of candidates the sampling filter removed. Every kept node's parent is therefore kept."""
    chosen = scores.sort(dim=-1, descending=True, stable=True).indices[:, : tree_size - 1]
    chosen = chosen.sort(dim=-1).values  # [n, T-1] pool indices, ascending: parents precede children
    node_parent_pool = parent.gather(1, chosen)
    parent_node = torch.searchsorted(chosen, node_parent_pool.clamp(min=0)) + 1
    parent_node = torch.where(node_parent_pool < 0, 0, parent_node)
    n = root.shape[0]
    tree_parent = torch.cat([torch.full((n, 1), -1, device=root.device), parent_node], dim=1)
    return DraftTree(
        tokens=torch.cat([root[:, None], tokens.gather(1, chosen)], dim=1),
        parent=tree_parent,
        depth=torch.cat([torch.zeros(n, 1, dtype=torch.long, device=root.device), depth.gather(1, chosen)], dim=1),
        ancestors=ancestor_matrix(tree_parent, max_depth),
    )
