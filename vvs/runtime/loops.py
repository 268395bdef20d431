"""Which loop decodes a batch: vanilla AR, the speculative loop (sd, lantern, vvs), or the drafter-free window
loop (sjd, sjd-pac, gsd). Each loop prefills in its constructor, then exposes ``plan`` (what the host knows after a
step), ``step()`` and ``combine(parts)`` (continuous batching)."""
from __future__ import annotations

import torch

from vvs.runtime.autoregression import AutoRegression
from vvs.runtime.decode import Decoding
from vvs.runtime.jacobi import Jacobi
from vvs.runtime.speculation import Speculation
from vvs.runtime.stats import ImageStats

Loop = AutoRegression | Speculation | Jacobi


def start(d: Decoding) -> Loop:
    """Prefill a batch (and draft its first trees or windows) and return its loop for ``d.opts.mode``."""
    if d.opts.mode == "ar":
        return AutoRegression(d)
    return Jacobi(d) if d.opts.jacobi else Speculation(d)


def run(loop: Loop) -> tuple[torch.Tensor, list[ImageStats]]:
    while not loop.plan.finished:
        loop.step()
    return loop.d.finish()
