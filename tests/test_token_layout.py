"""A family's forced tokens (``TokenLayout``), through the shared loop unchanged: a Chameleon-style layout on the small
random LlamaGen target, where the last token of every 4-token row is forced to one id (as Lumina-mGPT forces an
end-of-line token after each row). The forced token stands where the layout puts it in every mode, at batch > 1;
``sd``, ``sjd`` and ``sjd-pac`` stay exact (the PIT test, with the reference distribution forced the same way) and
equal greedy ``ar`` when greedy; and the statistics count only the model's own choices. The small target is not trained for the layout,
which is the point: its own distribution gives the forced id little mass. Checked against broken copies of the loop:
without the rewrite of drafted nodes the ``vvs`` cases fail; with the verified rows forced one index early, every
speculative case and the exactness test fail."""
import pytest
import torch

from tests.exactness import conditionals, pit_pvalues
from vvs.discrete.engines import torch_engines
from vvs.runtime.conditions import TokenLayout
from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline

from conftest import SMALL

FORCED_ID = 5
FORCED_AT = (3, 7, 11, 15)
LAYOUT = TokenLayout(tuple(FORCED_ID if i in FORCED_AT else -1 for i in range(16)))
FREE = [i for i in range(16) if i not in FORCED_AT]
SKIPPING = dict(skip_interval=2, skip_warmup_tokens=0)
PAC = dict(window=9, pac_tree_width=2, pac_tree_depth=3)  # the tree's positions meet forced indices too


@pytest.fixture(scope="module")
def pipe(bundle_factory):
    engines = torch_engines(bundle_factory())
    engines.token_layout = LAYOUT
    return Pipeline(engines, DecodeOptions(**SMALL), max_batch=3000)


@pytest.mark.parametrize("mode, options", [("ar", {}), ("sd", {}), ("lantern", {}), ("vvs", SKIPPING),
                                           ("sjd", dict(window=6)), ("sjd-pac", PAC), ("gsd", dict(window=6))])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_forced_tokens_stand_where_the_layout_puts_them(pipe, mode, options, temperature):
    gen = pipe.generate(torch.tensor([0, 1, 2, 3, 4, 5]), mode=mode, seed=11, temperature=temperature, top_p=0.9,
                        cfg_scale=2.0, decode_images=False, **options)
    assert (gen.tokens[:, list(FORCED_AT)] == FORCED_ID).all()
    assert (gen.tokens[:, FREE] != FORCED_ID).any()  # the id is not forced anywhere else
    if mode == "vvs":
        assert sum(s.skipped_verifications for s in gen.stats) > 0


@pytest.mark.parametrize("mode, options", [("sd", {}), ("sjd", dict(window=6)), ("sjd-pac", PAC)])
def test_greedy_speculation_is_greedy_ar_under_a_layout(pipe, mode, options):
    labels = torch.arange(8)
    ar = pipe.generate(labels, mode="ar", seed=0, temperature=0.0, decode_images=False)
    fast = pipe.generate(labels, mode=mode, seed=0, temperature=0.0, decode_images=False, **options)
    assert torch.equal(ar.tokens, fast.tokens)


@pytest.mark.parametrize("mode, options", [("sd", {}), ("sjd", dict(window=6)), ("sjd-pac", PAC)])
def test_exact_modes_under_a_layout_draw_from_the_forced_target(pipe, mode, options):
    """The PIT test of tests/test_exactness.py (its power shown there and in tests/test_jacobi.py by injected
    acceptance bugs), against the target's conditionals with the forced rows made one-hot."""
    setting = dict(temperature=1.5, top_k=6, top_p=0.8, cfg_scale=2.0)
    labels = torch.full((3000,), 2)
    gen = pipe.generate(labels, mode=mode, seed=0, decode_images=False, **setting, **options)
    probs = conditionals(pipe, labels, gen.tokens, setting["cfg_scale"], setting["temperature"], setting["top_k"],
                         setting["top_p"])
    joint, position = pit_pvalues(probs, gen.tokens)
    assert joint > 1e-3 and position > 1e-3, (joint, position)
    assert gen.aggregate()["mean_accept_length"] > 1.4


def test_forced_tokens_are_not_counted(pipe):
    """AR spends a target forward on every stream token, forced ones included, but is credited only with the 12
    tokens the model chose; a verification's accepted length counts only free tokens."""
    ar = pipe.generate(torch.tensor([1, 2]), mode="ar", seed=3, decode_images=False)
    for s in ar.stats:
        assert s.tokens == len(FREE) and s.target_forwards == 16
        assert sum(length for _, _, length in s.trace) == len(FREE)  # stream tokens 0-14, three of them forced
        assert s.tokens_per_target_forward == pytest.approx(0.75)
    sd = pipe.generate(torch.tensor([1, 2]), mode="sd", seed=3, temperature=0.0, decode_images=False)
    for s in sd.stats:
        assert s.tokens == len(FREE)
        befores = [before for _, before, _ in s.trace]
        assert befores == sorted(befores) and all(0 <= length <= SMALL["depth"] + 2 for length in s.accept_lengths)
