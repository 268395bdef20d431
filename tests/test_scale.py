"""Speed at official sizes: function-preserving inflation (the same tokens at GPT-B's widths and depth), the
drafter's per-node proposals, the vectorised acceptance walk against the sequential one, and ``vvs-bench --scale``."""
import json
from dataclasses import replace

import pytest
import torch

from conftest import SMALL, run_cli
from reference_accept import walk_accept
from vvs.engines import load_engines
from vvs.discrete.engines import torch_engines
from vvs.discrete.graphs import Proposer
from vvs.families.llamagen.bundle import load_bundle
from vvs.models.layers import causal_mask
from vvs.families.llamagen.inflate import inflate_bundle, inflated_config
from vvs.runtime.accept import Relaxation, sample_accept
from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline
from vvs.runtime.sampling import Processor, cfg_matrix, filter_logits
from vvs.runtime.tree import DraftTree, ancestor_matrix


def _forward_pair(small, big, tokens, conditions):
    """Target and drafter logits of both pairs; the large pair's over the small one's codes only."""
    a, b = small.target.teacher_forced(conditions, tokens), big.target.teacher_forced(conditions, tokens)
    length = tokens.shape[1] + 1
    ids = torch.cat([tokens, tokens[:, :1]], 1)
    positions = torch.arange(1, length + 1).expand(len(tokens), -1)
    da = small.drafter(a.hidden, ids, positions, causal_mask(length))
    db = big.drafter(b.hidden, ids, positions, causal_mask(length))
    codes = small.target.config.vocab_size
    return (a, b._replace(logits=b.logits[..., :codes]), small.target.output(da.hidden),
            big.target.output(db.hidden)[..., :codes], db.hidden)


@pytest.fixture(scope="module")
def shipped():
    return load_bundle()


@pytest.fixture(scope="module")
def shipped_b(shipped):
    return inflate_bundle(shipped, "GPT-B")


@torch.no_grad()
def test_inflated_shipped_pair_computes_the_same_function(shipped, shipped_b):
    """GPT-B's shapes (12 layers, 12 heads of 64, width 768, feed-forward 2048, the official 16,384-code head; head
    dimension twice the shipped one's), the shipped pair's logits and drafter logits to float rounding over its
    1,024 codes, and exact zeros in the padded channels."""
    cfg = shipped_b.target.config
    assert (cfg.n_layer, cfg.n_head, cfg.dim, cfg.ffn_hidden, cfg.vocab_size) == (12, 12, 768, 2048, 16384)
    assert cfg.sampled_ids == range(1024) and shipped_b.drafter.config.vocab_size == 16384
    assert shipped_b.drafter.layers[0].mlp.gate_proj.weight.shape == (2048, 768)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 1024, (3, 60), generator=gen)
    a, b, da, db, drafter_hidden = _forward_pair(shipped, shipped_b, tokens, torch.tensor([0, 7, 16]))
    scale = a.logits.abs().max()
    assert (a.logits - b.logits).abs().max() < 1e-5 * scale
    assert (da - db).abs().max() < 1e-5 * da.abs().max()
    assert torch.equal(b.hidden[..., 192:], torch.zeros_like(b.hidden[..., 192:]))
    assert torch.equal(drafter_hidden[..., 192:], torch.zeros_like(drafter_hidden[..., 192:]))
    # the padding is not trivially zero everywhere: the dead heads, layers, channels and codes compute random values
    assert shipped_b.target.layers[11].attention.wqkv.weight.abs().sum() > 0
    assert shipped_b.target.output.weight[1024:].abs().min() > 0


