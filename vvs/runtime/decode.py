"""The decoding loops: vanilla AR, and speculative decoding (EAGLE-2 SD, LANTERN, VVS) in one loop.

One speculative cycle, for every image of the batch at once::

    tree = draft(...)                        # drafter: stable update + dynamic tree
    skip = decide_skip(...)                  # VVS only
    verify images that do not skip           # one target forward: pending chain ‖ tree
    commit accepted paths / unverified chains, and feed the drafter next cycle's inputs

Positions: condition slots are ``0 … C-1`` and image token ``i`` sits at ``C + i``. ``count[i]`` image tokens of
image i are committed (the last ``chain_len[i]`` of them unverified, not yet in the target cache); the root, the
next token, sits at ``C + count[i]``. An image is done once ``count + 1 >= N``.

Continuous batching: every per-image tensor and cache row moves with its image, so ``combine`` can take any
images of several batches (same options) into one batch at a cycle boundary, and each keeps its exact state.
"""
from __future__ import annotations

import torch

from vvs.engines.base import EngineSet
from vvs.models.gpt import caption_causal_mask, causal_mask
from vvs.runtime.accept import Relaxation, accept_draws, greedy_accept, sample_accept
from vvs.runtime.cache import FeatureCache, KVCache, RowLayout, attention_mask, causal_within, gather_rows
from vvs.runtime.options import DecodeOptions
from vvs.runtime.random import ImageRandom
from vvs.runtime.sampling import Processor, cfg_matrix, sample
from vvs.runtime.skip import decide_skip, select_unverified
from vvs.runtime.stats import ImageStats, Stopwatch
from vvs.runtime.tree import DraftTree, TreeDrafter


