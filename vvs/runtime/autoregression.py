"""Vanilla autoregression: one target forward per image token, on the shared batch state of
:mod:`vvs.runtime.decode`."""
from __future__ import annotations

import torch

from vvs.runtime.decode import Decoding, Plan, read_active, release
from vvs.runtime.sampling import sample


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
