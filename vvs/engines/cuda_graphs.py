"""CUDA graphs: capture each graph once per shape bucket and replay it.

Static input buffers are filled with ``copy_`` before every replay; the KV buffer is bound in place (its address
is part of the capture key, and the runtime reuses pooled buffers through ``EngineSet.cache_buffer``). The static
inputs are shared, so one replay runs at a time (a lock), whatever the number of threads.
Capture follows the rules of the CUDA graph guide: an eager warm-up run on a side stream first, no host sync
inside, one graph per (shapes, cache address). Works for any engine whose ``run`` only enqueues GPU work: the
torch modules, and TensorRT's ``execute_async_v3``.
"""
from __future__ import annotations

import threading

import torch

from vvs.engines.base import EngineSet
from vvs.engines.buckets import BucketedEngine, buckets
from vvs.runtime.options import DecodeOptions


class GraphedEngine:
    def __init__(self, inner):
        self.inner, self.spec = inner, inner.spec
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, dict, dict]] = {}
        self.lock = threading.Lock()

    def key(self, inputs: dict[str, torch.Tensor]) -> tuple:
        """Shapes, the cache's address, and the values of host inputs (a capture holds the shapes they set)."""
        kv = inputs.get("past_kv")
        host = tuple(tuple(inputs[t.name].tolist()) for t in self.spec.inputs if t.host)
        return (tuple((k, tuple(v.shape)) for k, v in sorted(inputs.items())) + ((kv.data_ptr(),) if kv is not None else ())
                + host)

    def capture(self, inputs: dict[str, torch.Tensor]):
        static = {k: (v if k == "past_kv" else v.clone()) for k, v in inputs.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.inner.run(**static)  # warm-up: lazy initialisation happens outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self.inner.run(**static)
        return graph, static, outputs

    def run(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        if torch.cuda.is_current_stream_capturing():  # part of a captured cycle: record the call in that graph
            return self.inner.run(**inputs)
        key = self.key(inputs)
        with self.lock:
            if key not in self.graphs:
                self.graphs[key] = self.capture(inputs)
            graph, static, outputs = self.graphs[key]
            for name, value in inputs.items():
                if name != "past_kv":
                    static[name].copy_(value)
            graph.replay()
            return {name: value.clone() for name, value in outputs.items()}


def capture_graphs(engines: EngineSet, options: DecodeOptions | None = None) -> EngineSet:
    """CUDA graphs for the torch backend: the verify graph per bucket (AR steps), and every speculative cycle
    captured whole (:mod:`vvs.runtime.captured`), whose draft_tree and verify calls are recorded in it."""
    opts = options or DecodeOptions.from_dict(engines.default_options)
    engines.graphs["target_verify"] = BucketedEngine(GraphedEngine(engines.graphs["target_verify"]),
                                                     buckets("target_verify", engines.target.cls_token_num, opts))
    engines.capture_cycles = True
    engines.backend += "+cuda-graphs"
    return engines