def test_inflation_with_four_times_the_head_dimension(bundle_factory):
    """The rotary pairs of a head of dimension 16 sit at every 4th pair of GPT-B's heads of 64."""
    small = bundle_factory()
    big = inflate_bundle(small, "GPT-B")
    tokens = torch.randint(0, small.target.config.vocab_size, (2, 15), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b, da, db, _ = _forward_pair(small, big, tokens, torch.tensor([1, 4]))
    assert (a.logits - b.logits).abs().max() < 1e-5 * a.logits.abs().max()
    assert (da - db).abs().max() < 1e-5 * da.abs().max()


@torch.no_grad()
def test_inflating_a_broken_copy_is_caught():
    """The equality test has teeth: a query scale left uncompensated changes the logits."""
    small = load_bundle()
    big = inflate_bundle(small, "GPT-B")
    big.target.layers[0].attention.wqkv.weight[:768] *= 0.5
    tokens = torch.randint(0, 1024, (1, 30), generator=torch.Generator().manual_seed(2))
    a, b = small.target.teacher_forced(torch.tensor([3]), tokens), big.target.teacher_forced(torch.tensor([3]), tokens)
    assert (a.logits - b.logits[..., :1024]).abs().max() > 1e-2


def test_inflation_refuses_a_smaller_size(shipped):
    from vvs.families.llamagen.gpt import gpt_config

    with pytest.raises(ValueError, match="at least as many layers, heads and codes"):
        inflated_config(gpt_config("GPT-XL", n_layer=8), "GPT-B")
    with pytest.raises(KeyError):
        inflated_config(shipped.target.config, "GPT-Q")


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, top_k=100, top_p=0.9)])
def test_inflated_pair_decodes_the_shipped_tokens(shipped, shipped_b, sampling):
    """The real loop with guidance, VVS over LANTERN with a tree, greedy and sampled with both filters: the
    GPT-B-sized pair, with the official 16,384-code head, commits the shipped pair's tokens and makes the same target
    forwards, skips and drafter calls — its acceptance is the shipped pair's, and its extra codes are never
    sampled."""
    opts = DecodeOptions(mode="vvs", cfg_scale=3.0, lantern_k=32, skip_interval=3, tree_size=12, depth=3,
                         draft_top_k=4, **sampling)
    got = []
    for bundle in (shipped, shipped_b):
        pipe = Pipeline(torch_engines(bundle), opts, max_batch=2)
        try:
            got.append(pipe.generate([5, 12], seed=0, decode_images=False))
        finally:
            pipe.close()
    small, big = got
    assert torch.equal(small.tokens, big.tokens)
    for s, b in zip(small.stats, big.stats):
        assert (s.target_forwards, s.skipped_verifications, s.drafter_forwards) == (
            b.target_forwards, b.skipped_verifications, b.drafter_forwards)
    assert small.stats[0].skipped_verifications > 0 and small.stats[0].tokens_per_target_forward > 1.5


def _llamagen_filter(logits, top_k, top_p):
    """LlamaGen's ``top_k_top_p_filtering`` as its source reads (written here from that description): remove codes
    below the k-th value; sort, and remove a code once the cumulative softmax of the codes before it exceeds p.
    Then codes tied with the least likely one kept are kept too (LlamaGen's sort order decides among them)."""
    logits = logits.clone()
    if top_k > 0:
        k = min(top_k, logits.shape[-1])
        logits[logits < logits.topk(k, -1).values[..., -1:]] = float("-inf")
    if top_p < 1.0:
        ordered, order = logits.sort(-1, descending=True)
        cum = ordered.softmax(-1).cumsum(-1)
        remove = torch.cat([torch.zeros_like(cum[..., :1], dtype=torch.bool), cum[..., :-1] > top_p], -1)
        least = ordered.masked_fill(remove, float("inf")).amin(-1, keepdim=True)
        logits[remove.scatter(-1, order, remove) & (logits < least)] = float("-inf")
    return logits


FILTERS = [(k, p) for k in (0, 3, 5, 7, 40, 60) for p in (1.0, 0.9, 0.6, 0.3)]


