"""Exact modes draw every image from the target's distribution; lossy modes and broken acceptance do not.

The instrument is the joint randomised-PIT test of :mod:`tests.exactness` on 3,000 images of 16 tokens from the
small random target (its output layer sharpened, so that drafts are often accepted and rejections still happen).
It must pass for ``ar`` and ``sd`` under every sampling setting, and fail — the controls that show its power — for
LANTERN and VVS (lossy by design) and for three acceptance bugs injected into the runtime."""
import pytest
import torch

import vvs.runtime.speculation as speculation
from tests.exactness import conditionals, pit_pvalues
from vvs.runtime.accept import sample_accept
from vvs.runtime.random import inverse_cdf

IMAGES = 3000
LABEL = 2
PASS, FAIL = 1e-3, 1e-6  # fixed seeds make every outcome deterministic; these leave wide margins both ways

SETTINGS = {
    "plain": dict(temperature=1.0, cfg_scale=1.0),
    "top-k": dict(temperature=1.0, top_k=3, cfg_scale=1.0),
    "top-p": dict(temperature=1.0, top_p=0.7, cfg_scale=1.0),
    "guidance": dict(temperature=1.0, cfg_scale=3.0),
    "all": dict(temperature=1.5, top_k=6, top_p=0.8, cfg_scale=2.0),
}


@pytest.fixture(scope="module")
def pipe(pipeline_factory):
    return pipeline_factory(max_batch=IMAGES)  # one batch: the statistics need many images, not joins


def fit(pipe, mode: str, setting: dict, **options):
    labels = torch.full((IMAGES,), LABEL)
    gen = pipe.generate(labels, mode=mode, seed=0, decode_images=False, **setting, **options)
    probs = conditionals(pipe, labels, gen.tokens, setting["cfg_scale"], setting["temperature"],
                         setting.get("top_k", 0), setting.get("top_p", 1.0))
    return gen, pit_pvalues(probs, gen.tokens)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_exact_modes_draw_from_the_target(pipe, mode, setting):
    gen, (joint, position) = fit(pipe, mode, SETTINGS[setting])
    assert joint > PASS and position > PASS, (joint, position)
    if mode == "sd":
        assert gen.aggregate()["mean_accept_length"] > 1.5, "the test should exercise multi-token acceptance"


@pytest.mark.parametrize("mode,options", [
    ("lantern", dict(lantern_delta=0.3)),
    ("vvs", dict(vvs_relaxed=False, skip_interval=2, skip_warmup_tokens=0)),  # lossy even without LANTERN
])
def test_lossy_modes_fail_it(pipe, mode, options):
    gen, (joint, _) = fit(pipe, mode, SETTINGS["plain"], **options)
    if mode == "vvs":
        assert sum(s.skipped_verifications for s in gen.stats) > IMAGES
    assert joint < FAIL


def residual_kept(tree, probs, relax, max_children, u):
    """The bonus token is drawn from the last accepted node's full distribution, rejected drafts included."""
    acc = sample_accept(tree, probs, relax, max_children, u)
    last = acc.nodes.gather(1, (acc.length - 1)[:, None]).squeeze(1)
    acc.bonus = inverse_cdf(probs[torch.arange(len(last)), last], u[:, 0])
    return acc


def reused_uniform(tree, probs, relax, max_children, u):
    """The bonus token is drawn with the uniform that rejected the first child tried below the last accepted
    node (the walk does not read column 0, so a second pass reproduces it)."""
    acc = sample_accept(tree, probs, relax, max_children, u)
    first_child = (1 + (acc.length - 1) * max_children).clamp(max=u.shape[1] - 1)
    u = u.clone()
    u[:, 0] = u.gather(1, first_child[:, None]).squeeze(1)
    return sample_accept(tree, probs, relax, max_children, u)


def tempered(tree, probs, relax, max_children, u):
    """Acceptance and residual against p^0.9 instead of p."""
    flat = probs ** 0.9
    return sample_accept(tree, flat / flat.sum(-1, keepdim=True), relax, max_children, u)


# under top-k, the PIT with codes ordered by index alone gives p = 3e-6 for the tempered acceptance (a pass); ordered
# by descending probability as well, 1e-15
@pytest.mark.parametrize("bug,setting", [(residual_kept, "plain"), (reused_uniform, "plain"), (tempered, "plain"),
                                         (tempered, "top-k")], ids=lambda v: getattr(v, "__name__", v))
def test_it_catches_injected_acceptance_bugs(pipe, monkeypatch, bug, setting):
    monkeypatch.setattr(speculation, "sample_accept", bug)
    _, (joint, _) = fit(pipe, "sd", SETTINGS[setting])
    assert joint < FAIL


