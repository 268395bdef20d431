"""A whole speculative cycle as one CUDA graph: verify (or accept unverified) → commit → draft → decide.

The cycle's work is fixed by its plan key (whether any image verifies or skips, and the pending chain's width),
so a batch has a handful of distinct cycles. The first cycle of each key runs eagerly (lazy initialisation
happens outside any capture), the second is captured and every later one is replayed. Replays read and write the
loop's state at the addresses captured, which is why :class:`~vvs.runtime.decode.Speculation` updates its state in
place; the cycle's uniforms are copied into a fixed buffer first (per-image generators stay outside the graph).
Verification always covers every image here (the eager loop leaves skipping images out of the target forward).

Graphs of one loop share a memory pool: they never run at the same time.
"""
from __future__ import annotations

import torch


class CapturedCycle:
    def __init__(self, loop):
        self.u = torch.zeros(loop.n, loop.accept_draws + 1, device=loop.dev)
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.seen: set[tuple] = set()
        self.pool = torch.cuda.graph_pool_handle()

    def replay(self, loop, u: torch.Tensor) -> None:
        key = loop.plan.key
        self.u.copy_(u)
        graph = self.graphs.get(key)
        if graph is None and key not in self.seen:
            self.seen.add(key)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loop.cycle_body(self.u, key, None)
            torch.cuda.current_stream().wait_stream(side)
            return
        if graph is None:
            graph = torch.cuda.CUDAGraph()
            loop.d.clock.paused = True
            try:
                with torch.cuda.graph(graph, pool=self.pool):
                    loop.cycle_body(self.u, key, None)
            finally:
                loop.d.clock.paused = False
            self.graphs[key] = graph
        loop.d.clock.section("other")
        graph.replay()
