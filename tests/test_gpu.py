"""CUDA-only checks (marked ``gpu``; skipped with a reason on machines without a CUDA device).

Imports nothing beyond torch, safetensors, numpy, tqdm and pytest, so that ``bench/gpu_check.py`` can run it on a
bare GPU machine.
"""
import copy

import pytest
import torch

from vvs.discrete.engines import torch_engines
from vvs.engines.cuda_graphs import GraphedEngine, capture_graphs
from vvs.export.spec import sample_inputs
from vvs.runtime.options import DecodeOptions
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


@pytest.mark.parametrize("options", [dict(mode="sd"), dict(mode="lantern"), dict(mode="vvs", skip_interval=2),
                                     dict(mode="vvs", skip_policy="dynamic", sim_threshold=0.3)])
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, top_p=0.8)])
def test_captured_cycles_equal_eager(bundle_factory, options, sampling):
    """Whole speculative cycles replayed as CUDA graphs (vvs.runtime.captured) give the eager loop's tokens and
    forward counts, for a batch of three (skipping and verifying images mixed) and alone."""
    # the defaults every mode starts from: an option given with a mode that does not read it is refused
    small = DecodeOptions(tree_size=12, depth=3, draft_top_k=4, top_k=0, lantern_k=4, skip_warmup_tokens=3,
                          cfg_scale=2.0)
    eager = Pipeline(torch_engines(copy.deepcopy(bundle_factory()), "cuda"), small)
    engines = torch_engines(copy.deepcopy(bundle_factory()), "cuda")
    engines.capture_cycles = True
    captured = Pipeline(engines, small)
    for classes in ([1, 2, 3], [4]):
        args = dict(seed=5, decode_images=False, **options, **sampling)
        a = eager.generate(torch.tensor(classes), **args)
        b = captured.generate(torch.tensor(classes), **args)
        assert torch.equal(a.tokens, b.tokens)
        assert [s.target_forwards for s in a.stats] == [s.target_forwards for s in b.stats]


@pytest.mark.parametrize("mode", ["ar", "sd", "vvs"])
def test_a_cycle_synchronises_at_most_once_on_cuda(bundle_factory, mode):
    """CUDA's own count: with torch's sync debug mode each synchronising call warns; a cycle makes one (the plan)."""
    import warnings

    from vvs.runtime.decode import Decoding
    from vvs.runtime.loops import start

    engines = torch_engines(copy.deepcopy(bundle_factory()), "cuda")
    opts = DecodeOptions(mode=mode, tree_size=12, depth=3, draft_top_k=4, top_k=0, lantern_k=4, skip_interval=2,
                         cfg_scale=2.0, top_p=0.8)
    loop = start(Decoding(engines, torch.tensor([1, 2]), opts, seeds=[0, 1]))
    torch.cuda.set_sync_debug_mode("warn")
    try:
        while not loop.plan.finished:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                loop.step()
            syncs = [w for w in caught if "synchroniz" in str(w.message)]
            assert len(syncs) <= 1, [str(w.message) for w in syncs]
    finally:
        torch.cuda.set_sync_debug_mode("default")
