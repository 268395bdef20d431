"""The drafter-free window modes: SJD and SJD-PAC draw exactly from the target, GSD does not, and the instrument
catches the acceptance bugs a window loop invites.

The instrument is the joint randomised-PIT test of :mod:`tests.exactness`, on the same 3,000 images of 16 tokens
from the small random target as the tree modes (:mod:`tests.test_exactness`). The windows are short, so that an
image takes several iterations with rejections, continuations and refills: SJD 6 tokens; SJD-PAC 12, opening with a
tree of two candidates at each of its first two positions (7 nodes), so the walk meets recursive rejections."""
import pytest
import torch

from tests.exactness import conditionals
from tests.test_exactness import FAIL, PASS, SETTINGS, fit
from vvs.runtime.jacobi import Jacobi, WindowLayout

WINDOWS = {"sjd": dict(window=6), "sjd-pac": dict(window=12, pac_tree_width=2, pac_tree_depth=3)}


@pytest.fixture(scope="module")
def pipe(pipeline_factory):
    return pipeline_factory(max_batch=3000)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("mode", WINDOWS)
def test_window_modes_draw_from_the_target(pipe, mode, setting):
    gen, (joint, position) = fit(pipe, mode, SETTINGS[setting], **WINDOWS[mode])
    assert joint > PASS and position > PASS, (joint, position)
    agg = gen.aggregate()
    assert agg["tokens_per_target_forward"] > 1.3, "the test should exercise multi-token acceptance"
    assert sum(s.drafter_forwards for s in gen.stats) == 0


def test_grouped_acceptance_fails_it(pipe):
    """GSD lends a draft its group's mass: lossy by design (here every ranked neighbour may join the group)."""
    _, (joint, _) = fit(pipe, "gsd", SETTINGS["plain"], gsd_distance=4.0, gsd_prob_gap=1.0, window=6)
    assert joint < FAIL


def stale_q(self, active, accepted, carry, along, siblings, refills):
    """A carried draft keeps the q it was first drawn from (the window's first random q), not the distribution
    of the iteration that drew it: the acceptance ratio is taken against the wrong iteration's distribution."""
    q = self.q.clone()
    _refresh(self, active, accepted, carry, along, siblings, refills)
    self.q.copy_(q)


def residual_is_p(self, p, q, u):
    """A rejection commits a fresh draw from p instead of the residual max(p - q, 0)."""
    return self.draw(p, u)


def tempered_test(self, p, x, q, u):
    """Drafts tested against p^0.9 (ordered by index alone, the PIT missed this at 3,000 images)."""
    flat = p ** 0.9
    return _test(self, flat / flat.sum(-1, keepdim=True), x, q, u)


def no_recursion(p, q, x):
    """After a rejected candidate the next one faces the same p and q (no residual, no renormalisation)."""
    return p, q


_refresh, _test = Jacobi.refresh, Jacobi.test
# SJD-PAC's residual bug, as a chain under top-p: its tree and continuation otherwise leave few rejections whose
# residual differs from p (p = 3e-9 plain, 3e-16 top-p as a chain; 2e-3 plain with the tree)
RESIDUAL = dict(window=6, pac_tree_depth=1, setting="top-p")
# SJD-PAC tested against p^0.9, as a chain: the tree's walk leaves it p = 3e-3; the chain 2e-24 (4e-7 with the codes
# ordered by index alone)
TEMPERED = dict(window=12, pac_tree_depth=1)
BUGS = [("sjd", stale_q, "refresh", {}), ("sjd-pac", stale_q, "refresh", {}),
        ("sjd", residual_is_p, "residual_draw", {}), ("sjd-pac", residual_is_p, "residual_draw", RESIDUAL),
        ("sjd", tempered_test, "test", {}), ("sjd-pac", tempered_test, "test", TEMPERED),
        ("sjd-pac", staticmethod(no_recursion), "reject", {})]


@pytest.mark.parametrize("mode,bug,method,options", BUGS, ids=lambda v: getattr(v, "__name__", None))
def test_it_catches_injected_window_bugs(pipe, monkeypatch, mode, bug, method, options):
    monkeypatch.setattr(Jacobi, method, bug)
    options = {**WINDOWS[mode], **options}
    _, (joint, _) = fit(pipe, mode, SETTINGS[options.pop("setting", "plain")], **options)
    assert joint < FAIL


@pytest.mark.parametrize("mode", ["sjd", "sjd-pac", "gsd"])
def test_greedy_window_decoding_is_ar(pipe, mode):
    """Temperature 0 is Jacobi decoding: the argmax chain, token for token, in fewer target forwards (GSD's
    default group needs codes within 0.5 of each other in latent space; the random codebook has none)."""
    classes = torch.arange(8)
    ar = pipe.generate(classes, mode="ar", seed=0, temperature=0.0, cfg_scale=2.0, decode_images=False)
    window = pipe.generate(classes, mode=mode, seed=0, temperature=0.0, cfg_scale=2.0, decode_images=False,
                           **WINDOWS.get(mode, dict(window=4)))
    assert torch.equal(window.tokens, ar.tokens)
    assert window.aggregate()["target_forwards"] < ar.aggregate()["target_forwards"]


