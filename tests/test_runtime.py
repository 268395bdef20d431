"""The decoding runtime on small random targets (with a drafter trained on their samples): greedy equality,
skip schedules, KV compaction, seeding, options."""
import pytest
import torch
from conftest import SMALL
from exactness import conditionals

from vvs.runtime.decode import Decoding
from vvs.runtime.loops import run
from vvs.runtime.options import DecodeOptions, OptionsError
from vvs.runtime.pipeline import Pipeline
from vvs.runtime.speculation import Speculation


@pytest.fixture(scope="module")
def pipe(pipeline_factory):
    return pipeline_factory()


@pytest.mark.parametrize("cfg", [1.0, 3.0])
@pytest.mark.parametrize("classes", [[3], [0, 5, 9]])
def test_greedy_sd_equals_greedy_ar(pipe, cfg, classes):
    accepted = []
    for seed in (0, 1):
        ar = pipe.generate(torch.tensor(classes), mode="ar", seed=seed, temperature=0, cfg_scale=cfg,
                           decode_images=False)
        sd = pipe.generate(torch.tensor(classes), mode="sd", seed=seed, temperature=0, cfg_scale=cfg,
                           decode_images=False)
        assert torch.equal(ar.tokens, sd.tokens)
        accepted += [a for s in sd.stats for a in s.accept_lengths]
        assert all(s.target_forwards == 16 for s in ar.stats)
    assert max(accepted) >= 3, "the test should exercise multi-token acceptance"


def test_greedy_sd_equals_ar_for_text_conditioning(pipeline_factory):
    pipe = pipeline_factory(model_type="t2i")
    captions = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[False, True, True], [True, True, True]])
    ar = pipe.generate(captions, mode="ar", temperature=0, cfg_scale=2.0, caption_mask=mask, decode_images=False)
    sd = pipe.generate(captions, mode="sd", temperature=0, cfg_scale=2.0, caption_mask=mask, decode_images=False)
    assert torch.equal(ar.tokens, sd.tokens)


def test_float32_captions_run_on_half_precision_engines(bundle_factory):
    """An fp16 folder's graphs take fp16 captions; the float32 captions a caller (or the text encoder) gives are
    cast, so they decode exactly as the same captions given in fp16 (they failed the graphs' dtype check before)."""
    from vvs.discrete.engines import torch_engines

    pipe = Pipeline(torch_engines(bundle_factory(model_type="t2i"), dtype=torch.float16), DecodeOptions(**SMALL))
    captions = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[False, True, True], [True, True, True]])
    for mode in ("ar", "sd"):
        full = pipe.generate(captions, mode=mode, seed=2, caption_mask=mask, decode_images=False)
        half = pipe.generate(captions.half(), mode=mode, seed=2, caption_mask=mask, decode_images=False)
        assert torch.equal(full.tokens, half.tokens)


def test_uniform_skip_schedule(pipe):
    interval = 3
    gen = pipe.generate(torch.tensor([1, 4]), mode="vvs", seed=0, temperature=1.0, cfg_scale=2.0,
                        skip_policy="uniform", skip_interval=interval, decode_images=False)
    for s in gen.stats:
        kinds = [k for k, _, _ in s.trace]
        expected, last = [], None
        for cycle, (_, before, _) in enumerate(s.trace):
            verified_after = before + SMALL["depth"] + 2 < 16  # the image is not done after the skip
            skip = cycle % interval == 1 and before > 3 and last != "skip" and verified_after
            last = "skip" if skip else "verify"
            expected.append(last)
        assert kinds == expected
        assert s.skipped_verifications == kinds.count("skip") > 0
        assert s.verify_forwards + s.skipped_verifications == len(s.trace)
        committed = [n for _, _, n in s.trace]
        assert sum(committed[:-1]) + 1 < s.tokens <= sum(committed) + 1  # the last cycle may overshoot
        assert kinds[-1] == "verify"


def test_dynamic_skip_never_twice_in_a_row(pipe):
    gen = pipe.generate(torch.tensor([1, 4, 7]), mode="vvs", seed=0, temperature=1.0, cfg_scale=2.0,
                        skip_policy="dynamic", sim_threshold=-1.0, decode_images=False)  # always similar enough
    for s in gen.stats:
        kinds = [k for k, _, _ in s.trace]
        assert "skip" in kinds
        assert all(not (a == b == "skip") for a, b in zip(kinds, kinds[1:]))
        assert s.verify_forwards + s.skipped_verifications == len(s.trace)
    never = pipe.generate(torch.tensor([1]), mode="vvs", seed=0, temperature=1.0, skip_policy="dynamic",
                          sim_threshold=1.0, decode_images=False)
    assert never.stats[0].skipped_verifications == 0