def test_the_targets_filter_is_llamagens_ties_included():
    """Top-k keeps codes tied with the k-th; top-p's mass is renormalised over top-k's survivors, ties included, and
    a code stays while the mass before it is at most p — on random logits and on logits tied at the k-th value."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(64, 60, generator=gen) * 2.0
    tied = logits.clone()
    ranked = tied.argsort(-1, descending=True)
    for k in (3, 7, 40):  # the k-th code ties with the next one
        tied.scatter_(-1, ranked[:, k : k + 1], tied.gather(-1, ranked[:, k - 1 : k]))
    for k, p in FILTERS:
        for x in (logits, tied):
            want = _llamagen_filter(x / 0.8, k, p)
            assert torch.equal(filter_logits(x, 0.8, k, p).isfinite(), want.isfinite()), (k, p)


@pytest.mark.parametrize("tied", [False, True])
def test_drafted_candidates_are_those_the_targets_filter_keeps(tied):
    """The drafter's in-graph filter against the target's (:func:`filter_logits`) on the same guided, tempered
    logits: a candidate is proposed, with its log-probability over the whole vocabulary, exactly when the target's
    filter keeps it — top-k below, at and above the candidates' count and at the vocabulary, top-p with and without
    top-k, on logits with ties and without."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 60, bias=False)
    hidden = torch.randn(6, 3, 8)  # 3 images with guidance
    if tied:  # codes in identical pairs: the k-th code's twin ties with it across the top-k boundary (k odd)
        head.weight.data[1::2] = head.weight.data[0::2]
    prop = Proposer(head, 5).eval()
    mix = cfg_matrix(3, 2.5)
    logits = 2.5 * head(hidden[:3]) - 1.5 * head(hidden[3:])
    with torch.no_grad():
        for k, p in FILTERS:
            inputs = Processor(0.8, k, p, vocab_size=60).graph_inputs()
            logp, ids = prop(hidden, mix, *(inputs[name] for name in ("temperature", "top_k", "top_p", "survivors_k")))
            kept = filter_logits(logits, 0.8, k, p).gather(-1, ids).isfinite()
            assert torch.equal(logp.isfinite(), kept), (k, p)
            want = torch.log_softmax(logits / 0.8, -1).gather(-1, ids)
            assert torch.allclose(logp[kept], want[kept], atol=1e-5)
            assert kept[..., 0].all()
    assert ids.shape == (3, 3, 5)


def _random_tree(n, gen, vocab, k=3, depth=3):
    """Random trees as the drafter grows them: node 0 the root, each later node a child of an earlier one, at most
    ``k`` children per node, distinct tokens among siblings."""
    t = 1 + k + k * k
    parent = torch.full((n, t), -1)
    for i in range(n):
        children = [0] * t
        for c in range(1, t):
            options = [p for p in range(c) if children[p] < k and (p == 0 or parent[i, p] >= 0)]
            p = options[torch.randint(len(options), (1,), generator=gen).item()]
            parent[i, c] = p
            children[p] += 1
    d = torch.zeros(n, t, dtype=torch.long)
    for c in range(1, t):
        d[:, c] = d.gather(1, parent[:, c : c + 1].clamp(min=0)).squeeze(1) + 1
    tokens = torch.randint(0, vocab, (n, t), generator=gen)
    for c in range(1, t):  # siblings draw distinct codes
        for b in range(1, c):
            same = (parent[:, b] == parent[:, c]) & (tokens[:, b] == tokens[:, c])
            tokens[:, c] = torch.where(same, (tokens[:, c] + 1) % vocab, tokens[:, c])
    max_depth = int(d.max())
    return DraftTree(tokens, parent, d, ancestor_matrix(parent, max_depth), max_depth), k


@pytest.mark.parametrize("relaxed", [False, True])
def test_vectorised_acceptance_equals_the_sequential_walk(relaxed):
    """Every decision of the walk: accepted nodes, path lengths and bonus tokens of 400 random trees over peaked and
    flat target distributions, with and without LANTERN's lending, equal the node-by-node walk."""
    gen = torch.Generator().manual_seed(3)
    vocab, n = 12, 400
    for round_ in range(3):
        tree, k = _random_tree(n, gen, vocab)
        logits = torch.randn(n, tree.size, vocab, generator=gen) * (1.0, 3.0, 8.0)[round_]
        probs = torch.softmax(logits, -1)
        relax = None
        if relaxed:
            neighbours = torch.stack([(torch.arange(vocab) + j) % vocab for j in range(1, 5)], 1)
            relax = Relaxation(neighbours, 0.3)
        u = torch.rand(n, 1 + (tree.max_depth) * k, generator=gen)
        want = walk_accept(tree, probs, relax, k, u)
        got = sample_accept(tree, probs, relax, k, u)
        assert torch.equal(got.length, want.length)
        assert torch.equal(got.nodes, want.nodes)
        assert torch.equal(got.bonus, want.bonus)
        assert 0 < (got.length > 1).float().mean() < 1  # some images accept drafts, some none


