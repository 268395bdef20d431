"""A whole speculative cycle as one CUDA graph: verify (or accept unverified) → commit → draft → decide.

A cycle's work is fixed by its plan key (whether any image verifies or skips, the pending chain's width) and by how
many images verify, so a batch has a handful of distinct cycles. The first cycle of each key runs eagerly (lazy
initialisation happens outside any capture), the second is captured and every later one is replayed. Replays read
and write the loop's state at the addresses captured, which is why :class:`~vvs.runtime.speculation.Speculation` updates
its state in place; the cycle's uniforms and the indices of the images that verify are staged into fixed buffers
first (per-image generators stay outside the graph). So, as in the eager loop, an image that skips costs no target
compute here either.

The graphs belong to one batch's loop. When images join or leave, the scheduler builds a new loop (new state
tensors), whose cycles are captured afresh: one eager cycle and one capture per key it meets.

Graphs of one loop share a memory pool: they never run at the same time.
"""
from __future__ import annotations

import torch


class CapturedCycle:
    def __init__(self, loop):
        self.u = torch.zeros(loop.n, loop.accept_draws + 1, device=loop.dev)
        self.images = torch.zeros(loop.n, dtype=torch.long, device=loop.dev)  # the first `count` verify
        self.graphs: dict[tuple, object] = {}
        self.seen: set[tuple] = set()
        self.pool = None

    def replay(self, loop, u: torch.Tensor) -> None:
        verifying = loop.plan.verifying
        key = (*loop.plan.key, len(verifying))
        self.u.copy_(u)
        if verifying:
            self.images[: len(verifying)].copy_(torch.tensor(verifying))
        graph = self.graphs.get(key)
        if graph is None and key not in self.seen:
            self.seen.add(key)
            self.warm_up(loop, key)
            return
        if graph is None:
            loop.d.clock.paused = True
            try:
                graph = self.graphs[key] = self.capture(loop, key)
            finally:
                loop.d.clock.paused = False
        loop.d.clock.section("other")
        graph.replay()

    def body(self, loop, key: tuple) -> None:
        """The cycle's device work, reading only the staged buffers."""
        loop.cycle_body(self.u, key[:3], self.images[: key[3]])

    def warm_up(self, loop, key: tuple) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.body(loop, key)
        torch.cuda.current_stream().wait_stream(side)

    def capture(self, loop, key: tuple) -> torch.cuda.CUDAGraph:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.body(loop, key)
        return graph