class Decoding:
    """State of one batch: caches, committed tokens, statistics."""

    def __init__(self, engines: EngineSet, conditions: torch.Tensor, opts: DecodeOptions, seeds: list[int],
                 caption_mask: torch.Tensor | None = None):
        self._setup(engines, opts, conditions.shape[0])
        self.random = ImageRandom(seeds, self.dev)
        self.conditions = conditions.to(self.dev)
        self.kv = KVCache(self.layout, self._kv_buffer())
        self.caption_mask = None if caption_mask is None else caption_mask.to(self.dev)
        if self.caption_mask is not None:  # padded caption slots stay invisible to every later query
            self.kv.blocked[:, : self.C] = ~self.caption_mask
        self.tokens = torch.zeros(self.n, self.N + self.slack, dtype=torch.long, device=self.dev)
        self.count = torch.zeros(self.n, dtype=torch.long, device=self.dev)
        self.root = torch.zeros(self.n, dtype=torch.long, device=self.dev)
        self.stats = [ImageStats(prefill_forwards=1, target_forwards=1) for _ in range(self.n)]

    def _setup(self, engines: EngineSet, opts: DecodeOptions, n: int) -> None:
        """What depends only on the engines, the options and the batch size."""
        cfg = engines.target
        self.engines, self.opts, self.cfg = engines, opts, cfg
        self.dev = engines.device
        self.n = n
        self.layout = RowLayout(n, guided=opts.guided)
        self.cfg_mix = cfg_matrix(n, opts.cfg_scale, device=self.dev)
        self.proc = Processor(opts.temperature, opts.top_k, opts.top_p, device=self.dev)
        self.C, self.N = cfg.cls_token_num, cfg.num_image_tokens
        self.slack = 2 * opts.max_path_tokens  # room for a chain and a path committed past the last token
        self.capacity = self.C + self.N + self.slack
        self.leases: list = []  # this batch's cache buffers, returned to the engine set afterwards
        self.clock = Stopwatch(self.dev)
        self.arange = torch.arange(n, device=self.dev)
        self.subset_kv: dict[int, torch.Tensor] = {}

    def _kv_buffer(self) -> torch.Tensor:
        cfg = self.cfg
        return self.engines.cache_buffer(
            "target_kv", (cfg.n_layer, 2, self.layout.rows, cfg.n_head, self.capacity, cfg.head_dim), self.leases)

    @classmethod
    def combine(cls, parts: list[tuple["Decoding", torch.Tensor]]) -> "Decoding":
        """One batch of the chosen images (index tensors) of ``parts``, in order. The parts share engines and
        options; the caller returns their cache buffers (:func:`_release`) once everything is copied."""
        first = parts[0][0]
        d = cls.__new__(cls)
        d._setup(first.engines, first.opts, sum(len(images) for _, images in parts))
        for p, _ in parts:
            p.settle_time()
        d.random = ImageRandom.combine([(p.random, images) for p, images in parts])
        d.conditions = torch.cat([p.conditions[images] for p, images in parts])
        d.kv = KVCache.combine(d.layout, d._kv_buffer(), [(p.kv, images) for p, images in parts])
        d.caption_mask = None if first.caption_mask is None else torch.cat(
            [p.caption_mask[images] for p, images in parts])
        for name in ("tokens", "count", "root"):
            setattr(d, name, torch.cat([getattr(p, name)[images] for p, images in parts]))
        d.stats = [p.stats[i] for p, images in parts for i in images.tolist()]
        return d

    # ------------------------------------------------------------------ shared steps

    @property
    def active(self) -> torch.Tensor:
        return self.count + 1 < self.N

    def max_position(self) -> int:
        return self.cfg.max_positions - 1

    def prefill_mask(self) -> torch.Tensor:
        """Causal over the condition slots; with a left-padded caption, padded slots are seen by no other slot
        (LlamaGen's ``generate``, see :func:`caption_causal_mask`)."""
        if self.caption_mask is None:
            return causal_mask(self.C, self.dev).expand(self.layout.rows, -1, -1, -1)
        return self.layout.expand(caption_causal_mask(self.caption_mask, self.C))  # uncond rows reuse the cond mask

    def prefill(self) -> dict[str, torch.Tensor]:
        self.clock.section("verify")
        uncond = self.null_condition() if self.layout.groups == 2 else None
        condition = self.conditions if uncond is None else torch.cat([self.conditions, uncond])
        out = self.engines.graphs["target_prefill"].run(condition=condition, attn_mask=self.prefill_mask(),
                                                        cfg_mix=self.cfg_mix)
        self.clock.section("other")
        c = torch.arange(self.C, device=self.dev)
        self.kv.commit(out["new_kv"], c.expand(self.n, -1), torch.full((self.n,), self.C, device=self.dev))
        self.root = sample(self.proc.probs(out["logits"]), self.proc.greedy, self.random.uniform(1)[:, 0])
        return out

    def null_condition(self) -> torch.Tensor:
        if self.cfg.model_type == "c2i":
            return torch.full((self.n,), self.cfg.null_class, dtype=torch.long, device=self.dev)
        return self.engines.null_condition.to(self.dev, self.engines.dtype).expand(self.n, -1, -1)

    def verify(self, new_ids: torch.Tensor, positions: torch.Tensor, new_visible: torch.Tensor,
               images: torch.Tensor | None = None):
        """One target forward over ``new_ids [n, T]`` at ``positions [n, T]`` with visibility ``[n, T, T]``.

        Only ``images`` (indices; all when None) take part, so an image that skips its verification costs no
        target compute; the outputs still cover the whole batch, zero for the images left out."""
        self.clock.section("verify")
        t = new_ids.shape[1]
        positions = positions.clamp(max=self.max_position())
        past = self.kv.prefix_visible(t)
        if images is None or images.numel() == self.n:
            out = self.engines.graphs["target_verify"].run(
                input_ids=self.layout.expand(new_ids), position_ids=self.layout.expand(positions),
                attn_mask=attention_mask(self.layout, past, new_visible), past_kv=self.kv.kv, cfg_mix=self.cfg_mix)
        else:
            out = self._verify_subset(images, new_ids, positions, past, new_visible)
        self.clock.section("other")
        return out

    def _verify_subset(self, images, new_ids, positions, past, new_visible) -> dict[str, torch.Tensor]:
        m = images.numel()
        sub = RowLayout(m, guided=self.layout.groups == 2)
        rows = self.layout.row_ids(images)
        kv = self.subset_kv.get(m)
        if kv is None:  # one buffer per subset size keeps addresses fixed (CUDA graphs, TensorRT)
            shape = list(self.kv.kv.shape)
            shape[2] = sub.rows
            kv = self.subset_kv[m] = self.engines.cache_buffer(f"target_kv_subset{m}", tuple(shape), self.leases)
        torch.index_select(self.kv.kv, 2, rows, out=kv)
        out = self.engines.graphs["target_verify"].run(
            input_ids=sub.expand(new_ids[images]), position_ids=sub.expand(positions[images]),
            attn_mask=attention_mask(sub, past[images], new_visible[images]), past_kv=kv,
            cfg_mix=cfg_matrix(m, self.opts.cfg_scale, device=self.dev))
        logits = out["logits"].new_zeros(self.n, *out["logits"].shape[1:])
        logits[images] = out["logits"]
        hidden = out["hidden"].new_zeros(self.layout.rows, *out["hidden"].shape[1:])
        hidden[rows] = out["hidden"]
        new_kv = out["new_kv"].new_zeros(*out["new_kv"].shape[:2], self.layout.rows, *out["new_kv"].shape[3:])
        new_kv[:, :, rows] = out["new_kv"]
        return {"logits": logits, "hidden": hidden, "new_kv": new_kv}

    def append_tokens(self, values: torch.Tensor, count: torch.Tensor) -> None:
        """Commit ``values[i, :count[i]]`` after image i's tokens."""
        j = torch.arange(values.shape[1], device=self.dev)
        valid = j < count[:, None]
        img, col = valid.nonzero(as_tuple=True)
        self.tokens[img, self.count[img] + col] = values[img, col]
        self.count = self.count + count

    def settle_time(self) -> None:
        """Share the wall time since the last settlement equally among the batch's images."""
        times = self.clock.take()
        for s in self.stats:
            s.draft_seconds += times["draft"] / self.n
            s.verify_seconds += times["verify"] / self.n
            s.other_seconds += times["other"] / self.n
            s.seconds = s.draft_seconds + s.verify_seconds + s.other_seconds

    def finish(self, images: torch.Tensor | None = None) -> tuple[torch.Tensor, list[ImageStats]]:
        """Tokens ``[m, N]`` and statistics of finished images (all when None)."""
        images = self.arange if images is None else images
        self.tokens[images, self.count[images].clamp(max=self.tokens.shape[1] - 1)] = self.root[images]
        self.settle_time()
        stats = [self.stats[i] for i in images.tolist()]
        for s in stats:
            s.tokens = self.N
        return self.tokens[images, : self.N].clone(), stats