@pytest.mark.parametrize("mode,options", [
    ("sd", {}), ("vvs", {"skip_interval": 2}), ("lantern", {}),
    ("vvs", {"skip_interval": 2, "top_k": 3, "top_p": 0.8}),  # verifications withdraw unverified tokens
])
def test_kv_cache_after_decoding_equals_plain_decoding(pipe, mode, options):
    """The target cache holds exactly the committed tokens' keys and values, and the drafter and feature caches
    cover exactly the committed tokens, whatever was accepted, skipped or withdrawn."""
    opts = pipe.options.updated(mode=mode, temperature=1.0, cfg_scale=2.0, **options)
    classes = torch.tensor([2, 6])
    d = Decoding(pipe.engines, classes, opts, seeds=[3, 4])
    loop = Speculation(d)
    while not loop.plan.finished:
        loop.step()
        assert torch.equal(loop.drafter.cache.length, d.C + d.count)  # a slot per token up to the root
        assert torch.equal(loop.features.length, d.kv.length)
    run(loop)
    target = pipe.engines.graphs["target_verify"].module.target
    c = target.config.cls_token_num
    for i in range(2):
        length = min(int(d.kv.length[i]), target.config.max_positions - 1)  # overshoot past the last token is moot
        tokens = d.tokens[i : i + 1, : length - c]
        with torch.no_grad():
            ref = target.teacher_forced(torch.stack([classes[i], torch.tensor(target.config.null_class)]),
                                        tokens.expand(2, -1)).new_kv
        got = d.kv.kv[:, :, [i, i + 2], :, :length]
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode,options", [("lantern", {}), ("vvs", {"skip_interval": 2}),
                                          ("vvs", {"vvs_relaxed": False, "skip_interval": 2})])
def test_no_mode_commits_a_code_the_target_filter_removes(pipe, mode, options):
    """With top-k and top-p on, every committed code has positive probability under the target's filtered
    distribution: a verification after a skip withdraws the unverified tokens from the first one outside it, and
    LANTERN lends neighbour mass only to codes the filter keeps. Without either, this setting commits dozens."""
    setting = dict(temperature=1.0, top_k=3, top_p=0.8, cfg_scale=2.0)
    classes = torch.arange(32) % 10
    relaxation = dict(lantern_k=8, lantern_delta=0.5)  # wide neighbourhoods, so that lending reaches removed codes
    gen = pipe.generate(classes, mode=mode, seed=0, decode_images=False, **relaxation, **setting, **options)
    probs = conditionals(pipe, classes, gen.tokens, **setting)
    assert int((probs.gather(-1, gen.tokens[..., None]) == 0).sum()) == 0
    if mode == "vvs":
        total = gen.aggregate()
        assert total["skipped_verifications"] > 32 and total["withdrawals"] > 0  # the check had work to do


def test_seeds(pipe):
    kwargs = dict(mode="vvs", temperature=1.0, cfg_scale=2.0)
    a = pipe.generate(torch.tensor([1, 2]), seed=7, **kwargs)
    b = pipe.generate(torch.tensor([1, 2]), seed=7, **kwargs)
    c = pipe.generate(torch.tensor([1, 2]), seed=8, **kwargs)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.images, b.images)
    strip = lambda g: [{k: v for k, v in s.to_dict().items() if "seconds" not in k} for s in g.stats]  # noqa: E731
    assert strip(a) == strip(b)
    assert not torch.equal(a.tokens, c.tokens)


@pytest.mark.parametrize("options,message", [
    ({"tree_size": -3}, "option tree_size=-3"),
    ({"mode": "turbo"}, "option mode='turbo': unknown mode"),
    ({"cfg_scale": -1.0}, "option cfg_scale=-1.0"),
    ({"top_p": 0.0}, "option top_p=0.0: must be in (0, 1]"),
    ({"top_p": 1.5}, "option top_p=1.5"),
    ({"skip_policy": "sometimes"}, "option skip_policy='sometimes'"),
    ({"temperature": -0.1}, "option temperature=-0.1"),
    ({"tree_size": 500}, "option tree_size=500: exceeds"),
    ({"draft_top_k": 11}, "option draft_top_k=11: the engine folder accepts draft trees with at most 10 children"),
    ({"lantern_k": 16, "mode": "lantern"}, "option lantern_k=16: must be below the vocabulary size 16"),
    ({"speed": 2}, "unknown option(s): speed"),
])
def test_bad_options_name_the_option(pipe, options, message):
    with pytest.raises(OptionsError) as err:
        pipe.generate(torch.tensor([1]), decode_images=False, **options)
    assert message in str(err.value)


def test_class_id_out_of_range(pipe):
    with pytest.raises(OptionsError, match=r"class id 10 is out of range: the model has 10 classes \(0-9\)"):
        pipe.generate(torch.tensor([1, 10]))


def test_runtime_ar_equals_the_model_level_sampler(pipe):
    """Two independent implementations of guided AR decoding (the runtime's loop over the exported-graph
    interface, and :func:`sample_ar` on the model) agree token for token when decoding greedily."""
    from vvs.families.llamagen.gpt import sample_ar

    target = pipe.engines.graphs["target_verify"].module.target
    classes = torch.tensor([0, 4, 9])
    want = sample_ar(target, classes, cfg_scale=2.0, temperature=1e-6)
    got = pipe.generate(classes, mode="ar", temperature=0, cfg_scale=2.0, decode_images=False).tokens
    assert torch.equal(got, want)
