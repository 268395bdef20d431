"""The speculative loop: EAGLE-2 speculative decoding (exact), LANTERN relaxed acceptance and VVS verification
skipping (both lossy by design), for every image of the batch at once. One cycle (the tree and the skip decision
come from the end of the previous cycle, or from the constructor)::

    verify the images that do not skip      # one target forward: pending chain ‖ tree
    accept a drafted path unverified        # the images that skip (VVS)
    withdraw what the target's filter removes # a verification after a skip checks the chain it committed
    commit, and feed the drafter
    tree = draft(...)                       # one draft_tree call for the next cycle
    skip = decide_skip(...)                 # VVS only
    plan = read()                           # the cycle's one device-to-host read

Of an image's ``count`` committed tokens the last ``chain_len`` may be unverified (a skipped cycle's), not yet in
the target cache. Batch state, positions and the plan: :mod:`vvs.runtime.decode`.
"""
from __future__ import annotations

import torch

from vvs.runtime.accept import Relaxation, accept_draws, greedy_accept, sample_accept
from vvs.runtime.cache import FeatureCache, KVCache, causal_within, gather_rows
from vvs.runtime.captured import CapturedCycle
from vvs.runtime.decode import DONE, SKIP, VERIFY, Decoding, Plan, read_plan, release
from vvs.runtime.sampling import sample
from vvs.runtime.skip import decide_skip, select_unverified
from vvs.runtime.tree import DraftTree, TreeDrafter


TREE_FIELDS = ("tokens", "parent", "depth", "ancestors")  # what a cycle copies of the next tree