# ---------------------------------------------------------------------------- Janus-Pro
# The same instrument on a Janus-architecture target: its head is an MLP, so the drafter mixes guided logits
# rather than hidden states, and its guidance null is built from each prompt. One prompt that fills the 12 prompt
# slots exactly, so the teacher-forced reference needs no padding mask. Half the images: the settings and bugs
# here are the LlamaGen tests' strongest (the shared acceptance code has the full set above).
JANUS_PROMPT = "a red cat on the hill"
JANUS_IMAGES = IMAGES // 2


@pytest.fixture(scope="module")
def janus_pipe(janus_bundle):
    from tests.conftest import SMALL
    from vvs.discrete.engines import torch_engines
    from vvs.runtime.options import DecodeOptions
    from vvs.runtime.pipeline import Pipeline

    return Pipeline(torch_engines(janus_bundle), DecodeOptions(**SMALL), max_batch=JANUS_IMAGES)


def janus_fit(pipe, mode: str, setting: dict, **options):
    prompts = [JANUS_PROMPT] * JANUS_IMAGES
    ids, mask = pipe.engines.conditioning.prepare(pipe.engines, prompts, None)
    assert mask.all()
    gen = pipe.generate(prompts, mode=mode, seed=0, decode_images=False, **setting, **options)
    probs = conditionals(pipe, ids, gen.tokens, setting["cfg_scale"], setting["temperature"],
                         setting.get("top_k", 0), setting.get("top_p", 1.0))
    return gen, pit_pvalues(probs, gen.tokens)


@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_exact_modes_draw_from_a_janus_target(janus_pipe, mode):
    gen, (joint, position) = janus_fit(janus_pipe, mode, SETTINGS["all"])
    assert joint > PASS and position > PASS, (joint, position)
    if mode == "sd":
        assert gen.aggregate()["mean_accept_length"] > 1.5, "the test should exercise multi-token acceptance"


def test_an_injected_bug_fails_it_on_a_janus_target(janus_pipe, monkeypatch):
    """The instrument keeps its power on this target (the lossy modes' failures are shown above)."""
    monkeypatch.setattr(speculation, "sample_accept", tempered)
    _, (joint, _) = janus_fit(janus_pipe, "sd", SETTINGS["guidance"])
    assert joint < FAIL


# ---------------------------------------------------------------------------- Lumina-mGPT
# The instrument on a Chameleon target: a joint vocabulary read through the stream's ids, an end-of-line token forced
# after every row (one-hot in the reference), and a guidance null that attends only the start and size tokens, so
# the teacher-forced reference masks each row as the runtime does.
LUMINA_PROMPT = "a red bird on the hill"


@pytest.fixture(scope="module")
def lumina_pipe(tmp_path_factory):
    from tests.conftest import SMALL
    from tests.lumina_reference import tiny_lumina_bundle
    from vvs.discrete.engines import torch_engines
    from vvs.runtime.options import DecodeOptions
    from vvs.runtime.pipeline import Pipeline

    bundle = tiny_lumina_bundle(tmp_path_factory.mktemp("lumina-tiny"))
    return Pipeline(torch_engines(bundle), DecodeOptions(**SMALL), max_batch=JANUS_IMAGES)


def lumina_fit(pipe, mode: str, setting: dict, **options):
    prompts = [LUMINA_PROMPT] * JANUS_IMAGES
    ids, slots = pipe.engines.conditioning.prepare(pipe.engines, prompts, None)
    gen = pipe.generate(prompts, mode=mode, seed=0, decode_images=False, **setting, **options)
    probs = conditionals(pipe, ids, gen.tokens, setting["cfg_scale"], setting["temperature"],
                         setting.get("top_k", 0), setting.get("top_p", 1.0), slots)
    return gen, pit_pvalues(probs, gen.tokens)


@pytest.mark.parametrize("mode, options", [("ar", {}), ("sd", {}),
                                           ("sjd-pac", dict(window=9, pac_tree_width=2, pac_tree_depth=3))])
def test_exact_modes_draw_from_a_lumina_target(lumina_pipe, mode, options):
    gen, (joint, position) = lumina_fit(lumina_pipe, mode, SETTINGS["all"], **options)
    assert joint > PASS and position > PASS, (joint, position)
    if mode == "sd":
        assert gen.aggregate()["mean_accept_length"] > 1.5, "the test should exercise multi-token acceptance"


def test_an_injected_bug_fails_it_on_a_lumina_target(lumina_pipe, monkeypatch):
    """The tempered acceptance, unguided: p = 1e-19 here (under guidance 3 it accepts fewer drafts on this target,
    and p = 2e-6 at these 1,500 images)."""
    monkeypatch.setattr(speculation, "sample_accept", tempered)
    _, (joint, _) = lumina_fit(lumina_pipe, "sd", SETTINGS["plain"])
    assert joint < FAIL