def test_adaptive_continuation_and_the_tree_accept_more_than_sjd(pipe):
    """SJD-PAC keeps each position's outcome past a rejection, so later iterations accept more of the window; its
    tree adds accepted tokens after rejections."""
    labels = torch.full((400,), 2)

    def tpf(mode, **options):
        gen = pipe.generate(labels, mode=mode, seed=0, decode_images=False, window=12, **options, **SETTINGS["plain"])
        return gen.aggregate()["tokens_per_target_forward"]

    sjd, chain, tree = tpf("sjd"), tpf("sjd-pac", pac_tree_depth=1), tpf("sjd-pac", pac_tree_width=2, pac_tree_depth=3)
    assert sjd < chain < tree, (sjd, chain, tree)


def test_the_window_is_a_tree_then_a_chain():
    """K = 3, D = 3 in a 16-node window: the root, 3 + 9 tree nodes, then a chain of 3 under the first path."""
    w = WindowLayout(16, 3, 2, "cpu")
    assert w.positions == 5 and w.main.tolist() == [0, 1, 4, 13, 14, 15]
    assert w.column.tolist() == [0, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 4, 5]
    assert w.sibling[4:13].tolist() == [0, 1, 2] * 3
    assert w.child[2].tolist() == [7, 8, 9] and w.child[5].tolist() == [-1, -1, -1]
    assert w.ancestors[15].nonzero().flatten().tolist() == [0, 1, 4, 13, 14, 15]
    assert w.rows[:, -1].tolist() == list(range(4, 13)) and w.rows[0].tolist() == [0, 1, 4]  # the main path first
    chain = WindowLayout(6, 1, 0, "cpu")  # SJD's window: a plain chain
    assert chain.positions == 5 and chain.main.tolist() == list(range(6)) and chain.rows.tolist() == [[0]]
    with pytest.raises(ValueError, match="a window of 13 has no room past its tree of 13 nodes"):
        WindowLayout(13, 3, 2, "cpu")


def test_a_folder_without_a_drafter_runs_the_window_modes(bundle_factory, tmp_path):
    """Exported without a drafter: no draft_tree graph and no drafter weights; ONNX Runtime and torch open it, ar
    and the window modes run (greedy tokens equal across backends), and a drafter mode is one clear error."""
    from vvs.discrete.bundle import ModelBundle
    from vvs.discrete.exporter import export_folder
    from vvs.engines import load_engines
    from vvs.runtime.options import OptionsError
    from vvs.runtime.pipeline import Pipeline

    b = bundle_factory()
    manifest = export_folder(ModelBundle(b.target, None, b.vq, b.family), tmp_path / "f",
                             decoding_defaults=dict(mode="vvs", top_k=0), progress=False)
    assert "draft_tree" not in manifest["graphs"] and "drafter" not in manifest["model"]
    assert manifest["decoding_defaults"]["mode"] == "sjd-pac"  # the best exact mode that needs no drafter
    assert not any("drafter" in name for name in manifest["files"])
    tokens = {}
    for backend in ("onnxruntime", "torch"):
        pipe = Pipeline(load_engines(tmp_path / "f", backend, threads=1))
        for mode, options in [("ar", {}), ("sjd", dict(window=6)), ("sjd-pac", WINDOWS["sjd-pac"]), ("gsd", {})]:
            gen = pipe.generate(torch.tensor([1, 4]), mode=mode, seed=0, temperature=0.0, cfg_scale=2.0,
                                decode_images=False, **options)
            tokens.setdefault(mode, []).append(gen.tokens)
        with pytest.raises(OptionsError, match="this engine folder has no drafter; it runs ar, sjd, sjd-pac and gsd"):
            pipe.generate([1], mode="sd")
        pipe.close()
    for mode, (onnx, eager) in tokens.items():
        assert torch.equal(onnx, eager) and torch.equal(onnx, tokens["ar"][0]), mode


def test_the_released_tree_walk_fails_it(pipe):
    """``pac_rule="official"`` reproduces SJD-PAC's released tree walk (longest accepted path, the other candidates
    drawn from the residual): lossy, with the paper's tree (K = 3, D = 3) in a 16-token window."""
    _, (joint, _) = fit(pipe, "sjd-pac", SETTINGS["plain"], window=16, pac_tree_width=3, pac_tree_depth=3,
                        pac_rule="official")
    assert joint < FAIL


@pytest.mark.parametrize("mode,options", [
    ("gsd", dict(window=6, gsd_distance=4.0, gsd_prob_gap=1.0)),  # every ranked neighbour may join a group
    ("sjd-pac", dict(window=16, pac_tree_width=3, pac_tree_depth=3, pac_rule="official")),
])
def test_lossy_window_modes_commit_no_code_the_target_filter_removes(pipe, mode, options):
    """With top-k and top-p on, every committed code has positive probability under the target's filtered
    distribution. A random refill often drafts a removed code, ranked just below the kept ones: GSD's group once
    lent it their mass (791 of these 4,096 codes), and now forms only around drafts the filter keeps. The released
    SJD-PAC walk tests every candidate against its parent's (residual) filtered distribution, so it keeps to the
    support as well."""
    setting = dict(temperature=1.0, top_k=3, top_p=0.8, cfg_scale=2.0)
    classes = torch.arange(256) % 10
    gen = pipe.generate(classes, mode=mode, seed=0, decode_images=False, **setting, **options)
    probs = conditionals(pipe, classes, gen.tokens, **setting)
    assert int((probs.gather(-1, gen.tokens[..., None]) == 0).sum()) == 0
