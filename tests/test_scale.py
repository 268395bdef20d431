"""Speed at official sizes: function-preserving inflation (the same tokens at GPT-B's widths and depth), the
drafter's per-node proposals, the vectorised acceptance walk against the sequential one, and ``vvs-bench --scale``."""
import json

import pytest
import torch

from conftest import SMALL, run_cli
from reference_accept import walk_accept
from vvs.families.llamagen.engines import torch_engines
from vvs.families.llamagen.graphs import Proposer
from vvs.families.llamagen.bundle import load_bundle
from vvs.models.layers import causal_mask
from vvs.families.llamagen.inflate import inflate_bundle, inflated_config
from vvs.runtime.accept import Relaxation, sample_accept
from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline
from vvs.runtime.sampling import cfg_matrix
from vvs.runtime.tree import DraftTree, ancestor_matrix


def _forward_pair(small, big, tokens, conditions):
    a, b = small.target.teacher_forced(conditions, tokens), big.target.teacher_forced(conditions, tokens)
    length = tokens.shape[1] + 1
    ids = torch.cat([tokens, tokens[:, :1]], 1)
    positions = torch.arange(1, length + 1).expand(len(tokens), -1)
    da = small.drafter(a.hidden, ids, positions, causal_mask(length))
    db = big.drafter(b.hidden, ids, positions, causal_mask(length))
    return a, b, small.target.output(da.hidden), big.target.output(db.hidden), db.hidden


@pytest.fixture(scope="module")
def shipped():
    return load_bundle()


@pytest.fixture(scope="module")
def shipped_b(shipped):
    return inflate_bundle(shipped, "GPT-B")


@torch.no_grad()
def test_inflated_shipped_pair_computes_the_same_function(shipped, shipped_b):
    """GPT-B's shapes (12 layers, 12 heads of 64, width 768, feed-forward 2048; head dimension twice the shipped
    one's), the shipped pair's logits and drafter logits to float rounding, and exact zeros in the padded channels."""
    cfg = shipped_b.target.config
    assert (cfg.n_layer, cfg.n_head, cfg.dim, cfg.ffn_hidden) == (12, 12, 768, 2048)
    assert shipped_b.drafter.layers[0].mlp.gate_proj.weight.shape == (2048, 768)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (3, 60), generator=gen)
    a, b, da, db, drafter_hidden = _forward_pair(shipped, shipped_b, tokens, torch.tensor([0, 7, 16]))
    scale = a.logits.abs().max()
    assert (a.logits - b.logits).abs().max() < 1e-5 * scale
    assert (da - db).abs().max() < 1e-5 * da.abs().max()
    assert torch.equal(b.hidden[..., 192:], torch.zeros_like(b.hidden[..., 192:]))
    assert torch.equal(drafter_hidden[..., 192:], torch.zeros_like(drafter_hidden[..., 192:]))
    # the padding is not trivially zero everywhere: the dead heads, layers and channels compute random values
    assert shipped_b.target.layers[11].attention.wqkv.weight.abs().sum() > 0


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
    assert (a.logits - b.logits).abs().max() > 1e-2


def test_inflation_refuses_a_smaller_size(shipped):
    from vvs.families.llamagen.gpt import gpt_config

    with pytest.raises(ValueError, match="at least as many layers and heads"):
        inflated_config(gpt_config("GPT-XL", n_layer=8), "GPT-B")
    with pytest.raises(KeyError):
        inflated_config(shipped.target.config, "GPT-Q")


def test_inflated_pair_decodes_the_shipped_tokens(shipped, shipped_b):
    """The real loop, greedy with guidance, VVS over LANTERN with a tree: the GPT-B-sized pair commits the shipped
    pair's tokens and makes the same target forwards, skips and drafter calls — its acceptance is the shipped
    pair's."""
    opts = DecodeOptions(mode="vvs", temperature=0.0, cfg_scale=3.0, lantern_k=32, skip_interval=3, tree_size=12,
                         depth=3, draft_top_k=4)
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


def test_proposer_filters_candidates_without_sorting_the_vocabulary():
    """Candidates are the top-k of the tempered, guided logits; scores are log-probabilities over the whole
    vocabulary; top-k removes candidates past rank K and top-p those whose better-ranked mass reaches p."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    prop = Proposer(head, 5).eval()
    hidden = torch.randn(4, 3, 8)  # 2 images with guidance
    mix = cfg_matrix(2, 2.5)
    args = lambda t, k, p: (torch.tensor([t]), torch.tensor([k]), torch.tensor([p]))  # noqa: E731
    with torch.no_grad():
        logp, ids = prop(hidden, mix, *args(0.8, 0, 1.0))
        logits = (2.5 * head(hidden[:2]) - 1.5 * head(hidden[2:])) / 0.8
        want = torch.log_softmax(logits, -1).topk(5, -1)
        assert torch.equal(ids, want.indices)
        assert torch.allclose(logp, want.values, atol=1e-5)
        logp_k, _ = prop(hidden, mix, *args(0.8, 3, 1.0))
        assert torch.isinf(logp_k[..., 3:]).all() and torch.equal(logp_k[..., :3], logp[..., :3])
        logp_p, _ = prop(hidden, mix, *args(0.8, 0, 0.3))
        mass = logp.exp()
        keep = (mass.cumsum(-1) - mass) < 0.3
        assert torch.equal(torch.isfinite(logp_p), keep) and keep[..., 0].all() and not keep.all()


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
    for bad, message in ((["--scale", "GPT-Q"], "choose one of GPT-B"), (["--scale", "GPT-B", "--tune"], "--tune")):
        code, _, err = run_cli(bench_main, [*args, *bad], capsys, monkeypatch)
        assert code == 2 and message in err and "Traceback" not in err
