"""Speed at official sizes: function-preserving inflation (the same tokens at GPT-B's widths and depth), the
drafter's per-node proposals, the vectorised acceptance walk against the sequential one, and ``vvs-bench --scale``."""
import json

import pytest
import torch

from conftest import SMALL, run_cli
from reference_accept import walk_accept
from vvs.engines import load_engines
from vvs.families.llamagen.engines import torch_engines
from vvs.families.llamagen.graphs import Proposer
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
    """``vvs-bench --scale GPT-B``: exports the inflated folder once beside the source, runs every requested mode
    there with the source pair's tokens (greedy), labels the numbers, and refuses what it cannot do."""
    import shutil

    from vvs.cli.bench import main as bench_main

    folder = tmp_path / "engines"
    shutil.copytree(tiny_folder, folder)
    out = tmp_path / "bench"
    args = ["--engine", folder, "--backend", "onnxruntime", "--mode", "ar,vvs", "--num-images", "2", "--num-seeds", "1",
            "--temperature", "0", "--out", out]
    code, stdout, err = run_cli(bench_main, [*args, "--scale", "GPT-B"], capsys, monkeypatch)
    assert code == 0, err
    assert "measured at GPT-B compute cost (a target of 12 layers x 12 heads x 768 wide" in stdout
    scaled = json.loads((out / "results.json").read_text())
    manifest = json.loads((tmp_path / "engines-scale" / "GPT-B" / "manifest.json").read_text())
    assert manifest["model"]["target"]["dim"] == 768
    assert manifest["decoding_defaults"]["tree_size"] == SMALL["tree_size"]
    code, _, _ = run_cli(bench_main, args, capsys, monkeypatch)
    small = json.loads((out / "results.json").read_text())
    for mode in ("ar", "vvs"):
        a, b = small["modes"][mode], scaled["modes"][mode]
        assert a["tokens_per_target_forward"] == b["tokens_per_target_forward"]
        assert a["target_forwards_per_image"] == b["target_forwards_per_image"]
    # the inflated folder on ONNX Runtime, sampled with both filters: the source's tokens in every kind of mode
    assert manifest["model"]["target"]["vocab_size"] == 16384
    pipes = [Pipeline(load_engines(f, "onnxruntime")) for f in (folder, tmp_path / "engines-scale" / "GPT-B")]
    for mode in ("sd", "vvs", "sjd"):
        tokens = [p.generate([1, 3], mode=mode, temperature=1.0, top_k=10, top_p=0.8, cfg_scale=2.0, seed=3,
                             decode_images=False).tokens for p in pipes]
        assert torch.equal(*tokens), mode
    for bad, message in ((["--scale", "GPT-Q"], "choose one of GPT-B"), (["--scale", "GPT-B", "--tune"], "--tune")):
        code, _, err = run_cli(bench_main, [*args, *bad], capsys, monkeypatch)
        assert code == 2 and message in err and "Traceback" not in err