def test_bench_scale_runs_an_inflated_folder(tiny_folder, tmp_path, capsys, monkeypatch):
    """``vvs-bench --scale GPT-B:2``: exports the inflated folder (GPT-B's width, 2 of its layers) once beside the
    source, runs every requested mode there with the source pair's tokens (greedy), labels the numbers with the
    depth extrapolation, and refuses what it cannot do."""
    import shutil

    from vvs.cli.bench import main as bench_main

    folder = tmp_path / "engines"
    shutil.copytree(tiny_folder, folder)
    out = tmp_path / "bench"
    args = ["--engine", folder, "--backend", "onnxruntime", "--mode", "ar,vvs", "--num-images", "2", "--num-seeds", "1",
            "--temperature", "0", "--out", out]
    code, stdout, err = run_cli(bench_main, [*args, "--scale", "GPT-B:2"], capsys, monkeypatch)
    assert code == 0, err
    # GPT-B's width at 2 of its 12 layers (the source's depth): the target's time extrapolated by its parameters
    layer, head = 4 * 768**2 + 3 * 768 * 2048 + 2 * 768, 768 * 16384 + 768
    assert "measured at GPT-B compute cost (a target of 2 layers x 12 heads x 768 wide" in stdout
    assert ("the target's time extrapolated linearly in depth from 2 to its 12 layers "
            f"(x{(head + 12 * layer) / (head + 2 * layer):.3f})") in stdout
    scaled = json.loads((out / "results.json").read_text())
    manifest = json.loads((tmp_path / "engines-scale" / "GPT-B-2" / "manifest.json").read_text())
    assert (manifest["model"]["target"]["dim"], manifest["model"]["target"]["n_layer"]) == (768, 2)
    assert manifest["model"]["inflated"]["target_time_scale"] == pytest.approx((head + 12 * layer) / (head + 2 * layer))
    assert manifest["decoding_defaults"]["tree_size"] == SMALL["tree_size"]
    code, _, _ = run_cli(bench_main, args, capsys, monkeypatch)
    small = json.loads((out / "results.json").read_text())
    for mode in ("ar", "vvs"):
        a, b = small["modes"][mode], scaled["modes"][mode]
        assert a["tokens_per_target_forward"] == b["tokens_per_target_forward"]
        assert a["target_forwards_per_image"] == b["target_forwards_per_image"]
    # the inflated folder on ONNX Runtime, sampled with both filters: the source's tokens in every kind of mode
    assert manifest["model"]["target"]["vocab_size"] == 16384
    pipes = [Pipeline(load_engines(f, "onnxruntime")) for f in (folder, tmp_path / "engines-scale" / "GPT-B-2")]
    for mode in ("sd", "vvs", "sjd"):
        tokens = [p.generate([1, 3], mode=mode, temperature=1.0, top_k=10, top_p=0.8, cfg_scale=2.0, seed=3,
                             decode_images=False).tokens for p in pipes]
        assert torch.equal(*tokens), mode
    for bad, message in ((["--scale", "GPT-Q"], "choose one of GPT-B"), (["--scale", "GPT-B", "--tune"], "--tune"),
                         (["--scale", "GPT-B:1"], "take 2 (the source's depth) to 12 layers"),
                         (["--scale", "GPT-B:x"], "optionally with :LAYERS")):
        code, _, err = run_cli(bench_main, [*args, *bad], capsys, monkeypatch)
        assert code == 2 and message in err and "Traceback" not in err


def test_a_size_that_does_not_fit_runs_at_the_deepest_depth_that_does():
    """A scale run's peak is about four float32 copies of its target (the export): the depth chosen is the largest
    whose copies fit 80 % of the memory, never below the source's; none fits: None."""
    from vvs.families.janus_pro.inflate import inflated_config as janus_inflated
    from vvs.families.janus_pro.model import JanusGen, janus_config
    from vvs.discrete.scale import PEAK_BYTES, fitting_depth, total_parameters

    full = janus_inflated(janus_config("Janus-vvs-S"), "Janus-Pro-7B")
    assert full.n_layer == 30
    per_layer = total_parameters(JanusGen, full) - total_parameters(JanusGen, replace(full, n_layer=29))
    at_12 = total_parameters(JanusGen, replace(full, n_layer=12))
    memory = int(at_12 * PEAK_BYTES["fp32"] / 0.8) + 1
    assert fitting_depth(JanusGen, full, 10, memory) == 12
    assert fitting_depth(JanusGen, full, 10, memory + int(per_layer * PEAK_BYTES["fp32"] / 0.8) + 1) == 13
    assert fitting_depth(JanusGen, full, 10, 10**15) == 30
    assert fitting_depth(JanusGen, full, 13, memory) is None
    # this machine's 24 GiB: Janus-Pro-7B whole at int4 and int8, float32 at a few layers only
    assert fitting_depth(JanusGen, full, 10, 24 * 2**30, "int4") == 30
    assert fitting_depth(JanusGen, full, 10, 24 * 2**30, "int8") == 30
    assert fitting_depth(JanusGen, full, 10, 24 * 2**30) is None