class Speculation:
    """The speculative loop's state beyond :class:`Decoding`: the drafter and its cache, the feature cache, the
    unverified chain of a skipped cycle, what the drafter consumes next, and the next cycle's tree and decision."""

    def __init__(self, d: Decoding):
        self._setup(d)
        n, dev = self.n, self.dev
        self.drafter = TreeDrafter(self.tree_engine, d.layout, self._drafter_buffer(), self.opts.depth + 1)
        self.features = FeatureCache(d.layout, d.capacity, d.cfg.dim, d.engines.dtype, dev)
        self.chain = torch.zeros(n, self.width, dtype=torch.long, device=dev)  # unverified tokens of a skip
        self.chain_len = torch.zeros(n, dtype=torch.long, device=dev)
        self.last_skipped = torch.zeros(n, dtype=torch.bool, device=dev)
        self.cycle = torch.zeros(n, dtype=torch.long, device=dev)
        self.feed = NextFeed(self)

        pre = d.prefill()
        self.features.append(pre["hidden"], torch.arange(d.C, device=dev).expand(n, -1),
                             torch.full((n,), d.C, device=dev))
        # EAGLE pairing: the drafter slot consuming the token at position p + 1 gets the feature of position p.
        # The first slots consume the condition slots 1 … C-1 (placeholder id 0) and the first image token.
        ids = torch.zeros(n, d.C, dtype=torch.long, device=dev)
        ids[:, -1] = d.root
        first = (ids, pre["hidden"], torch.arange(1, d.C + 1, device=dev).expand(n, -1), torch.full((n,), d.C, device=dev))
        tree = self.draft(*first)
        self.tree = DraftTree(*(getattr(tree, f).clone() for f in TREE_FIELDS), tree.max_depth)  # updated in place
        self.skip = self.decide_skip()
        self.plan = self.read()

    def _setup(self, d: Decoding) -> None:
        opts = d.opts
        self.d, self.opts, self.n, self.dev = d, opts, d.n, d.dev
        self.tree_engine = d.engines.draft_tree(opts.tree)
        self.relax = Relaxation(d.engines.neighbours(opts.lantern_k), opts.lantern_delta) if opts.relaxed else None
        self.graph_inputs = {"cfg_mix": d.cfg_mix, **d.proc.graph_inputs()}
        self.width = opts.max_path_tokens  # widest chain, path, or drafter update
        self.accept_draws = accept_draws(opts.depth + 1, opts.draft_top_k)
        self.captured = CapturedCycle(self) if d.engines.capture_cycles else None

    def _drafter_buffer(self) -> torch.Tensor:
        d, e = self.d, self.d.engines
        return e.cache_buffer("drafter_kv", (e.drafter_layers, 2, d.layout.rows, d.cfg.n_head,
                                             KVCache.slots(d.capacity), d.cfg.head_dim), d.leases)

    @classmethod
    def combine(cls, parts: list[tuple["Speculation", torch.Tensor]]) -> "Speculation":
        s = cls.__new__(cls)
        s._setup(Decoding.combine([(p.d, images) for p, images in parts]))
        layout = s.d.layout
        s.drafter = parts[0][0].drafter.combined(layout, s._drafter_buffer(), [(p.drafter, i) for p, i in parts])
        s.features = FeatureCache.combine(layout, [(p.features, images) for p, images in parts])
        for name in ("chain", "chain_len", "last_skipped", "cycle", "skip"):
            setattr(s, name, torch.cat([getattr(p, name)[images] for p, images in parts]))
        s.feed = NextFeed.combine(s, [(p.feed, images) for p, images in parts])
        s.tree = DraftTree(*(torch.cat([getattr(p.tree, f)[images] for p, images in parts]) for f in TREE_FIELDS),
                           parts[0][0].tree.max_depth)
        s.plan = s.read()  # the chain width depends on who is in the batch
        release(parts)
        return s

    def step(self) -> None:
        """One cycle: (verify | accept without verification) → feed the drafter → draft → decide skip → read."""
        u = self.d.random.uniform(self.accept_draws + 1)  # every image's draws for this cycle, whatever it does
        if self.captured is not None:
            self.captured.replay(self, u)
        else:
            self.cycle_body(u, self.plan.key, self.plan.verifying)
        self.plan = self.read()

    def cycle_body(self, u: torch.Tensor, key: tuple, verifying_images: list[int] | torch.Tensor) -> None:
        """The device work of one cycle, shaped by ``key`` (:attr:`Plan.key`); in place on the loop's state."""
        verifies, skips, chain = key
        active = self.d.active
        verifying, skipping = active & ~self.skip, active & self.skip
        self.feed.reset()
        if verifies:
            self.verify(verifying, chain, u[:, : self.accept_draws], verifying_images)
        if skips:
            self.accept_unverified(skipping, u[:, self.accept_draws])
        self.advance(active)
        tree = self.draft(self.feed.ids, self.feed.features, self.feed.positions, self.feed.count)
        for f in TREE_FIELDS:
            getattr(self.tree, f).copy_(getattr(tree, f))
        self.skip.copy_(self.decide_skip())

    def read(self) -> Plan:
        active = self.d.active
        codes = torch.where(active, torch.where(self.skip, SKIP, VERIFY), DONE)
        chain = torch.where(active & ~self.skip, self.chain_len, 0).max()
        return read_plan(codes, chain)

    def draft(self, ids, features, positions, count) -> DraftTree:
        d = self.d
        d.clock.section("draft")
        tree = self.drafter.draft(ids, features, positions, count, d.root, d.C + d.count, self.graph_inputs)
        if d.forced is not None:  # a drafted node at a forced index is the forced token, whatever the drafter said
            at = d.forced[(d.count[:, None] + tree.depth).clamp(max=len(d.forced) - 1)]
            tree = DraftTree(torch.where(at >= 0, at, tree.tokens), tree.parent, tree.depth, tree.ancestors,
                             tree.max_depth)
        d.counters.add("drafter_forwards", d.active)
        d.clock.section("other")
        return tree

    def decide_skip(self) -> torch.Tensor:
        if not self.opts.skips:
            return torch.zeros(self.n, dtype=torch.bool, device=self.dev)
        d = self.d
        return d.active & decide_skip(self.opts, self.tree, self.cycle, d.count, d.N, self.last_skipped,
                                      d.engines.codebook)

    def verify(self, verifying: torch.Tensor, a_max: int, u: torch.Tensor, images: list[int] | torch.Tensor) -> None:
        """One target forward over the pending chain (``a_max`` wide) ‖ the tree of the verifying images; commit
        the chain and the accepted path."""
        d, n, dev, tree = self.d, self.n, self.dev, self.tree
        j = torch.arange(a_max, device=dev)
        in_chain = j[None, :] < self.chain_len[:, None]
        t = tree.size
        visible = torch.zeros(n, a_max + t, a_max + t, dtype=torch.bool, device=dev)
        visible[:, :a_max, :a_max] = causal_within(self.chain_len, a_max)
        visible[:, a_max:, :a_max] = in_chain[:, None, :]
        visible[:, a_max:, a_max:] = tree.ancestors
        root_pos = d.C + d.count
        out = d.verify(torch.cat([self.chain[:, :a_max], tree.tokens], 1),
                       torch.cat([d.kv.length[:, None] + j, root_pos[:, None] + tree.depth], 1), visible, images)
        logits = d.force(out["logits"][:, a_max:], d.count[:, None] + tree.depth + 1)  # node j predicts j's child
        if d.proc.greedy:
            acc = greedy_accept(tree, logits, self.relax)
        else:
            acc = sample_accept(tree, d.proc.probs(logits), self.relax, self.opts.draft_top_k, u)
        withdraw, sound, redraw = self.check_chain(out["logits"][:, :a_max], u[:, 0])
        withdraw &= verifying
        length = torch.where(verifying & ~withdraw, acc.length, 0)
        # target rows to keep, in order: the chain (its sound part), then the accepted path
        keep = _compact(torch.cat([j.expand(n, -1), a_max + acc.nodes.clamp(min=0)], 1),
                        torch.cat([in_chain, acc.nodes >= 0], 1))
        kept = torch.where(verifying, torch.where(withdraw, sound, self.chain_len + length), 0)
        d.kv.commit(out["new_kv"], keep, kept)
        self.features.append(out["hidden"], keep, kept)
        path = tree.tokens.gather(1, acc.nodes.clamp(min=0))
        if a_max > 0:  # only a chain can be withdrawn
            self.withdraw(withdraw, sound, redraw, out["hidden"])
        d.counters.record(verifying & ~withdraw, "verify", *d.counted(d.count, length))
        d.counters.add("target_forwards", verifying)
        d.append_tokens(path, length)
        # the drafter consumes the accepted drafts and the new root, fed the features of the accepted nodes
        ids = torch.cat([path[:, 1:], torch.zeros_like(path[:, :1])], 1)
        ids = ids.scatter(1, (length - 1).clamp(min=0)[:, None], acc.bonus[:, None])
        rows = torch.arange(d.layout.rows, device=dev)[:, None]
        self.feed.set(verifying & ~withdraw, ids, out["hidden"][rows, d.layout.expand(a_max + acc.nodes.clamp(min=0))],
                      length, acc.bonus)
        self.chain_len.copy_(torch.where(verifying, 0, self.chain_len))

    def check_chain(self, logits: torch.Tensor, u: torch.Tensor):
        """The target's verdict on the unverified chain a skipped cycle committed (``logits [n, a_max, V]`` of the
        chain's rows; row j predicts the chain's token j + 1, the last row the root after it). Returns, per image,
        whether a token there has target probability 0, how many chain tokens precede the first such one (they
        stay), and a token drawn from the target's distribution in its place (``u [n]``)."""
        d, n, a_max = self.d, self.n, logits.shape[1]
        if a_max == 0:
            none = torch.zeros(n, dtype=torch.long, device=self.dev)
            return none.bool(), none, none
        j = torch.arange(a_max, device=self.dev)
        start = d.count - self.chain_len  # the chain's first token, as an image-token index
        probs = d.proc.probs(d.force(logits, start[:, None] + j + 1))
        following = torch.where(j + 1 < self.chain_len[:, None], self.chain[:, 1 : a_max + 1], self.tree.tokens[:, :1])
        outside = (probs.gather(-1, following[..., None])[..., 0] == 0) & (j < self.chain_len[:, None])
        sound = torch.where(outside.any(1), outside.long().argmax(1), self.chain_len)  # first True, else the chain
        at = sound.clamp(max=a_max - 1)
        redraw = sample(probs[torch.arange(n, device=self.dev), at], d.proc.greedy, u)
        return outside.any(1), at + 1, redraw

    def withdraw(self, which: torch.Tensor, sound: torch.Tensor, redraw: torch.Tensor, hidden: torch.Tensor) -> None:
        """Take back the unverified tokens after the first ``sound[i]`` of the chain, and the tree drafted under
        them: the target cache already holds exactly the sound ones; the drafter forgets the slots that consumed
        the withdrawn ones and consumes ``redraw``, the new root, fed the target's feature of the last sound token."""
        d = self.d
        gone = torch.where(which, self.chain_len - sound, 0)  # the chain's withdrawn tokens
        d.count.sub_(gone)
        d.counters.record(which, "withdraw", *d.counted(d.count, gone))
        self.drafter.cache.length.sub_(torch.where(which, gone + 1, 0))  # and the slot of the discarded root
        rows = torch.arange(d.layout.rows, device=self.dev)
        last = hidden[rows, d.layout.expand(sound - 1)][:, None]
        self.feed.set(which, redraw[:, None], last, torch.ones_like(sound), redraw)

    def accept_unverified(self, skipping: torch.Tensor, u: torch.Tensor) -> None:
        """Commit a random drafted path, truncated, without a target forward. The next target forward runs over it
        to fill the caches: its tokens stay whatever the target would have sampled (VVS is lossy by design), unless
        the target's filter removes one (:meth:`check_chain`)."""
        d = self.d
        path, a, root = select_unverified(self.tree, self.width, u)
        a = torch.where(skipping, a, 0)
        d.counters.record(skipping, "skip", *d.counted(d.count, a))
        d.counters.add("skipped_verifications", skipping)
        d.append_tokens(path, a)
        self.chain.copy_(torch.where(skipping[:, None], path, self.chain))
        self.chain_len.copy_(torch.where(skipping, a, self.chain_len))
        # the drafter consumes the chain's drafts and the new root, fed the most recent cached features
        self.feed.set(skipping, path[:, 1:], self.features.most_recent(a, self.width), a, root)

    def advance(self, active: torch.Tensor) -> None:
        d, feed = self.d, self.feed
        root_pos = d.C + d.count - feed.count  # where the old root sat
        d.root.copy_(feed.root)
        feed.positions.copy_(root_pos[:, None] + 1 + torch.arange(self.width, device=self.dev))
        self.last_skipped.copy_(torch.where(active, self.skip, self.last_skipped))
        self.cycle.add_(active.long())


