"""The decoding loops: vanilla AR, and speculative decoding (EAGLE-2 SD, LANTERN, VVS) in one loop.

One speculative cycle, for every image of the batch at once (the tree and the skip decision come from the end of
the previous cycle, or from :func:`start`)::

    verify the images that do not skip      # one target forward: pending chain ‖ tree
    accept a drafted path unverified        # the images that skip (VVS)
    withdraw what the target's filter removes # a verification after a skip checks the chain it committed
    commit, and feed the drafter
    tree = draft(...)                       # one draft_tree call for the next cycle
    skip = decide_skip(...)                 # VVS only
    plan = read()                           # the cycle's one device-to-host read

Everything in a cycle stays on the device except that one small read, the *plan*: per image whether it is done,
verifies or skips next, and the widest pending chain. The host needs it anyway to stop, to hand finished images
back, and to leave the target forward out when no image verifies; nothing else waits for the device, so a GPU's
launch queue never drains inside a cycle and the whole cycle can be captured as one CUDA graph
(:class:`~vvs.runtime.captured.CapturedCycle`). State lives in fixed tensors updated in place for the same reason.

Positions: condition slots are ``0 … C-1`` and image token ``i`` sits at ``C + i``. ``count[i]`` image tokens of
image i are committed (the last ``chain_len[i]`` of them unverified, not yet in the target cache); the root, the
next token, sits at ``C + count[i]``. An image is done once ``count + 1 >= N``.

Continuous batching: every per-image tensor and cache row moves with its image, so ``combine`` can take any
images of several batches (same options) into one batch at a cycle boundary, and each keeps its exact state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vvs.engines.base import EngineSet
from vvs.models.layers import caption_causal_mask, causal_mask
from vvs.runtime.accept import Relaxation, accept_draws, greedy_accept, sample_accept
from vvs.runtime.cache import FeatureCache, KVCache, RowLayout, attention_mask, causal_within, gather_rows
from vvs.runtime.captured import CapturedCycle
from vvs.runtime.conditions import force_logits
from vvs.runtime.options import DecodeOptions
from vvs.runtime.random import ImageRandom
from vvs.runtime.sampling import Processor, cfg_matrix, sample
from vvs.runtime.skip import decide_skip, select_unverified
from vvs.runtime.stats import Counters, ImageStats, Stopwatch
from vvs.runtime.tree import DraftTree, TreeDrafter

DONE, VERIFY, SKIP = 0, 1, 2  # an image's next cycle, as the plan says
TREE_FIELDS = ("tokens", "parent", "depth", "ancestors")


@dataclass(frozen=True)
class Plan:
    """What the host knows after a cycle's one read."""

    states: tuple[int, ...]  # per image: DONE, VERIFY or SKIP
    chain: int  # the widest unverified chain among the images that verify

    @property
    def done(self) -> list[bool]:
        return [s == DONE for s in self.states]

    @property
    def finished(self) -> bool:
        return all(s == DONE for s in self.states)

    def images(self, state: int) -> list[int]:
        return [i for i, s in enumerate(self.states) if s == state]

    @property
    def verifying(self) -> list[int]:
        return self.images(VERIFY)

    @property
    def key(self) -> tuple:
        """What shapes the next cycle's work: whether anything verifies or skips, and the chain's width."""
        return VERIFY in self.states, SKIP in self.states, self.chain


def read_plan(codes: torch.Tensor, chain: torch.Tensor) -> Plan:
    """The one device-to-host read of a cycle."""
    values = torch.cat([codes, chain.reshape(1)]).tolist()
    return Plan(tuple(values[:-1]), values[-1])


def read_active(d: "Decoding") -> Plan:
    """The plan of a loop without skips: every image verifies until it is done."""
    return read_plan(d.active.long(), torch.zeros((), dtype=torch.long, device=d.dev))


