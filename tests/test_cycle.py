"""The lightweight speculative cycle: one drafter call per cycle whose trees equal per-level drafter calls, at most
one device-to-host read per cycle, and state that stays at fixed addresses (what CUDA-graph replay needs)."""
import copy

import pytest
import torch

from conftest import SMALL
from reference_tree import ReferenceDrafter
from vvs.discrete.engines import torch_engines
from vvs.discrete.graphs import DrafterStep, Proposer
from vvs.runtime.cache import KVCache, RowLayout
from vvs.runtime.captured import CapturedCycle
from vvs.runtime.decode import Decoding
from vvs.runtime.loops import start
from vvs.runtime.options import DecodeOptions, TreeShape
from vvs.runtime.pipeline import Pipeline
from vvs.runtime.sampling import Processor, cfg_matrix
from vvs.runtime.speculation import Speculation
from vvs.runtime.tree import TreeDrafter

@pytest.fixture(scope="module")
def pipe(pipeline_factory):
    return pipeline_factory()


MODES = [dict(mode="ar"), dict(mode="sd"), dict(mode="lantern"), dict(mode="vvs", skip_interval=2),
         dict(mode="vvs", skip_policy="dynamic", sim_threshold=0.3)]


@pytest.mark.parametrize("tree", [TreeShape(12, 3, 4), TreeShape(4, 2, 2), TreeShape(20, 4, 3), TreeShape(2, 0, 1)])
@pytest.mark.parametrize("images,scale,processor", [(1, 3.0, (1.0, 0, 1.0)), (3, 1.0, (1.0, 0, 0.8)),
                                                    (2, 2.0, (0.7, 5, 1.0)), (2, 2.0, (0.9, 10, 0.7))])
def test_fused_tree_equals_per_level_drafter_calls(bundle_factory, tree, images, scale, processor):
    """The draft_tree graph against the multi-call expansion it replaces, over consecutive cycles of random
    stable updates (so the drafter cache fills): tokens, parents, depths, ancestor masks and the committed cache
    are equal bit for bit. Per-level calls take the same top-k size as the graph: with a top-k/top-p filter, ties
    among removed (-inf) candidates are otherwise ordered by the top-k size."""
    bundle = bundle_factory()
    target, drafter = bundle.target, bundle.drafter
    cfg = target.config
    engines = torch_engines(bundle, default_options=SMALL)
    layout = RowLayout(images, guided=scale > 1)
    graph_inputs = dict(cfg_mix=cfg_matrix(images, scale), **Processor(*processor).graph_inputs())
    capacity = KVCache.slots(30)
    shape = (drafter.config.num_hidden_layers, 2, layout.rows, cfg.n_head)
    reference = ReferenceDrafter(DrafterStep(drafter).eval(), Proposer(copy.deepcopy(target.output), tree.draft_top_k).eval(),
                                 layout,
                                 torch.zeros(*shape, capacity + tree.depth * tree.draft_top_k, cfg.head_dim),
                                 capacity, tree.depth, tree.draft_top_k, cfg.max_positions - 1)
    fused = TreeDrafter(engines.draft_tree(tree), layout, torch.zeros(*shape, capacity, cfg.head_dim), tree.depth + 1)
    gen = torch.Generator().manual_seed(images)
    position = torch.zeros(images, dtype=torch.long)
    for _ in range(5):
        m = 3
        ids = torch.randint(0, cfg.vocab_size, (images, m), generator=gen)
        features = torch.randn(layout.rows, m, cfg.dim, generator=gen)
        count = torch.randint(1, m + 1, (images,), generator=gen)
        positions = position[:, None] + 1 + torch.arange(m)
        last = torch.arange(images), count - 1
        root, root_position = ids[last], positions[last]
        want = reference.grow(root, root_position, reference.extend(ids, features, positions, count, graph_inputs),
                              tree.tree_size, graph_inputs)
        got = fused.draft(ids, features, positions, count, root, root_position, graph_inputs)
        for name, a, b in zip(("tokens", "parent", "depth", "ancestors"), want,
                              (got.tokens, got.parent, got.depth, got.ancestors)):
            assert torch.equal(a, b), name
        used = capacity - 1
        assert torch.equal(reference.cache.kv[..., :used, :], fused.cache.kv[..., :used, :])
        position = position + count


class HostReads:
    """Counts what makes the host wait for the device's values: reads (``item``, ``tolist``, ``bool``/``int``/
    ``float`` of a tensor, ``nonzero``, ``cpu``/``numpy``) and indexing by a bool mask (a data-dependent shape).
    Reads of ``host`` tensors, which live in host memory whatever the device, are not counted."""

    READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy")

    def __init__(self, monkeypatch, host=()):
        self.count = 0
        for name in self.READS:
            self._wrap(monkeypatch, torch.Tensor, name, lambda t, *a, **k: not any(t is h for h in host))
        monkeypatch.setattr(torch, "nonzero", self._counting(torch.nonzero, lambda *a, **k: True))
        for name in ("__getitem__", "__setitem__"):
            self._wrap(monkeypatch, torch.Tensor, name, lambda self_, index, *rest: _has_mask(index))

    def _wrap(self, monkeypatch, owner, name, counts):
        monkeypatch.setattr(owner, name, self._counting(getattr(owner, name), counts))

    def _counting(self, fn, counts):
        def wrapper(*args, **kwargs):
            if counts(*args, **kwargs):
                self.count += 1
            return fn(*args, **kwargs)

        return wrapper


