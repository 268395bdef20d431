"""The EAGLE-2 tree expansion as the runtime did it before the fused ``draft_tree`` graph: one ``DrafterStep`` call
for the new stable slots and one per level, the frontier's keys/values written into a scratch region of the
drafter cache between calls. Kept only as the reference the fused graph must equal, tree for tree."""
from __future__ import annotations

import torch

from vvs.runtime.cache import KVCache, attention_mask, causal_within
from vvs.runtime.tree import select_tree


class ReferenceDrafter:
    def __init__(self, step, propose, layout, kv, stable_capacity: int, depth: int, top_k: int, max_position: int):
        """``step``, ``propose``: ``DrafterStep`` and ``Proposer`` modules; ``kv``: zeroed
        ``[layers, 2, rows, heads, stable + depth * k, hd]`` where ``stable`` counts the runtime cache's slots (its
        spare slot included)."""
        self.step, self.propose, self.layout = step, propose, layout
        self.max_position, self.depth, self.k = max_position, depth, top_k
        self.scratch_start = stable_capacity
        self.cache = KVCache(layout, kv)

    def _call(self, g, position_ids, features, input_ids, attn_mask):
        with torch.inference_mode():
            hidden, new_kv = self.step(features, input_ids, position_ids.clamp(max=self.max_position), attn_mask,
                                       self.cache.kv)
        return {"hidden": hidden, "new_kv": new_kv}

    def _propose(self, g, hidden):
        with torch.inference_mode():
            return self.propose(hidden, *(g[name] for name in ("cfg_mix", "temperature", "top_k", "top_p", "survivors_k")))

    def extend(self, tokens, features, positions, count, g):
        n, m = tokens.shape
        slots = torch.arange(self.cache.kv.shape[4])
        past = self.cache.prefix_visible(m) & (slots < self.scratch_start)
        mask = attention_mask(self.layout, past, causal_within(count, m))
        out = self._call(g, self.layout.expand(positions), features, self.layout.expand(tokens), mask)
        self.cache.commit(out["new_kv"], torch.arange(m).expand(n, m), count)
        last = count - 1
        hidden = out["hidden"][torch.arange(self.layout.rows), self.layout.expand(last)]
        logp, ids = self._propose(g, hidden[:, None])
        return hidden, logp[:, 0], ids[:, 0]

    def grow(self, root, root_position, first, tree_size: int, g):
        hidden, logp, ids = first
        n, k = root.shape[0], self.k
        img = torch.arange(n)
        pool_tokens, pool_scores = [ids[:, :k]], [logp[:, :k].float()]
        pool_parent = [torch.full((n, k), -1)]
        pool_depth = [torch.ones(n, k, dtype=torch.long)]
        frontier_pool = torch.arange(k).expand(n, k)
        frontier_tokens, frontier_scores = ids[:, :k], logp[:, :k].float()
        frontier_hidden = hidden[:, None, :].expand(-1, k, -1)
        scratch = self.cache.kv.shape[4] - self.scratch_start
        frontier_anc = torch.zeros(n, k, scratch, dtype=torch.bool)
        stable = self.cache.prefix_visible(k) & (torch.arange(self.cache.kv.shape[4]) < self.scratch_start)
        offset = k
        for level in range(1, self.depth + 1):
            past = stable.clone()
            past[:, :, self.scratch_start:] = self.layout.expand(frontier_anc)  # the cache masks per batch row
            mask = attention_mask(self.layout, past, torch.eye(k, dtype=torch.bool).expand(n, k, k))
            positions = (root_position + level)[:, None].expand(n, k)
            out = self._call(g, self.layout.expand(positions), frontier_hidden, self.layout.expand(frontier_tokens),
                             mask)
            slots = self.scratch_start + (level - 1) * k + torch.arange(k)
            self.cache.kv[:, :, :, :, slots] = out["new_kv"].to(self.cache.kv.dtype)
            logp, ids = self._propose(g, out["hidden"])
            child_scores = (frontier_scores[:, :, None] + logp[:, :, :k].float()).reshape(n, k * k)
            child_tokens = ids[:, :, :k].reshape(n, k * k)
            pool_tokens.append(child_tokens)
            pool_scores.append(child_scores)
            pool_parent.append(frontier_pool.repeat_interleave(k, dim=1))
            pool_depth.append(torch.full((n, k * k), level + 1, dtype=torch.long))
            best = child_scores.topk(k, dim=-1).indices
            parent_slot = best // k
            frontier_pool = offset + best
            frontier_tokens = child_tokens.gather(1, best)
            frontier_scores = child_scores.gather(1, best)
            rows = torch.arange(self.layout.rows)[:, None]
            frontier_hidden = out["hidden"][rows, self.layout.expand(parent_slot)]
            own = torch.zeros(n, k, scratch, dtype=torch.bool)
            own[img[:, None], torch.arange(k)[None], (level - 1) * k + parent_slot] = True
            frontier_anc = frontier_anc[img[:, None], parent_slot] | own
            offset += k * k
        tokens, parent, depth, ancestors = select_tree(torch.cat(pool_tokens, 1), torch.cat(pool_scores, 1),
                                                       torch.cat(pool_parent, 1), torch.cat(pool_depth, 1),
                                                       tree_size, self.depth + 1)
        return torch.cat([root[:, None], tokens], 1), parent, depth, ancestors