class NextFeed:
    """Per image, the drafter's next stable slots: tokens, features, positions, how many, and the new root."""

    def __init__(self, s: Speculation):
        d = s.d
        self.layout, self.d = d.layout, d
        self.ids = torch.zeros(s.n, s.width, dtype=torch.long, device=s.dev)
        self.features = torch.zeros(d.layout.rows, s.width, d.cfg.dim, dtype=d.engines.dtype, device=s.dev)
        self.positions = torch.zeros(s.n, s.width, dtype=torch.long, device=s.dev)
        self.count = torch.zeros(s.n, dtype=torch.long, device=s.dev)
        self.root = torch.zeros(s.n, dtype=torch.long, device=s.dev)

    @classmethod
    def combine(cls, s: Speculation, parts: list[tuple["NextFeed", torch.Tensor]]) -> "NextFeed":
        feed = cls(s)
        for name in ("ids", "positions", "count", "root"):
            setattr(feed, name, torch.cat([getattr(p, name)[images] for p, images in parts]))
        feed.features = gather_rows([(p.features, p.layout, images) for p, images in parts], 0)
        return feed

    def reset(self) -> None:
        """Images that neither verify nor skip (done ones) feed nothing and keep their root."""
        self.count.zero_()
        self.root.copy_(self.d.root)

    def set(self, which, ids, features, count, root) -> None:
        w = min(self.ids.shape[1], ids.shape[1], features.shape[1])
        self.ids[:, :w] = torch.where(which[:, None], ids[:, :w], self.ids[:, :w])
        rows = self.layout.expand(which)[:, None, None]
        self.features[:, :w] = torch.where(rows, features[:, :w].to(self.features.dtype), self.features[:, :w])
        self.count.copy_(torch.where(which, count, self.count))
        self.root.copy_(torch.where(which, root, self.root))


def _compact(index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Move the valid entries of each row to the front (stable), padding with 0."""
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    return torch.where(valid.gather(1, order), index.gather(1, order), 0)