def _has_mask(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


@pytest.mark.parametrize("options", MODES)
@pytest.mark.parametrize("sampling", [dict(temperature=1.0, top_p=0.8, cfg_scale=2.0), dict(temperature=0.0)])
def test_a_cycle_reads_the_device_at_most_once(pipe, monkeypatch, options, sampling):
    """Every cycle of a batch of three (t2i edge cases are covered by the same code path) reads one small value,
    the plan; statistics are read once when images finish."""
    opts = pipe.options.updated(**options, **sampling)
    loop = start(Decoding(pipe.engines, torch.tensor([1, 5, 9]), opts, seeds=[1, 2, 3]))
    reads = HostReads(monkeypatch, host=(loop.d.proc.survivors_k,))  # sizes the drafter's TopK, kept on the host
    cycles = 0
    while not loop.plan.finished:
        before = reads.count
        loop.step()
        assert reads.count - before <= 1, f"cycle {cycles} read the device {reads.count - before} times"
        cycles += 1
    assert cycles > 3 and reads.count == cycles
    monkeypatch.undo()
    _, stats = loop.d.finish()
    if options["mode"] == "vvs":  # the count must cover skipping cycles
        assert sum(s.skipped_verifications for s in stats) > 0


@pytest.mark.parametrize("options", MODES[1:])
def test_cycle_state_stays_in_place(pipe, options):
    """A CUDA graph replays reads and writes at the addresses it captured, so every tensor a cycle reads must be
    updated in place, never rebound. Checked on the CPU by address before and after cycles."""
    opts = pipe.options.updated(**options, temperature=1.0, cfg_scale=2.0)
    loop = start(Decoding(pipe.engines, torch.tensor([2, 7]), opts, seeds=[4, 5]))
    assert isinstance(loop, Speculation)
    state = _state_tensors(loop)
    for _ in range(6):
        loop.step()
    after = _state_tensors(loop)
    moved = [name for name in state if after[name].data_ptr() != state[name].data_ptr()]
    assert not moved, f"rebound instead of updated in place: {moved}"


def _state_tensors(loop: Speculation) -> dict[str, torch.Tensor]:
    d = loop.d
    found = {f"d.{k}": v for k, v in vars(d).items() if isinstance(v, torch.Tensor)}
    for owner, prefix in ((loop, ""), (loop.feed, "feed."), (loop.tree, "tree."), (d.kv, "kv."),
                          (loop.drafter.cache, "drafter."), (loop.features, "features."), (d.counters, "counters.")):
        found.update({prefix + k: v for k, v in vars(owner).items() if isinstance(v, torch.Tensor)})
    return found


def test_options_outside_the_built_trees_are_refused_without_a_loader(pipe):
    engines = copy.copy(pipe.engines)
    opts = DecodeOptions(**SMALL)
    engines.trees = {opts.tree: pipe.engines.draft_tree(opts.tree)}
    engines.tree_loader = None
    with pytest.raises(Exception, match=r"built for trees 12x3x4 .*rebuild them with these as the decoding defaults"):
        engines.draft_tree(opts.updated(tree_size=5).tree)


class RecordedCycle(CapturedCycle):
    """:class:`CapturedCycle` with CUDA's recording stood in for (this machine has no GPU): the warm-up runs the
    body, and a "graph" re-runs, at each replay, the body fixed at capture time, reading only the staged buffers —
    what a replayed CUDA graph does. The staging, the keys and the subset verification are the real code."""

    def warm_up(self, loop, key):
        self.body(loop, key)

    def capture(self, loop, key):
        cycle = self

        class Replay:
            def replay(self):
                cycle.body(loop, key)

        return Replay()


@pytest.mark.parametrize("options", MODES[1:])
def test_the_captured_cycle_logic_equals_the_eager_loop(bundle_factory, monkeypatch, options):
    """Tokens and forward counts of captured cycles equal the eager loop's for a batch where some images skip
    while others verify; the captured verify forwards hold only the verifying images."""
    import vvs.runtime.speculation as speculation

    eager = Pipeline(torch_engines(bundle_factory()), DecodeOptions(**SMALL))
    engines = torch_engines(bundle_factory())
    engines.capture_cycles = True
    captured = Pipeline(engines, DecodeOptions(**SMALL))
    monkeypatch.setattr(speculation, "CapturedCycle", RecordedCycle)
    rows = []
    graph = engines.graphs["target_verify"]
    run = graph.run
    monkeypatch.setattr(graph, "run", lambda **inputs: rows.append(inputs["input_ids"].shape[0]) or run(**inputs))
    args = dict(seed=5, decode_images=False, temperature=1.0, top_p=0.8, cfg_scale=2.0, **options)
    a = eager.generate(torch.tensor([1, 2, 3, 4]), **args)
    b = captured.generate(torch.tensor([1, 2, 3, 4]), **args)
    assert torch.equal(a.tokens, b.tokens)
    assert [s.target_forwards for s in a.stats] == [s.target_forwards for s in b.stats]
    groups = 2  # guidance doubles the rows
    assert sum(rows) == groups * sum(s.verify_forwards for s in b.stats), "only verifying images enter the forward"
    if options["mode"] == "vvs":
        assert sum(s.skipped_verifications for s in b.stats) > 0