def test_the_target_time_scale_multiplies_the_target_seconds_only():
    """``run_benchmark``'s extrapolation on fixed statistics (a stand-in pipeline that returns them, so the times are
    known): target seconds x3, drafter and runtime seconds unchanged, the speed-up recomputed from the sums."""
    from types import SimpleNamespace

    from vvs.bench import make_settings, run_benchmark
    from vvs.runtime.stats import ImageStats

    class FixedPipeline:
        def options_for(self, **overrides):
            return None

        def generate(self, labels, seed, decode_images=True, **overrides):
            draft = 0.5 if overrides.get("mode") == "vvs" else 0.0
            stats = [ImageStats(tokens=16, target_forwards=8, draft_seconds=draft, verify_seconds=1.0,
                                other_seconds=0.25) for _ in labels]
            return SimpleNamespace(tokens=torch.zeros(len(labels), 4), images=torch.zeros(len(labels), 3, 2, 2),
                                   stats=stats)

    results, _ = run_benchmark(FixedPipeline(), make_settings(["ar", "vvs"], {}), [0, 1], 1, 1, progress=False,
                               target_time_scale=3.0)
    ar, vvs = results["modes"]["ar"], results["modes"]["vvs"]
    assert ar["seconds_per_image"]["median"] == 3.25 and vvs["seconds_per_image"]["median"] == 3.75
    assert (vvs["verify_seconds_per_image"], vvs["draft_seconds_per_image"]) == (3.0, 0.5)
    assert vvs["speedup_vs_ar"] == pytest.approx(3.25 / 3.75)


def _janus_logits(bundle, ids, mask, tokens):
    """Target logits over ``[prompt ‖ codes]`` and the drafter's logits at the codes' positions."""
    from vvs.models.layers import caption_causal_mask

    seen = torch.cat([mask, torch.ones_like(tokens, dtype=torch.bool)], 1)
    out = bundle.target.teacher_forced(ids, tokens, caption_causal_mask(seen, seen.shape[1]))
    c, n = ids.shape[1], tokens.shape[1]
    positions = torch.arange(c, c + n).expand(len(tokens), -1)
    drafted = bundle.drafter(out.hidden[:, c - 1 : c - 1 + n], tokens, positions, causal_mask(n))
    return out, bundle.target.head(drafted.hidden)


@pytest.fixture(scope="module")
def janus_1b(janus_bundle):
    """The tiny Janus pair at Janus-Pro-1B's width (2,048, 16 heads of 128: eight times the tiny head dimension),
    feed-forward 5,632 and 16,384-code head, at the tiny pair's 2 layers."""
    from vvs.families.janus_pro.inflate import inflate_bundle as inflate_janus

    return inflate_janus(janus_bundle, "Janus-Pro-1B", n_layer=2)


@torch.no_grad()
def test_inflated_janus_pair_computes_the_same_function(janus_bundle, janus_1b, monkeypatch):
    """Target and drafter logits of the tiny Janus pair at Janus-Pro-1B's width equal the tiny pair's to float
    rounding over its codes, with left-padded prompts; the padded stream channels are exact zeros. Mapping the
    rotary pairs as LlamaGen's interleaved 2-D layout instead breaks it."""
    from conftest import JANUS_PROMPTS
    import vvs.families.janus_pro.inflate as janus_inflate
    from vvs.families.janus_pro.prompts import PromptIds
    from vvs.models.inflation import Inflater

    cfg = janus_1b.target.config
    assert (cfg.dim, cfg.n_head, cfg.ffn_hidden, cfg.vocab_size, cfg.n_layer) == (2048, 16, 5632, 16384, 2)
    assert cfg.sampled_ids == range(256) and janus_1b.drafter.config.intermediate_size == 5632
    ids, mask = PromptIds.from_file(janus_bundle.tokenizer, janus_bundle.target.config).encode(JANUS_PROMPTS)
    tokens = torch.randint(0, 256, (3, 10), generator=torch.Generator().manual_seed(0))
    (a, da), (b, db) = (_janus_logits(x, ids, mask, tokens) for x in (janus_bundle, janus_1b))
    assert (a.logits - b.logits[..., :256]).abs().max() < 1e-5 * a.logits.abs().max()
    assert (da - db[..., :256]).abs().max() < 1e-5 * da.abs().max()
    assert torch.equal(b.hidden[..., 64:], torch.zeros_like(b.hidden[..., 64:]))
    assert janus_1b.target.gen_head.vision_head.weight[256:].abs().min() > 0  # real arithmetic on the extra codes

    between = Inflater.between.__func__  # the wrong head layout for Janus-Pro: LlamaGen's interleaved rotary pairs
    monkeypatch.setattr(Inflater, "between",
                        classmethod(lambda cls, small, big, seed, **_: between(cls, small, big, seed, interleaved=True)))
    wrong = janus_inflate.inflate_target(janus_bundle.target, "Janus-Pro-1B", n_layer=2)
    c = _janus_logits(replace(janus_bundle, target=wrong, drafter=janus_1b.drafter), ids, mask, tokens)[0]
    assert (a.logits - c.logits[..., :256]).abs().max() > 1e-3 * a.logits.abs().max()


