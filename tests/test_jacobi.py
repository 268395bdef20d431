"""The drafter-free window modes: SJD and SJD-PAC draw exactly from the target, GSD does not, and the instrument
catches the acceptance bugs a window loop invites.

The instrument is the joint randomised-PIT test of :mod:`tests.exactness`, on the same 3,000 images of the small
random target as the tree modes (:mod:`tests.test_exactness`), with a window of 6 tokens so that a 16-token image
takes several iterations with rejections, continuations and refills."""
import pytest
import torch

from tests.test_exactness import FAIL, PASS, SETTINGS, fit
from vvs.runtime.jacobi import Jacobi

WINDOW = dict(window=6)


@pytest.fixture(scope="module")
def pipe(pipeline_factory):
    return pipeline_factory(max_batch=3000)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("mode", ["sjd", "sjd-pac"])
def test_window_modes_draw_from_the_target(pipe, mode, setting):
    gen, (joint, position) = fit(pipe, mode, SETTINGS[setting], **WINDOW)
    assert joint > PASS and position > PASS, (joint, position)
    agg = gen.aggregate()
    assert agg["tokens_per_target_forward"] > 1.3, "the test should exercise multi-token acceptance"
    assert agg["drafter_forwards"] == 0


def test_grouped_acceptance_fails_it(pipe):
    """GSD lends a draft its group's mass: lossy by design (here every ranked neighbour may join the group)."""
    gen, (joint, _) = fit(pipe, "gsd", SETTINGS["plain"], gsd_distance=4.0, gsd_prob_gap=1.0, **WINDOW)
    assert joint < FAIL


def stale_q(self, active, m, carry, p, u):
    """A carried draft keeps the q it was first drawn from (the window's first random q), not the distribution
    of the iteration that drew it: the acceptance ratio is taken against the wrong iteration's distribution."""
    q = self.q.clone()
    _refresh(self, active, m, carry, p, u)
    self.q.copy_(q)


def residual_is_p(self, p, u):
    """A rejection commits a fresh draw from p instead of the residual max(p - q, 0)."""
    return self.draw(p, u)


def tempered_test(self, p, u):
    """Drafts tested against p^0.7."""
    flat = p ** 0.7
    return _test(self, flat / flat.sum(-1, keepdim=True), u)


_refresh, _test = Jacobi.refresh, Jacobi.test


@pytest.mark.parametrize("mode", ["sjd", "sjd-pac"])
@pytest.mark.parametrize("bug,method", [(stale_q, "refresh"), (residual_is_p, "residual_draw"),
                                        (tempered_test, "test")], ids=["stale-q", "residual-is-p", "tempered"])
def test_it_catches_injected_window_bugs(pipe, monkeypatch, mode, bug, method):
    monkeypatch.setattr(Jacobi, method, bug)
    _, (joint, _) = fit(pipe, mode, SETTINGS["plain"], **WINDOW)
    assert joint < FAIL


@pytest.mark.parametrize("mode", ["sjd", "sjd-pac", "gsd"])
def test_greedy_window_decoding_is_ar(pipe, mode):
    """Temperature 0 is Jacobi decoding: the argmax chain, token for token, in fewer target forwards (GSD's
    default group needs codes within 0.5 of each other in latent space; the random codebook has none)."""
    classes = torch.arange(8)
    ar = pipe.generate(classes, mode="ar", seed=0, temperature=0.0, cfg_scale=2.0, decode_images=False)
    window = pipe.generate(classes, mode=mode, seed=0, temperature=0.0, cfg_scale=2.0, decode_images=False, window=4)
    assert torch.equal(window.tokens, ar.tokens)
    assert window.aggregate()["target_forwards"] < ar.aggregate()["target_forwards"]


def test_adaptive_continuation_accepts_more_than_sjd(pipe):
    """SJD-PAC keeps each position's outcome past a rejection, so later iterations accept more of the window."""
    labels = torch.full((400,), 2)
    tpf = {mode: pipe.generate(labels, mode=mode, seed=0, decode_images=False, window=8, pac_tree_depth=0,
                               **SETTINGS["plain"]).aggregate()["tokens_per_target_forward"] for mode in ("sjd", "sjd-pac")}
    assert tpf["sjd-pac"] > tpf["sjd"], tpf
