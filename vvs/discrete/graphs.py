"""The graphs as torch modules: what ``vvs-export`` exports and what the torch backend runs.

Each ``forward`` takes its inputs in :mod:`vvs.export.spec` order and returns its outputs in spec order.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from vvs.discrete.drafter import Drafter
from vvs.discrete.target import DiscreteTarget
from vvs.export.spec import GraphSpec, TensorSpec
from vvs.models.vq import VQModel
from vvs.runtime.cache import causal_within
from vvs.runtime.options import TreeShape
from vvs.runtime.sampling import mix, vocabulary_mask
from vvs.runtime.tree import select_tree


class TargetPrefill(nn.Module):
    """Condition -> guided logits of the first image token, condition features, condition keys/values."""

    def __init__(self, target: DiscreteTarget):
        super().__init__()
        self.target = target
        self.mask = vocabulary_mask(target.config.vocab_size, target.config.sampled_ids)

    def forward(self, condition, attn_mask, cfg_mix):
        c = self.target.config.cls_token_num
        positions = torch.arange(c, device=attn_mask.device).expand(condition.shape[0], c)
        out = self.target(condition=condition, position_ids=positions, mask=attn_mask)
        return _masked(self.mask, mix(cfg_mix, out.logits[:, -1])), out.hidden, out.new_kv


class TargetVerify(nn.Module):
    """Any set of new tokens (1 for AR, a tree, a skipped chain + a tree) against the static KV buffer."""

    def __init__(self, target: DiscreteTarget):
        super().__init__()
        self.target = target
        self.mask = vocabulary_mask(target.config.vocab_size, target.config.sampled_ids)

    def forward(self, input_ids, position_ids, attn_mask, past_kv, cfg_mix):
        out = self.target(tokens=input_ids, position_ids=position_ids, mask=attn_mask, past_kv=past_kv)
        return _masked(self.mask, mix(cfg_mix, out.logits)), out.hidden, out.new_kv


def _masked(mask, logits):
    return logits if mask is None else mask(logits)


class DrafterStep(nn.Module):
    """One drafter forward with explicit features: hidden states and the new keys/values. No head: only the nodes a
    tree expands need logits (:class:`Proposer`)."""

    def __init__(self, drafter: Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, features, input_ids, position_ids, attn_mask, past_kv):
        out = self.drafter(features, input_ids, position_ids, attn_mask, past_kv)
        return out.hidden, out.new_kv


class Proposer(nn.Module):
    """The ``top_k`` children a node proposes, with their log-probabilities, from the drafter's hidden state.

    At official vocabularies (16,384 codes) the target's head is the largest matrix a drafter call reads, so it is
    applied once per expanded node and nowhere else: guidance is linear, so where the head is linear too (LlamaGen's)
    the guided rows' hidden states are mixed before it rather than their logits after it, and nothing sorts the
    vocabulary. A head that is not linear (Janus-Pro's MLP) scores every row and mixes the logits. Candidates are the top-k of
    the tempered logits, scored by log-probability under the tempered distribution (normalised by a log-sum-exp over
    the vocabulary). The sampling filters then remove exactly the candidates that the target's filter
    (:func:`vvs.runtime.sampling.filter_logits`) would remove from these logits, so a draft the target's filter
    refuses is never proposed."""

    def __init__(self, head: nn.Module, top_k: int, mask: nn.Module | None = None):
        super().__init__()
        self.head = head
        self.linear = isinstance(head, nn.Linear)
        self.top_k = top_k
        self.mask = mask

    def forward(self, hidden, cfg_mix, temperature, top_k, top_p, survivors_k):
        """``hidden [rows, j, D]`` -> ``(logp, ids)``, each ``[n, j, top_k]``, best first."""
        dtype = next(self.head.parameters()).dtype
        if self.linear:
            scores = self.head(mix(cfg_mix, hidden).to(dtype)).float()
        else:
            scores = mix(cfg_mix, self.head(hidden.to(dtype)).float())
        logits = _masked(self.mask, scores) / temperature.clamp_min(1e-5)
        top = logits.topk(self.top_k, dim=-1)
        logp = top.values - torch.logsumexp(logits, dim=-1, keepdim=True)
        kept = self.filtered(logits, top.values, top_k, top_p, survivors_k)
        return torch.where(kept, logp, float("-inf")), top.indices

    def filtered(self, logits, values, top_k, top_p, survivors_k):
        """Which candidates (``values``, best first) survive top-k then top-p as LlamaGen filters: top-k keeps every
        code at least as likely as the k-th, ties included; top-p keeps a code while the mass strictly above it,
        renormalised over the top-k survivors, is at most p (ties at that boundary all stay).

        The renormalisation needs the k-th largest logit of the whole vocabulary: a TopK of ``survivors_k``, which
        the runtime sets to top_k when both filters act and to 1 otherwise, so the selection costs only then."""
        K, vocab = values.shape[-1], logits.shape[-1]
        kth_candidate = values.gather(-1, (top_k - 1).clamp(0, K - 1).expand(*values.shape[:-1], 1))
        kth_candidate = torch.where((top_k > 0) & (top_k <= K), kth_candidate, float("-inf"))
        k = survivors_k.item()  # host memory (the runtime keeps it there): no wait for the device
        torch._check(k >= 1)
        torch._check(k <= vocab)
        kth = logits.topk(k, dim=-1).values[..., -1:]
        renormalised = (top_p < 1.0) & (top_k > 0) & (top_k < vocab)
        bound = torch.where(renormalised, kth, float("-inf"))
        survivors = torch.logsumexp(logits.masked_fill(logits < bound, float("-inf")), dim=-1, keepdim=True)
        mass = (values - survivors).exp()
        above = (mass[..., None, :] * (values[..., None, :] > values[..., :, None])).sum(-1)
        return (values >= kth_candidate) & ((above <= top_p) | (top_p >= 1.0))


class DraftTreeGraph(nn.Module):
    """A whole EAGLE-2 draft tree in one call, so a speculative cycle makes one drafter call.

    1. The drafter consumes the new stable slots (``new_count[i]`` of them valid; the last valid one holds the
       root) against its cache; their keys/values are returned for the runtime to commit.
    2. ``depth`` expansion levels: the ``draft_top_k`` best nodes so far (by cumulative log-probability) are fed
       with their parent's hidden state and propose ``draft_top_k`` children each. Frontier keys/values live in a
       scratch region after the stable cache, seen only by their own descendants.
    3. The ``tree_size - 1`` best proposals form the tree (:func:`select_tree`).

    The structure (size, depth, top-k) is fixed per graph; every level sees exactly the keys/values a per-level
    drafter call sequence would see, so the trees equal those of single drafter calls."""

    def __init__(self, drafter: Drafter, head: nn.Linear, tree: TreeShape, max_position: int,
                 mask: nn.Module | None = None):
        super().__init__()
        self.step = DrafterStep(drafter)
        self.propose = Proposer(head, tree.draft_top_k, mask)
        self.tree = tree
        self.max_position = max_position  # positions past the last image token only occur in discarded branches

    def forward(self, features, input_ids, position_ids, past_kv, past_len, new_count, root_position, cfg_mix,
                temperature, top_k, top_p, survivors_k):
        k, depth = self.tree.draft_top_k, self.tree.depth
        n, rows, m = cfg_mix.shape[0], features.shape[0], input_ids.shape[1]
        groups = rows // n
        stable = past_kv.shape[4]
        dev = features.device
        processor = (cfg_mix, temperature, top_k, top_p, survivors_k)

        # 1. the new stable slots, over the committed ones (the cache is read in place, never copied)
        length, count = past_len.repeat(groups), new_count.repeat(groups)
        committed = torch.arange(stable, device=dev) < length[:, None]  # [rows, S]
        mask = torch.cat([committed[:, None, :].expand(rows, m, stable), causal_within(count, m)], -1)[:, None]
        hidden, stable_kv = self.step(features, input_ids, position_ids.clamp(max=self.max_position), mask, (past_kv,))
        last = new_count - 1
        root_hidden = hidden[torch.arange(rows, device=dev), last.repeat(groups)]
        logp, ids = (t[:, 0] for t in self.propose(root_hidden[:, None], *processor))

        # 2. expansion levels: each attends over the cache, the valid new stable slots and its ancestors among the
        # frontier slots of earlier levels (kept, with the new stable slots, in a small scratch chunk)
        new_visible = (torch.arange(m, device=dev) < count[:, None])[:, None, :].expand(rows, k, m)
        scratch = stable_kv
        pool_tokens, pool_scores = [ids], [logp]
        pool_parent = [torch.full((n, k), -1, dtype=torch.long, device=dev)]
        pool_depth = [torch.ones(n, k, dtype=torch.long, device=dev)]
        frontier_pool = torch.arange(k, device=dev).expand(n, k)  # pool index of each frontier node
        frontier_tokens, frontier_scores = ids, logp
        frontier_hidden = root_hidden[:, None, :].expand(-1, k, -1)
        frontier_anc = torch.zeros(n, k, depth * k, dtype=torch.bool, device=dev)
        eye = torch.eye(k, dtype=torch.bool, device=dev).expand(rows, k, k)
        offset = k
        for level in range(1, depth + 1):
            ancestors = frontier_anc[:, :, : (level - 1) * k].repeat(groups, 1, 1)
            mask = torch.cat([committed[:, None, :].expand(rows, k, stable), new_visible, ancestors, eye], -1)[:, None]
            positions = (root_position + level).clamp(max=self.max_position)[:, None].expand(n, k)
            hidden, new_kv = self.step(frontier_hidden, frontier_tokens.repeat(groups, 1), positions.repeat(groups, 1),
                                       mask, (past_kv, scratch))
            logp, ids = self.propose(hidden, *processor)
            scratch = torch.cat([scratch, new_kv], 4)
            child_scores = (frontier_scores[:, :, None] + logp).reshape(n, k * k)
            child_tokens = ids.reshape(n, k * k)
            pool_tokens.append(child_tokens)
            pool_scores.append(child_scores)
            pool_parent.append(frontier_pool.repeat_interleave(k, dim=1))
            pool_depth.append(torch.full((n, k * k), level + 1, dtype=torch.long, device=dev))
            best = child_scores.topk(k, dim=-1).indices  # the next frontier, as indices into this level's k * k
            parent_slot = best // k
            frontier_pool = offset + best
            frontier_tokens = child_tokens.gather(1, best)
            frontier_scores = child_scores.gather(1, best)
            frontier_hidden = hidden[torch.arange(rows, device=dev)[:, None], parent_slot.repeat(groups, 1)]
            own = ((level - 1) * k + parent_slot)[:, :, None] == torch.arange(depth * k, device=dev)
            frontier_anc = frontier_anc.gather(1, parent_slot[:, :, None].expand(-1, -1, depth * k)) | own
            offset += k * k

        # 3. the tree
        tokens, parent, node_depth, ancestors = select_tree(
            torch.cat(pool_tokens, 1), torch.cat(pool_scores, 1), torch.cat(pool_parent, 1), torch.cat(pool_depth, 1),
            self.tree.tree_size, depth + 1)
        return stable_kv, tokens, parent, node_depth, ancestors


class VQDecode(nn.Module):
    def __init__(self, vq: VQModel, grid: int):
        super().__init__()
        self.vq = vq
        self.grid = grid

    def forward(self, codes):
        return self.vq.decode_codes(codes, self.grid).float()  # float32 pixels from a decoder of any precision


def build_graphs(target: DiscreteTarget, drafter: Drafter | None, vq: VQModel,
                 tree: TreeShape) -> dict[str, nn.Module]:
    """The graph modules of a model bundle, with the ``draft_tree`` graph of one tree shape where it has a
    drafter."""
    graphs = {
        "target_prefill": TargetPrefill(target).eval(),
        "target_verify": TargetVerify(target).eval(),
        "draft_tree": None if drafter is None else draft_tree_graph(target, drafter, tree),
        "vq_decode": VQDecode(vq, target.config.grid_size).eval(),
    }
    return {name: graph for name, graph in graphs.items() if graph is not None}


def draft_tree_graph(target: DiscreteTarget, drafter: Drafter, tree: TreeShape) -> DraftTreeGraph:
    """The drafter graph holds its own copy of the target's head, as its exported engine does."""
    mask = vocabulary_mask(target.config.vocab_size, target.config.sampled_ids)
    return DraftTreeGraph(drafter, copy.deepcopy(target.head), tree, target.config.max_positions - 1, mask).eval()


# --------------------------------------------------------------------------- their inputs and outputs

def graph_specs(target, drafter, vq, tree, act: str = "float32") -> dict[str, GraphSpec]:
    """Specs of the four graphs for a target's config (:class:`vvs.discrete.target.TargetConfig`), a
    ``DrafterConfig`` (None: no ``draft_tree`` graph), the image tokenizer's config and the ``TreeShape`` of the
    ``draft_tree`` graph.

    ``act`` is the dtype of activations, features and caches ("float32" or "float16"); logits are float32.
    """
    t = target
    kv = ("batch", t.n_head, "past", t.head_dim)
    image = vq.downsample * t.grid_size
    specs = {
        "target_prefill": GraphSpec("target_prefill", (
            t.condition_input(act),
            TensorSpec("attn_mask", "bool", ("batch", 1, t.cls_token_num, t.cls_token_num)),
            TensorSpec("cfg_mix", "float32", ("images", "batch")),
        ), (
            TensorSpec("logits", "float32", ("images", t.vocab_size)),
            TensorSpec("hidden", act, ("batch", t.cls_token_num, t.dim)),
            TensorSpec("new_kv", act, (t.n_layer, 2, "batch", t.n_head, t.cls_token_num, t.head_dim)),
        )),
        "target_verify": GraphSpec("target_verify", (
            TensorSpec("input_ids", "int64", ("batch", "new")),
            TensorSpec("position_ids", "int64", ("batch", "new")),
            TensorSpec("attn_mask", "bool", ("batch", 1, "new", "past_plus_new")),
            TensorSpec("past_kv", act, (t.n_layer, 2, *kv), pieces=2),
            TensorSpec("cfg_mix", "float32", ("images", "batch")),
        ), (
            TensorSpec("logits", "float32", ("images", "new", t.vocab_size)),
            TensorSpec("hidden", act, ("batch", "new", t.dim)),
            TensorSpec("new_kv", act, (t.n_layer, 2, "batch", t.n_head, "new", t.head_dim)),
        )),
        "draft_tree": None if drafter is None else draft_tree_spec(target, drafter, tree, act),
        "vq_decode": GraphSpec("vq_decode", (
            TensorSpec("codes", "int64", ("images", t.num_image_tokens)),
        ), (
            TensorSpec("image", "float32", ("images", 3, image, image)),
        )),
    }
    if drafter is None:
        del specs["draft_tree"]
    return specs


def draft_tree_spec(target, drafter, tree, act: str = "float32") -> GraphSpec:
    """The drafter's new stable slots in, one draft tree per image out (:class:`DraftTreeGraph`):
    ``tokens`` are the ``tree_size - 1`` drafted nodes; ``parent``, ``depth`` and ``ancestors`` describe the tree
    with its root as node 0. ``past_len``: committed drafter slots per image; ``new_count``: valid new slots."""
    t, size = target, tree.tree_size
    kv = (drafter.num_hidden_layers, 2, "batch", t.n_head)
    return GraphSpec("draft_tree", (
        TensorSpec("features", act, ("batch", "new", t.dim)),
        TensorSpec("input_ids", "int64", ("batch", "new")),
        TensorSpec("position_ids", "int64", ("batch", "new")),
        TensorSpec("past_kv", act, (*kv, "past", t.head_dim)),
        TensorSpec("past_len", "int64", ("images",)),
        TensorSpec("new_count", "int64", ("images",)),
        TensorSpec("root_position", "int64", ("images",)),
        TensorSpec("cfg_mix", "float32", ("images", "batch")),
        TensorSpec("temperature", "float32", (1,)),  # the logits processor
        TensorSpec("top_k", "int64", (1,)),
        TensorSpec("top_p", "float32", (1,)),
        TensorSpec("survivors_k", "int64", (1,), host=True),  # sizes a TopK: see Proposer.filtered
    ), (
        TensorSpec("stable_kv", act, (*kv, "new", t.head_dim)),
        TensorSpec("tokens", "int64", ("images", size - 1)),
        TensorSpec("parent", "int64", ("images", size)),
        TensorSpec("depth", "int64", ("images", size)),
        TensorSpec("ancestors", "bool", ("images", size, size)),
    ))