def test_inflated_janus_pair_decodes_the_tiny_pairs_tokens(janus_bundle, janus_1b):
    """The real loop with guidance, sampled with both filters: VVS over a tree and SJD give the tiny pair's tokens,
    target forwards and skips at Janus-Pro-1B's width; so does GSD without filters and with groups wider than the
    tiny vocabulary (a group never reaches the inflated head's extra codes, which have no latent)."""
    from conftest import JANUS_PROMPTS

    opts = DecodeOptions(mode="vvs", cfg_scale=5.0, lantern_k=4, skip_interval=2, tree_size=6, depth=2,
                         draft_top_k=2, temperature=1.0, top_k=50, top_p=0.9)
    got = {}
    for name, bundle in (("tiny", janus_bundle), ("1b", janus_1b)):
        pipe = Pipeline(torch_engines(bundle), opts, max_batch=3)
        try:
            got[name] = [pipe.generate(JANUS_PROMPTS, seed=1, decode_images=False, mode=m) for m in ("vvs", "sjd")]
            got[name].append(pipe.generate(JANUS_PROMPTS, seed=1, decode_images=False, mode="gsd", top_k=0,
                                           top_p=1.0, gsd_group_size=600, gsd_prob_gap=1.0, gsd_distance=4.0))
        finally:
            pipe.close()
    for small, big in zip(got["tiny"], got["1b"]):
        assert torch.equal(small.tokens, big.tokens)
        assert [(s.target_forwards, s.skipped_verifications) for s in small.stats] == \
            [(s.target_forwards, s.skipped_verifications) for s in big.stats]
    assert got["tiny"][0].stats[0].skipped_verifications > 0


# ----------------------------------------------------------------------------- Lumina-mGPT


@pytest.fixture(scope="module")
def lumina_pair(tmp_path_factory):
    """A Lumina-tiny pair with Chameleon-7B's head dimension (one head of 128) and a briefly trained drafter."""
    from tests.lumina_reference import tiny_lumina_bundle

    return tiny_lumina_bundle(tmp_path_factory.mktemp("lumina-scale"), dim=128, n_head=1, n_layer=1)


@pytest.fixture(scope="module")
def lumina_7b(lumina_pair):
    """That pair at Lumina-mGPT-7B's width (4,096, 32 heads of 128), feed-forward 11,008 and 8,192-code stream, at
    its one layer."""
    from vvs.families.lumina_mgpt.inflate import inflate_bundle as inflate_lumina

    return inflate_lumina(lumina_pair, "Lumina-mGPT-7B", n_layer=1)


