"""CUDA-only checks (marked ``gpu``; skipped with a reason on machines without a CUDA device).

Imports nothing beyond torch, safetensors, numpy, tqdm and pytest, so that ``bench/gpu_check.py`` can run it on a
bare GPU machine.
"""
import copy

import pytest
import torch

from vvs.engines.cuda_graphs import GraphedEngine, capture_graphs
from vvs.engines.torch_backend import torch_engines
from vvs.export.spec import sample_inputs
from vvs.runtime.pipeline import Pipeline

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_graph_replay_equals_eager_per_graph(bundle_factory):
    engines = torch_engines(copy.deepcopy(bundle_factory()), "cuda")
    cfg = engines.target
    for name in ("target_verify", "draft_tree"):
        eager = engines.graphs[name]
        graphed = GraphedEngine(eager)
        for dims in (dict(batch=2, images=1, new=1, past=9), dict(batch=4, images=2, new=12, past=20)):
            inputs = dict(zip(eager.spec.input_names, (t.cuda() for t in sample_inputs(
                eager.spec, cfg.vocab_size, cfg.max_positions - 1, dims))))
            want = eager.run(**inputs)
            for _ in range(2):  # capture, then replay
                got = graphed.run(**inputs)
            for key in want:
                assert torch.equal(got[key], want[key]), f"{name}.{key}"


@pytest.mark.parametrize("mode", ["ar", "sd", "lantern", "vvs"])
def test_graphed_decoding_equals_eager(bundle_factory, mode):
    eager = Pipeline(torch_engines(copy.deepcopy(bundle_factory()), "cuda"))
    graphed = Pipeline(capture_graphs(torch_engines(copy.deepcopy(bundle_factory()), "cuda")))
    for seed in (0, 1):
        a = eager.generate(torch.tensor([1, 2]), mode=mode, seed=seed, temperature=0, cfg_scale=2.0, decode_images=False)
        b = graphed.generate(torch.tensor([1, 2]), mode=mode, seed=seed, temperature=0, cfg_scale=2.0,
                             decode_images=False)
        assert torch.equal(a.tokens, b.tokens)
