"""What every discrete-token decoding loop shares: one batch's state (:class:`Decoding`: caches, committed
tokens, statistics, the target's forward over any new positions) and the *plan*, the one small device-to-host read
per step. The loops stand beside it: :mod:`~vvs.runtime.autoregression` (one target forward per token),
:mod:`~vvs.runtime.speculation` (EAGLE-2 SD, LANTERN, VVS) and :mod:`~vvs.runtime.jacobi` (SJD, SJD-PAC, GSD);
:mod:`~vvs.runtime.loops` picks one for a mode.

The plan says per image whether it is done, verifies or skips next, and the widest pending chain. The host needs
it anyway to stop, to hand finished images back, and to leave the target forward out when no image verifies;
nothing else waits for the device, so a GPU's launch queue never drains inside a step and a whole cycle can be
captured as one CUDA graph (:class:`~vvs.runtime.captured.CapturedCycle`). State lives in fixed tensors updated in
place for the same reason.

Positions: condition slots are ``0 … C-1`` and image token ``i`` sits at ``C + i``. ``count[i]`` image tokens of
image i are committed; the root, the next token, sits at ``C + count[i]``. An image is done once ``count + 1 >= N``.

Continuous batching: every per-image tensor and cache row moves with its image, so ``combine`` can take any
images of several batches (same options) into one batch at a step boundary, and each keeps its exact state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vvs.engines.base import EngineSet
from vvs.models.layers import caption_causal_mask, causal_mask
from vvs.runtime.cache import KVCache, RowLayout, attention_mask
from vvs.runtime.conditions import force_logits
from vvs.runtime.options import DecodeOptions
from vvs.runtime.random import ImageRandom
from vvs.runtime.sampling import Processor, cfg_matrix, sample
from vvs.runtime.stats import Counters, ImageStats, Stopwatch

DONE, VERIFY, SKIP = 0, 1, 2  # an image's next cycle, as the plan says


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


def release(parts) -> None:
    """Return the cache buffers of batches that were combined into another."""
    for p, _ in parts:
        p.d.engines.release(p.d.leases)