# ---------------------------------------------------------------------- vanilla AR


class AutoRegression:
    """Vanilla AR: one target forward per token."""

    def __init__(self, d: Decoding):
        self.d = d
        d.prefill()

    @classmethod
    def combine(cls, parts: list[tuple["AutoRegression", torch.Tensor]]) -> "AutoRegression":
        loop = cls.__new__(cls)
        loop.d = Decoding.combine([(p.d, images) for p, images in parts])
        _release(parts)
        return loop

    def step(self) -> None:
        d = self.d
        active = d.active
        out = d.verify(d.root[:, None], (d.C + d.count)[:, None], torch.ones(d.n, 1, 1, dtype=torch.bool, device=d.dev))
        step = active.long()
        d.kv.commit(out["new_kv"], torch.zeros(d.n, 1, dtype=torch.long, device=d.dev), step)
        before = d.count.clone()
        d.append_tokens(d.root[:, None], step)
        nxt = sample(d.proc.probs(out["logits"][:, 0]), d.proc.greedy, d.random.uniform(1)[:, 0])
        d.root = torch.where(active, nxt, d.root)
        for i in active.nonzero().flatten().tolist():
            d.stats[i].target_forwards += 1
            d.stats[i].trace.append(["ar", int(before[i]), 1])


# ---------------------------------------------------------------------- speculative decoding (SD, LANTERN, VVS)