class Decoding:
    """State of one batch: caches, committed tokens, statistics."""

    def __init__(self, engines: EngineSet, conditions: torch.Tensor, opts: DecodeOptions, seeds: list[int],
                 caption_mask: torch.Tensor | None = None):
        self._setup(engines, opts, conditions.shape[0])
        self.random = ImageRandom(seeds, self.dev)
        # captions in the graphs' activation dtype (fp16 folders); class ids stay int64
        self.conditions = conditions.to(self.dev, engines.dtype if conditions.is_floating_point() else conditions.dtype)
        self.kv = KVCache(self.layout, self._kv_buffer())
        self.caption_mask = None if caption_mask is None else caption_mask.to(self.dev)
        # one spare column past the slack: writes that do not count land there (no data-dependent indexing)
        self.tokens = torch.zeros(self.n, self.N + self.slack + 1, dtype=torch.long, device=self.dev)
        self.count = torch.zeros(self.n, dtype=torch.long, device=self.dev)
        self.root = torch.zeros(self.n, dtype=torch.long, device=self.dev)
        self.stats = [ImageStats(prefill_forwards=1, target_forwards=1) for _ in range(self.n)]
        self.counters = Counters(self.n, 2 * self.N, self.dev)  # a withdrawal's cycle can follow each skip

    def _setup(self, engines: EngineSet, opts: DecodeOptions, n: int) -> None:
        """What depends only on the engines, the options and the batch size."""
        cfg = engines.target
        self.engines, self.opts, self.cfg = engines, opts, cfg
        self.dev = engines.device
        self.n = n
        self.layout = RowLayout(n, guided=opts.guided)
        self.cfg_mix = cfg_matrix(n, opts.cfg_scale, device=self.dev)
        self.proc = Processor(opts.temperature, opts.top_k, opts.top_p, device=self.dev, vocab_size=cfg.vocab_size)
        self.C, self.N = cfg.cls_token_num, cfg.num_image_tokens
        self.slack = 2 * opts.max_path_tokens  # room for a chain and a path committed past the last token
        self.capacity = self.C + self.N + self.slack
        self.leases: list = []  # this batch's cache buffers, returned to the engine set afterwards
        self.clock = Stopwatch(self.dev)
        self.arange = torch.arange(n, device=self.dev)
        self.subset_kv: torch.Tensor | None = None
        # the family's forced tokens, by stream index (None: every token is the model's choice)
        layout = engines.token_layout
        self.forced, self.free_before = (None, None) if layout is None else layout.tables(
            self.capacity, cfg.vocab_size, self.dev)
        self.free_tokens = self.N if layout is None else layout.free_tokens(self.N)  # what the statistics credit

    def _kv_buffer(self) -> torch.Tensor:
        cfg = self.cfg
        return self.engines.cache_buffer("target_kv", (cfg.n_layer, 2, self.layout.rows, cfg.n_head,
                                                       KVCache.slots(self.capacity), cfg.head_dim), self.leases)

    @classmethod
    def combine(cls, parts: list[tuple["Decoding", torch.Tensor]]) -> "Decoding":
        """One batch of the chosen images (index tensors) of ``parts``, in order. The parts share engines and
        options; the caller returns their cache buffers (:func:`release`) once everything is copied."""
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
        d.counters = Counters.combine([(p.counters, images) for p, images in parts])
        return d

    # ------------------------------------------------------------------ shared steps

    @property
    def active(self) -> torch.Tensor:
        return self.count + 1 < self.N

    def max_position(self) -> int:
        return self.cfg.max_positions - 1

    def prefill(self) -> dict[str, torch.Tensor]:
        """The condition slots of every row, guidance nulls included. With a left-padded condition, padded slots
        are seen by no other slot, now or later (LlamaGen's ``generate``, see :func:`caption_causal_mask`); a null
        attends the slots its family's conditioning says."""
        self.clock.section("verify")
        condition, slots = self.conditions, self.caption_mask
        if self.layout.groups == 2:
            uncond, uncond_slots = self.engines.conditioning.null(self.engines, self.conditions, self.caption_mask)
            condition = torch.cat([condition, uncond])
            slots = None if slots is None else torch.cat([slots, uncond_slots.to(self.dev)])
        if slots is None:
            mask = causal_mask(self.C, self.dev).expand(self.layout.rows, -1, -1, -1)
        else:
            mask = caption_causal_mask(slots, self.C)
            self.kv.blocked[:, : self.C] = ~slots
        out = self.engines.graphs["target_prefill"].run(condition=condition, attn_mask=mask, cfg_mix=self.cfg_mix)
        self.clock.section("other")
        c = torch.arange(self.C, device=self.dev)
        self.kv.commit(out["new_kv"], c.expand(self.n, -1), torch.full((self.n,), self.C, device=self.dev))
        first = self.force(out["logits"], torch.zeros(self.n, dtype=torch.long, device=self.dev))
        self.root.copy_(sample(self.proc.probs(first), self.proc.greedy, self.random.uniform(1)[:, 0]))
        return out

    def verify(self, new_ids: torch.Tensor, positions: torch.Tensor, new_visible: torch.Tensor,
               images: list[int] | torch.Tensor | None = None):
        """One target forward over ``new_ids [n, T]`` at ``positions [n, T]`` with visibility ``[n, T, T]``.

        Only ``images`` (indices; all when None) take part, so an image that skips its verification costs no
        target compute; the outputs still cover the whole batch, zero for the images left out."""
        self.clock.section("verify")
        t = new_ids.shape[1]
        positions = positions.clamp(max=self.max_position())
        past = self.kv.prefix_visible(t)
        if images is None or len(images) == self.n:
            out = self.engines.graphs["target_verify"].run(
                input_ids=self.layout.expand(new_ids), position_ids=self.layout.expand(positions),
                attn_mask=attention_mask(self.layout, past, new_visible), past_kv=self.kv.kv, cfg_mix=self.cfg_mix)
        else:
            out = self._verify_subset(torch.as_tensor(images, device=self.dev), new_ids, positions, past, new_visible)
        self.clock.section("other")
        return out

    def _verify_subset(self, images, new_ids, positions, past, new_visible) -> dict[str, torch.Tensor]:
        m = images.numel()
        sub = RowLayout(m, guided=self.layout.groups == 2)
        rows = self.layout.row_ids(images)
        kv = self._subset_kv(sub.rows)
        torch.index_select(self.kv.kv, 2, rows, out=kv)
        out = self.engines.graphs["target_verify"].run(
            input_ids=sub.expand(new_ids[images]), position_ids=sub.expand(positions[images]),
            attn_mask=attention_mask(sub, past[rows], new_visible[images]), past_kv=kv,
            cfg_mix=cfg_matrix(m, self.opts.cfg_scale, device=self.dev))
        logits = out["logits"].new_zeros(self.n, *out["logits"].shape[1:])
        logits[images] = out["logits"]
        hidden = out["hidden"].new_zeros(self.layout.rows, *out["hidden"].shape[1:])
        hidden[rows] = out["hidden"]
        new_kv = out["new_kv"].new_zeros(*out["new_kv"].shape[:2], self.layout.rows, *out["new_kv"].shape[3:])
        new_kv[:, :, rows] = out["new_kv"]
        return {"logits": logits, "hidden": hidden, "new_kv": new_kv}

    def _subset_kv(self, rows: int) -> torch.Tensor:
        """A KV buffer for ``rows`` batch rows: the leading elements of one buffer sized for the whole batch, so a
        batch holds one extra KV whatever subset sizes it meets, and the address stays fixed (TensorRT binds it)."""
        if self.subset_kv is None:
            self.subset_kv = self.engines.cache_buffer("target_kv_subset", tuple(self.kv.kv.shape), self.leases)
        shape = list(self.kv.kv.shape)
        shape[2] = rows
        return self.subset_kv.view(-1)[: math.prod(shape)].view(shape)

    def append_tokens(self, values: torch.Tensor, count: torch.Tensor) -> None:
        """Commit ``values[i, :count[i]]`` after image i's tokens."""
        j = torch.arange(values.shape[1], device=self.dev)
        spare = self.tokens.shape[1] - 1
        col = torch.where(j < count[:, None], (self.count[:, None] + j).clamp(max=spare - 1), spare)
        self.tokens.scatter_(1, col, values)
        self.count.add_(count)

    def force(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``logits [..., V]`` predicting stream indices ``index [...]``, with the family's forced tokens forced."""
        if self.forced is None:
            return logits
        return force_logits(logits, self.forced[index.clamp(max=len(self.forced) - 1)])

    def counted(self, start: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens before, tokens committed) as the statistics count them: forced tokens are no one's choice."""
        if self.free_before is None:
            return start, length
        end = (start + length).clamp(max=len(self.free_before) - 1)
        return self.free_before[start], self.free_before[end] - self.free_before[start]

    def settle_time(self) -> None:
        """Share the wall time since the last settlement equally among the batch's images."""
        times = self.clock.take()
        for s in self.stats:
            s.draft_seconds += times["draft"] / self.n
            s.verify_seconds += times["verify"] / self.n
            s.other_seconds += times["other"] / self.n
            s.seconds = s.draft_seconds + s.verify_seconds + s.other_seconds

    def finish(self, images: list[int] | None = None) -> tuple[torch.Tensor, list[ImageStats]]:
        """Tokens ``[m, N]`` and statistics of finished images (all when None)."""
        images = list(range(self.n)) if images is None else images
        index = torch.tensor(images, device=self.dev)
        self.tokens[index, self.count[index].clamp(max=self.tokens.shape[1] - 2)] = self.root[index]
        self.settle_time()
        stats = [self.stats[i] for i in images]
        self.counters.fill(index, stats)
        for s in stats:
            s.tokens = self.free_tokens
        return self.tokens[index, : self.N].clone(), stats


# ---------------------------------------------------------------------- vanilla AR


class AutoRegression:
    """Vanilla AR: one target forward per token."""

    def __init__(self, d: Decoding):
        self.d = d
        d.prefill()
        self.plan = self.read()

    @classmethod
    def combine(cls, parts: list[tuple["AutoRegression", torch.Tensor]]) -> "AutoRegression":
        loop = cls.__new__(cls)
        loop.d = Decoding.combine([(p.d, images) for p, images in parts])
        loop.plan = Plan(tuple(p.plan.states[i] for p, images in parts for i in images.tolist()), 0)
        release(parts)
        return loop

    def step(self) -> None:
        d = self.d
        active = d.active
        u = d.random.uniform(1)[:, 0]
        out = d.verify(d.root[:, None], (d.C + d.count)[:, None], torch.ones(d.n, 1, 1, dtype=torch.bool, device=d.dev))
        step = active.long()
        d.kv.commit(out["new_kv"], torch.zeros(d.n, 1, dtype=torch.long, device=d.dev), step)
        d.counters.record(active, "ar", *d.counted(d.count, step))
        d.counters.add("target_forwards", active)
        nxt = sample(d.proc.probs(d.force(out["logits"][:, 0], d.count + 1)), d.proc.greedy, u)
        d.append_tokens(d.root[:, None], step)
        d.root.copy_(torch.where(active, nxt, d.root))
        self.plan = self.read()

    def read(self) -> Plan:
        return read_active(self.d)


# ---------------------------------------------------------------------- speculative decoding (SD, LANTERN, VVS)


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


def release(parts) -> None:
    """Return the cache buffers of batches that were combined into another."""
    for p, _ in parts:
        p.d.engines.release(p.d.leases)