def _lumina_logits(bundle, prompts):
    """Target logits over ``[prompt ‖ stream]`` and the drafter's logits at the stream's positions, for a stream of
    codes with end-of-line tokens at the row ends."""
    from vvs.families.lumina_mgpt.prompts import PromptIds
    from vvs.models.layers import caption_causal_mask

    cfg = bundle.target.config
    ids, mask = PromptIds.from_file(bundle.tokenizer, cfg).encode(prompts)
    codes = torch.randint(0, 64, (len(prompts), 10), generator=torch.Generator().manual_seed(0))
    tokens = torch.where(torch.arange(10) % (cfg.grid_size + 1) == cfg.grid_size, cfg.eol, codes)
    seen = torch.cat([mask, torch.ones_like(tokens, dtype=torch.bool)], 1)
    out = bundle.target.teacher_forced(ids, tokens, caption_causal_mask(seen, seen.shape[1]))
    c, n = ids.shape[1], tokens.shape[1]
    positions = torch.arange(c, c + n).expand(len(tokens), -1)
    drafted = bundle.drafter(out.hidden[:, c - 1 : c - 1 + n], tokens, positions, causal_mask(n))
    return out.logits[..., :65], bundle.target.head(drafted.hidden)[..., :65], out.hidden  # the small stream's


@torch.no_grad()
def test_inflated_lumina_pair_computes_the_same_function(lumina_pair, lumina_7b, monkeypatch):
    """Target and drafter logits of the pair at Lumina-mGPT-7B's width equal the small pair's to float rounding, over
    its codes and the end-of-line token, with left-padded prompts; the official image ids beyond them are scored
    with real weights and never sampled; the padded stream channels are exact zeros. Leaving the query/key norms'
    gains and biases at their defaults breaks it."""
    from vvs.families.lumina_mgpt.inflate import inflate_target
    from vvs.models.inflation import Inflater

    cfg = lumina_7b.target.config
    assert (cfg.dim, cfg.n_head, cfg.ffn_hidden, cfg.vocab_size, cfg.eol) == (4096, 32, 11008, 8193, 64)
    assert cfg.sampled_ids == range(64) and lumina_7b.drafter.config.intermediate_size == 11008
    assert cfg.stream_ids[64:67] == (cfg.eol_id, 68, 69) and cfg.stream_ids[-1] == 8195
    assert lumina_7b.target.lm_head.weight[65:].norm(dim=1).min() > 0  # every extra code is scored for real
    prompts = ["a red bird", "a cat on the hill", "bird"]
    (a, da, _), (b, db, hidden) = (_lumina_logits(x, prompts) for x in (lumina_pair, lumina_7b))
    assert (a - b).abs().max() < 1e-5 * a.abs().max()
    assert (da - db).abs().max() < 1e-5 * da.abs().max()
    assert torch.equal(hidden[..., 128:], torch.zeros_like(hidden[..., 128:]))

    monkeypatch.setattr(Inflater, "head_norm", lambda self, big, small: None)
    wrong = replace(lumina_7b, target=inflate_target(lumina_pair.target, "Lumina-mGPT-7B", n_layer=1))
    c = _lumina_logits(wrong, prompts)[0]
    assert (a - c).abs().max() > 1e-3 * a.abs().max()


def test_inflated_lumina_pair_decodes_the_small_pairs_tokens(lumina_pair, lumina_7b):
    """The real loop with guidance and both filters: VVS over a tree and SJD-PAC commit the small pair's tokens, with
    its target forwards and skips, at Lumina-mGPT-7B's width."""
    opts = DecodeOptions(mode="vvs", cfg_scale=3.0, lantern_k=4, skip_interval=2, tree_size=6, depth=2,
                         draft_top_k=2, temperature=1.0, top_k=20, top_p=0.9)
    prompts = ["a red bird", "a cat on the hill"]
    got = {}
    for name, bundle in (("small", lumina_pair), ("7b", lumina_7b)):
        pipe = Pipeline(torch_engines(bundle), opts, max_batch=2)
        try:
            got[name] = [pipe.generate(prompts, seed=1, decode_images=False, mode=m) for m in ("vvs", "sjd-pac")]
        finally:
            pipe.close()
    for small, big in zip(got["small"], got["7b"]):
        assert torch.equal(small.tokens, big.tokens)
        assert [(s.target_forwards, s.skipped_verifications) for s in small.stats] == \
            [(s.target_forwards, s.skipped_verifications) for s in big.stats]
    assert got["small"][0].stats[0].skipped_verifications > 0


def test_lumina_inflation_needs_the_official_head_dimension():
    """Chameleon's query/key norms normalise each head's channels: a pair with narrower heads is a one-line refusal."""
    from vvs.families.lumina_mgpt.inflate import inflated_config
    from vvs.families.lumina_mgpt.model import lumina_config

    with pytest.raises(ValueError, match="the same head dimension"):
        inflated_config(lumina_config("Lumina-tiny"), "Lumina-mGPT-7B")