class Speculation:
    """The speculative loop's state beyond :class:`Decoding`: the drafter and its cache, the feature cache, the
    unverified chain of a skipped cycle, and what the drafter consumes next."""

    def __init__(self, d: Decoding):
        self._setup(d)
        n, dev = self.n, self.dev
        self.drafter = TreeDrafter(d.engines.graphs["drafter_step"], d.layout, self._drafter_buffer(), d.capacity,
                                   self.opts.depth, self.opts.draft_top_k, d.max_position())
        self.features = FeatureCache(d.layout, d.capacity, d.cfg.dim, d.engines.dtype, dev)
        self.chain = torch.zeros(n, self.width, dtype=torch.long, device=dev)  # unverified tokens of a skip
        self.chain_len = torch.zeros(n, dtype=torch.long, device=dev)
        self.last_skipped = torch.zeros(n, dtype=torch.bool, device=dev)
        self.cycle = torch.zeros(n, dtype=torch.long, device=dev)

        pre = d.prefill()
        self.features.append(pre["hidden"], torch.arange(d.C, device=dev).expand(n, -1),
                             torch.full((n,), d.C, device=dev))
        # EAGLE pairing: the drafter slot consuming the token at position p + 1 gets the feature of position p.
        # The first slots consume the condition slots 1 … C-1 (placeholder id 0) and the first image token.
        ids = torch.zeros(n, d.C, dtype=torch.long, device=dev)
        ids[:, -1] = d.root
        self.feed = (ids, pre["hidden"], torch.arange(1, d.C + 1, device=dev).expand(n, -1),
                     torch.full((n,), d.C, device=dev))

    def _setup(self, d: Decoding) -> None:
        opts = d.opts
        self.d, self.opts, self.n, self.dev = d, opts, d.n, d.dev
        self.relax = Relaxation(d.engines.neighbours(opts.lantern_k), opts.lantern_delta) if opts.relaxed else None
        self.graph_inputs = {"cfg_mix": d.cfg_mix, **d.proc.graph_inputs()}
        self.width = opts.max_path_tokens  # widest chain, path, or drafter update
        self.accept_draws = accept_draws(opts.depth + 1, opts.draft_top_k)

    def _drafter_buffer(self) -> torch.Tensor:
        d, e, opts = self.d, self.d.engines, self.opts
        return e.cache_buffer("drafter_kv", (e.drafter_layers, 2, d.layout.rows, d.cfg.n_head,
                                             d.capacity + opts.depth * opts.draft_top_k, d.cfg.head_dim), d.leases)

    @classmethod
    def combine(cls, parts: list[tuple["Speculation", torch.Tensor]]) -> "Speculation":
        s = cls.__new__(cls)
        s._setup(Decoding.combine([(p.d, images) for p, images in parts]))
        layout = s.d.layout
        s.drafter = parts[0][0].drafter.combined(layout, s._drafter_buffer(), [(p.drafter, i) for p, i in parts])
        s.features = FeatureCache.combine(layout, [(p.features, images) for p, images in parts])
        for name in ("chain", "chain_len", "last_skipped", "cycle"):
            setattr(s, name, torch.cat([getattr(p, name)[images] for p, images in parts]))
        # the drafter's next slots: as many as the widest part has (a batch just prefilled has C of them)
        m = max(p.feed[0].shape[1] for p, _ in parts)
        feeds = [[torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, m - x.shape[1])) for x in p.feed[:3]]
                 for p, _ in parts]
        s.feed = (torch.cat([f[0][images] for f, (_, images) in zip(feeds, parts)]),
                  gather_rows([(f[1], p.d.layout, images) for f, (p, images) in zip(feeds, parts)], 0),
                  torch.cat([f[2][images] for f, (_, images) in zip(feeds, parts)]),
                  torch.cat([p.feed[3][images] for p, images in parts]))
        _release(parts)
        return s

    def step(self) -> None:
        """One cycle: draft → decide skip → (verify | accept without verification) → feed the drafter."""
        d = self.d
        active = d.active
        u = d.random.uniform(self.accept_draws + 1)  # every image's draws for this cycle, whatever it does
        tree = self.draft(active)
        skip = self.decide_skip(tree, active)
        nxt = NextFeed(self)
        if (active & ~skip).any():
            self.verify(tree, active & ~skip, nxt, u[:, : self.accept_draws])
        if skip.any():
            self.accept_unverified(tree, skip, nxt, u[:, self.accept_draws])
        self.advance(nxt, active, skip)

    def draft(self, active: torch.Tensor) -> DraftTree:
        d = self.d
        d.clock.section("draft")
        before = self.drafter.forwards
        first = self.drafter.extend(*self.feed, self.graph_inputs)
        tree = self.drafter.grow(d.root, d.C + d.count, first, self.opts.tree_size, self.graph_inputs)
        d.clock.section("other")
        for i in active.nonzero().flatten().tolist():
            d.stats[i].drafter_forwards += self.drafter.forwards - before
        return tree

    def decide_skip(self, tree: DraftTree, active: torch.Tensor) -> torch.Tensor:
        if not self.opts.skips:
            return torch.zeros_like(active)
        return active & decide_skip(self.opts, tree, self.cycle, self.d.count, self.last_skipped, self.d.engines.codebook)

    def verify(self, tree: DraftTree, verifying: torch.Tensor, nxt: "NextFeed", u: torch.Tensor) -> None:
        """One target forward over the pending chain ‖ the tree of the verifying images; commit the chain and the
        accepted path."""
        d, n, dev = self.d, self.n, self.dev
        a_max = int(torch.where(verifying, self.chain_len, 0).max())
        j = torch.arange(a_max, device=dev)
        in_chain = j[None, :] < self.chain_len[:, None]
        t = tree.size
        visible = torch.zeros(n, a_max + t, a_max + t, dtype=torch.bool, device=dev)
        visible[:, :a_max, :a_max] = causal_within(self.chain_len, a_max)
        visible[:, a_max:, :a_max] = in_chain[:, None, :]
        visible[:, a_max:, a_max:] = tree.ancestors
        root_pos = d.C + d.count
        out = d.verify(torch.cat([self.chain[:, :a_max], tree.tokens], 1),
                       torch.cat([d.kv.length[:, None] + j, root_pos[:, None] + tree.depth], 1), visible,
                       images=verifying.nonzero().flatten())
        logits = out["logits"][:, a_max:]
        if d.proc.greedy:
            acc = greedy_accept(tree, logits, self.relax)
        else:
            acc = sample_accept(tree, d.proc.probs(logits), self.relax, self.opts.draft_top_k, u)
        length = torch.where(verifying, acc.length, 0)
        # target rows to keep, in order: the chain, then the accepted path
        keep = _compact(torch.cat([j.expand(n, -1), a_max + acc.nodes.clamp(min=0)], 1),
                        torch.cat([in_chain, acc.nodes >= 0], 1))
        kept = torch.where(verifying, self.chain_len + length, 0)
        d.kv.commit(out["new_kv"], keep, kept)
        self.features.append(out["hidden"], keep, kept)
        path = tree.tokens.gather(1, acc.nodes.clamp(min=0))
        before = d.count.clone()
        d.append_tokens(path, length)
        # the drafter consumes the accepted drafts and the new root, fed the features of the accepted nodes
        ids = torch.cat([path[:, 1:], torch.zeros_like(path[:, :1])], 1)
        ids = ids.scatter(1, (length - 1).clamp(min=0)[:, None], acc.bonus[:, None])
        rows = torch.arange(d.layout.rows, device=dev)[:, None]
        nxt.set(verifying, ids, out["hidden"][rows, d.layout.expand(a_max + acc.nodes.clamp(min=0))], length,
                acc.bonus)
        self.chain_len = torch.where(verifying, 0, self.chain_len)
        for i in verifying.nonzero().flatten().tolist():
            d.stats[i].target_forwards += 1
            d.stats[i].accept_lengths.append(int(length[i]))
            d.stats[i].trace.append(["verify", int(before[i]), int(length[i])])

    def accept_unverified(self, tree: DraftTree, skipping: torch.Tensor, nxt: "NextFeed", u: torch.Tensor) -> None:
        """Commit a random drafted path, truncated, without a target forward; it is verified next cycle."""
        d = self.d
        path, a, root = select_unverified(tree, self.width, u)
        a = torch.where(skipping, a, 0)
        before = d.count.clone()
        d.append_tokens(path, a)
        self.chain = torch.where(skipping[:, None], path, self.chain)
        self.chain_len = torch.where(skipping, a, self.chain_len)
        # the drafter consumes the chain's drafts and the new root, fed the most recent cached features
        nxt.set(skipping, path[:, 1:], self.features.most_recent(a, self.width), a, root)
        for i in skipping.nonzero().flatten().tolist():
            d.stats[i].skipped_verifications += 1
            d.stats[i].skip_lengths.append(int(a[i]))
            d.stats[i].trace.append(["skip", int(before[i]), int(a[i])])

    def advance(self, nxt: "NextFeed", active: torch.Tensor, skip: torch.Tensor) -> None:
        d = self.d
        root_pos = d.C + d.count - nxt.count  # where the old root sat
        d.root = nxt.root
        self.feed = (nxt.ids, nxt.features, root_pos[:, None] + 1 + torch.arange(self.width, device=self.dev),
                     nxt.count)
        self.last_skipped = torch.where(active, skip, self.last_skipped)
        self.cycle = self.cycle + active.long()


class NextFeed:
    """Per image, the drafter's next stable slots: tokens, features, how many, and the new root."""

    def __init__(self, s: Speculation):
        d = s.d
        self.layout = d.layout
        self.ids = torch.zeros(s.n, s.width, dtype=torch.long, device=s.dev)
        self.features = torch.zeros(d.layout.rows, s.width, d.cfg.dim, dtype=d.engines.dtype, device=s.dev)
        self.count = torch.zeros(s.n, dtype=torch.long, device=s.dev)
        self.root = d.root.clone()

    def set(self, which, ids, features, count, root) -> None:
        w = min(self.ids.shape[1], ids.shape[1], features.shape[1])
        self.ids[:, :w] = torch.where(which[:, None], ids[:, :w], self.ids[:, :w])
        rows = self.layout.expand(which)[:, None, None]
        self.features[:, :w] = torch.where(rows, features[:, :w].to(self.features.dtype), self.features[:, :w])
        self.count = torch.where(which, count, self.count)
        self.root = torch.where(which, root, self.root)


def _compact(index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Move the valid entries of each row to the front (stable), padding with 0."""
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    return torch.where(valid.gather(1, order), index.gather(1, order), 0)


def _release(parts) -> None:
    """Return the cache buffers of batches that were combined into another."""
    for p, _ in parts:
        p.d.engines.release(p.d.leases)


Loop = AutoRegression | Speculation


def start(d: Decoding) -> Loop:
    """Prefill a batch and return its decoding loop for ``d.opts.mode``."""
    return AutoRegression(d) if d.opts.mode == "ar" else Speculation(d)


def run(loop: Loop) -> tuple[torch.Tensor, list[ImageStats]]:
    while loop.d.active.any():
        loop.step()
    return loop.d.finish()

