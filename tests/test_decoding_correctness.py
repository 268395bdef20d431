"""Decoding that holds at every setting and batch: draft trees under sampling filters, per-image randomness and
skip decisions, the skipped path and what the drafter reads after a skip, and LlamaGen's guidance and
caption-padding semantics."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vvs.runtime.decode import Decoding
from vvs.runtime.speculation import Speculation
from vvs.runtime.loops import run
from vvs.runtime.skip import path_similarity, select_unverified
from vvs.runtime.tree import DraftTree, ancestor_matrix, select_tree


@pytest.fixture(scope="module")
def pipe(pipeline_factory):
    return pipeline_factory()


def check_tree(tree: DraftTree) -> None:
    """The structural invariants every verified tree must satisfy."""
    n, t = tree.tokens.shape
    for i in range(n):
        parent, depth = tree.parent[i].tolist(), tree.depth[i].tolist()
        assert parent[0] == -1 and depth[0] == 0
        for node in range(1, t):
            assert 0 <= parent[node] < node, f"node {node} hangs under {parent[node]}"
            assert depth[node] == depth[parent[node]] + 1
        # the ancestor mask is the reflexive-transitive closure of the parent relation
        closure = torch.eye(t, dtype=torch.bool)
        for node in range(1, t):
            closure[node] |= closure[parent[node]]
        assert torch.equal(tree.ancestors[i].cpu(), closure)


def record_trees(monkeypatch) -> list[DraftTree]:
    trees = []
    draft = Speculation.draft

    def recording(self, *feed):
        tree = draft(self, *feed)
        trees.append(tree)
        return tree

    monkeypatch.setattr(Speculation, "draft", recording)
    return trees


# ---------------------------------------------------------------------- draft trees


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_select_tree_keeps_every_parent(data):
    """Pools shaped like the drafter's (root's top-k, then k children per frontier node and level), with scores
    a sampling filter may have set to -inf anywhere, including whole levels and equal finite scores."""
    k = data.draw(st.integers(1, 4), label="draft_top_k")
    depth = data.draw(st.integers(0, 3), label="depth")
    finite = st.sampled_from([0.0, -0.5, -1.0, -2.0, -7.0])
    logp = lambda size: torch.tensor(data.draw(st.lists(  # noqa: E731
        st.one_of(finite, st.just(float("-inf"))), min_size=size, max_size=size)))
    scores, parent, depths = [logp(k)], [torch.full((k,), -1)], [torch.ones(k, dtype=torch.long)]
    frontier = torch.arange(k)
    offset = k
    for level in range(1, depth + 1):
        front_scores = torch.cat(scores)[frontier]
        child_scores = (front_scores[:, None] + logp(k * k).view(k, k)).reshape(-1)
        scores.append(child_scores)
        parent.append(frontier.repeat_interleave(k))
        depths.append(torch.full((k * k,), level + 1))
        best = child_scores.topk(k).indices
        frontier = offset + best
        offset += k * k
    pool = torch.cat(scores)
    tree_size = data.draw(st.integers(2, len(pool) + 1), label="tree_size")
    tokens, *structure = select_tree(torch.arange(len(pool))[None] + 1, pool[None], torch.cat(parent)[None],
                                     torch.cat(depths)[None], tree_size, depth + 1)
    check_tree(DraftTree(torch.cat([torch.tensor([[0]]), tokens], 1), *structure, depth + 1))


@pytest.mark.parametrize("options", [
    dict(temperature=2.0, top_p=0.5),
    dict(temperature=1.0, top_p=0.3, top_k=3),
    dict(temperature=1.0, top_k=2, draft_top_k=4, tree_size=16),
])
def test_trees_under_sampling_filters_are_well_formed(pipe, monkeypatch, options):
    trees = record_trees(monkeypatch)
    pipe.generate(torch.tensor([1, 5, 8]), mode="sd", seed=0, cfg_scale=2.0, decode_images=False, **options)
    assert len(trees) > 5
    for tree in trees:
        check_tree(tree)


@pytest.mark.parametrize("mode", ["sd", "lantern", "vvs"])
@pytest.mark.parametrize("options", [dict(temperature=2.0, top_p=0.5), dict(temperature=1.0, top_k=3, top_p=0.8)])
def test_kv_cache_equals_teacher_forced_under_filters(pipe, mode, options):
    """The committed KV cache equals a plain causal forward over the committed tokens: nothing a malformed tree
    could smuggle in survives."""
    opts = pipe.options.updated(mode=mode, cfg_scale=2.0, skip_interval=2, **options)
    classes = torch.tensor([2, 6, 9])
    for seed in range(3):
        d = Decoding(pipe.engines, classes, opts, seeds=[seed, seed + 10, seed + 20])
        run(Speculation(d))
        target = pipe.engines.graphs["target_verify"].module.target
        c = target.config.cls_token_num
        for i in range(len(classes)):
            length = min(int(d.kv.length[i]), target.config.max_positions - 1)
            tokens = d.tokens[i : i + 1, : length - c]
            with torch.no_grad():
                ref = target.teacher_forced(torch.stack([classes[i], torch.tensor(target.config.null_class)]),
                                            tokens.expand(2, -1)).new_kv
            torch.testing.assert_close(d.kv.kv[:, :, [i, i + 3], :, :length], ref, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------- batch invariance

MODES = [("ar", {}), ("sd", {}), ("lantern", {}), ("vvs", {"skip_policy": "uniform", "skip_interval": 2}),
         ("vvs", {"skip_policy": "dynamic", "sim_threshold": 0.3}), ("sjd", {"window": 5}),
         ("sjd-pac", {"window": 9, "pac_tree_width": 2, "pac_tree_depth": 3}), ("gsd", {"window": 5, "gsd_distance": 4.0, "gsd_prob_gap": 1.0})]


@pytest.mark.parametrize("mode,options", MODES)
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, top_p=0.8),
                                      dict(temperature=1.0, top_k=3, top_p=0.8)])  # VVS withdraws skipped tokens
def test_an_image_does_not_depend_on_its_batch(pipe, mode, options, sampling):
    together = pipe.generate(torch.tensor([3, 7, 1]), mode=mode, seed=7, cfg_scale=2.0, decode_images=False,
                             **options, **sampling)
    for i, cls in enumerate([3, 7, 1]):
        alone = pipe.generate(torch.tensor([cls]), mode=mode, seed=7 + i, cfg_scale=2.0, decode_images=False,
                              **options, **sampling)
        assert torch.equal(together.tokens[i], alone.tokens[0]), f"image {i}"
        assert together.stats[i].trace == alone.stats[0].trace
    if mode == "vvs":
        assert sum(s.skipped_verifications for s in together.stats) > 0
        assert len({tuple(k for k, _, _ in s.trace) for s in together.stats}) > 1, "schedules should differ"
        if "top_k" in sampling:
            assert sum(len(s.withdrawn_lengths) for s in together.stats) > 0


@pytest.mark.parametrize("mode", ["ar", "sd", "vvs"])
def test_text_conditioned_image_does_not_depend_on_its_batch(pipeline_factory, mode):
    pipe = pipeline_factory(model_type="t2i")
    captions = torch.randn(3, 3, 8, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[False, True, True], [True, True, True], [False, False, True]])
    opts = dict(mode=mode, temperature=1.0, cfg_scale=2.0, decode_images=False,
                **({"skip_interval": 2} if mode == "vvs" else {}))  # an option no mode reads is refused
    together = pipe.generate(captions, seed=[5, 9, 11], caption_mask=mask, **opts)
    for i, seed in enumerate([5, 9, 11]):
        alone = pipe.generate(captions[i : i + 1], seed=seed, caption_mask=mask[i : i + 1], **opts)
        assert torch.equal(together.tokens[i], alone.tokens[0]), f"image {i}"


def test_a_skipping_image_leaves_the_verify_batch(pipe, monkeypatch):
    """At batch > 1 a skip saves target compute: the verify forward holds only the images that verify."""
    rows = []
    graph = pipe.engines.graphs["target_verify"]
    run = graph.run

    def counting(**inputs):
        rows.append(inputs["input_ids"].shape[0])
        return run(**inputs)

    monkeypatch.setattr(graph, "run", counting)
    gen = pipe.generate(torch.tensor([3, 7, 1, 4]), mode="vvs", seed=0, temperature=1.0, cfg_scale=2.0,
                        skip_policy="dynamic", sim_threshold=0.3, decode_images=False)
    monkeypatch.undo()
    groups = 2  # guidance doubles the rows
    assert sum(rows) == groups * sum(s.verify_forwards for s in gen.stats)
    assert min(rows) < max(rows)


def test_subset_verification_holds_one_extra_kv_whatever_the_subsets(pipeline_factory, monkeypatch):
    """Images that skip leave the verify batch, whose KV rows are gathered into a buffer; a long mixed run meets
    many subset sizes, and each batch leases one such buffer the size of its own KV, not one per subset size."""
    pipe = pipeline_factory(max_batch=8)
    graph = pipe.engines.graphs["target_verify"]
    run, sizes = graph.run, set()

    def counting(**inputs):
        sizes.add(inputs["input_ids"].shape[0])
        return run(**inputs)

    monkeypatch.setattr(graph, "run", counting)
    pipe.engines.buffers.clear()
    pipe.generate(torch.arange(8) % 10, mode="vvs", seed=0, temperature=1.0, cfg_scale=2.0, skip_policy="dynamic",
                  sim_threshold=0.3, decode_images=False)
    monkeypatch.undo()
    assert len(sizes) >= 4, "the run should meet several subset sizes"
    pooled = {key: len(bufs) for key, bufs in pipe.engines.buffers.items()}
    # finished images leave the batch, so the run held batches of several sizes: per size, one target KV and at
    # most one subset buffer of exactly its shape
    assert {name for name, _ in pooled} == {"target_kv", "target_kv_subset", "drafter_kv"}
    subsets = {shape for name, shape in pooled if name == "target_kv_subset"}
    assert subsets and subsets <= {shape for name, shape in pooled if name == "target_kv"}
    assert all(count == 1 for count in pooled.values())


# ---------------------------------------------------------------------- the skip decision and the skipped path


def hand_tree(parents: list[int], tokens: list[int]) -> DraftTree:
    parent = torch.tensor([parents])
    depth = [0]
    for p in parents[1:]:
        depth.append(depth[p] + 1)
    return DraftTree(torch.tensor([tokens]), parent, torch.tensor([depth]), ancestor_matrix(parent, len(parents)),
                     max(depth))


def test_path_similarity_on_hand_made_trees():
    codebook = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [3.0, 0.0]])
    # two one-token paths with codes at 45 degrees: similarity cos 45
    two = hand_tree([-1, 0, 0], [0, 1, 3])
    assert float(path_similarity(two, codebook, 0.9)) == pytest.approx(2 ** -0.5, abs=1e-6)
    # paths [1, 4] and [2]: weights 1/1.9 and 0.9/1.9 over the longest path (2); depth 1 cos(1, 2) = 0, depth 2
    # has no partner: 0
    uneven = hand_tree([-1, 0, 1, 0], [0, 1, 4, 2])
    assert float(path_similarity(uneven, codebook, 0.9)) == pytest.approx(0.0, abs=1e-6)
    # paths [1, 4] and [4]: depth 1 cos(1, 4) = 1 weighted 1/1.9, depth 2 nothing
    same_first = hand_tree([-1, 0, 1, 0], [0, 1, 4, 4])
    assert float(path_similarity(same_first, codebook, 0.9)) == pytest.approx(1 / 1.9, abs=1e-6)
    # three leaves: mean over the three pairs (cos 0, cos 45, cos 45)
    three = hand_tree([-1, 0, 0, 0], [0, 1, 2, 3])
    assert float(path_similarity(three, codebook, 0.9)) == pytest.approx(2 * 2 ** -0.5 / 3, abs=1e-6)


def test_path_similarity_does_not_depend_on_the_batch(pipe, monkeypatch):
    """The same trees scored alone and stacked with deeper and shallower trees give the same values."""
    trees = record_trees(monkeypatch)
    pipe.generate(torch.tensor([1, 5, 8, 2]), mode="sd", seed=0, cfg_scale=2.0, temperature=1.0, tree_size=5,
                  decode_images=False)  # small trees: some images' paths are deeper than others'
    codebook = pipe.engines.codebook
    stacked = [t for t in trees if int(t.depth.amax(1).min()) < int(t.depth.max())]
    assert stacked, "the test needs batches whose trees differ in depth"
    for tree in stacked:
        together = path_similarity(tree, codebook, 0.9)
        for i in range(tree.tokens.shape[0]):
            one = DraftTree(tree.tokens[i : i + 1], tree.parent[i : i + 1], tree.depth[i : i + 1],
                            tree.ancestors[i : i + 1], tree.max_depth)
            assert float(path_similarity(one, codebook, 0.9)) == pytest.approx(float(together[i]), abs=1e-6)


@pytest.mark.parametrize("u,committed,next_root", [
    (0.9, [10, 11], 12),  # the deep leaf (13): path 10-11-12-13 cut at the mean path length (3 nodes) - 1
    (0.3, [10], 14),  # the shallow leaf (14): its one draft becomes the next root
])
def test_skipped_path_its_truncation_and_the_next_root(u, committed, next_root):
    tree = hand_tree([-1, 0, 1, 2, 0], [10, 11, 12, 13, 14])  # leaves: node 3 (depth 3) and node 4 (depth 1)
    path, a, root = select_unverified(tree, 6, torch.tensor([u]))
    assert path[0, : int(a)].tolist() == committed
    assert int(root) == next_root


def test_uniform_skips_commit_a_drafted_path_and_its_next_root(pipe, monkeypatch):
    """A skipped cycle commits the first tokens of one of that cycle's drafted paths, root first, and the token
    after them is the next cycle's root; the skips fall on cycles 1, 1 + I, ... once warm-up is over."""
    trees = record_trees(monkeypatch)
    interval = 2
    gen = pipe.generate(torch.tensor([4]), mode="vvs", seed=1, temperature=1.0, cfg_scale=2.0,
                        skip_policy="uniform", skip_interval=interval, decode_images=False)
    tokens = gen.tokens[0].tolist()
    stats = gen.stats[0]
    skips = 0
    for cycle, (kind, before, count) in enumerate(stats.trace):
        tree = trees[cycle]
        warm = before > pipe.options.skip_warmup_tokens
        verified_after = before + pipe.options.max_path_tokens < len(tokens)
        assert (kind == "skip") == (warm and verified_after and cycle % interval == 1
                                    and stats.trace[cycle - 1][0] != "skip")
        if kind != "skip" or before + count >= len(tokens):
            continue
        skips += 1
        paths = {tuple(tree.tokens[0, tree.path_nodes(torch.tensor([leaf]), 8)[0].clamp(min=0)].tolist()[: count + 1])
                 for leaf in tree.is_leaf()[0].nonzero().flatten().tolist()}
        assert tuple(tokens[before : before + count + 1]) in paths  # the committed chain and the next root
        assert trees[cycle + 1].tokens[0, 0] == tokens[before + count]
    assert skips >= 2


def test_after_a_skip_the_drafter_reads_cached_target_features(pipe, monkeypatch):
    """The drafter's new slots after a skip of ``a`` tokens get the target features of the ``a`` most recently
    verified positions (VVS's feature reuse), checked against a teacher-forced forward."""
    seen = []
    accept = Speculation.accept_unverified

    def capturing(self, skipping, u):
        count_before = self.d.count.clone()
        accept(self, skipping, u)
        seen.append((count_before, self.feed.count.clone(), self.feed.features.clone(), skipping.clone()))

    monkeypatch.setattr(Speculation, "accept_unverified", capturing)
    gen = pipe.generate(torch.tensor([4]), mode="vvs", seed=2, temperature=1.0, cfg_scale=2.0, skip_interval=2,
                        decode_images=False)
    target = pipe.engines.graphs["target_verify"].module.target
    c = target.config.cls_token_num
    with torch.no_grad():
        hidden = target.teacher_forced(torch.tensor([4, target.config.null_class]), gen.tokens.expand(2, -1)).hidden
    assert seen
    for before, a, features, skipping in seen:
        assert bool(skipping[0])
        b, a = int(before[0]), int(a[0])
        positions = list(range(c + b - a, c + b))  # the a most recent verified positions (slots C + token index)
        torch.testing.assert_close(features[:, :a], hidden[:, positions], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------- LlamaGen's guidance and caption padding


def test_guidance_applies_only_above_one(pipe):
    """LlamaGen guides only for scale > 1: any scale up to 1 decodes exactly as unguided."""
    base = dict(mode="sd", seed=3, temperature=1.0, decode_images=False)
    plain = pipe.generate(torch.tensor([2, 5]), cfg_scale=1.0, **base)
    for scale in (0.0, 0.5):
        assert torch.equal(pipe.generate(torch.tensor([2, 5]), cfg_scale=scale, **base).tokens, plain.tokens)
    assert not torch.equal(pipe.generate(torch.tensor([2, 5]), cfg_scale=1.5, **base).tokens, plain.tokens)


def test_padded_caption_slots_see_only_themselves(pipeline_factory):
    """LlamaGen's ``generate``: a padded caption slot attends to itself alone, valid slots never see padding.
    Checked on the unconditional rows (whose padded slots hold the non-zero null caption) against forwards of the
    slots on their own."""
    pipe = pipeline_factory(model_type="t2i")
    captions = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[False, True, True], [False, False, True]])
    opts = pipe.options.updated(mode="sd", cfg_scale=2.0)
    d = Decoding(pipe.engines, captions, opts, seeds=[0, 1], caption_mask=mask)
    hidden = d.prefill()["hidden"]  # [cond 0, cond 1, uncond 0, uncond 1]
    target = pipe.engines.graphs["target_verify"].module.target
    emb = target.cls_embedding(target.null_condition(torch.zeros(1, 3, 8)))  # [1, 3, dim]
    one = torch.ones(1, 1, 1, 1, dtype=torch.bool)
    with torch.no_grad():
        for row, img in ((2, 0), (3, 1)):
            for slot in (~mask[img]).nonzero().flatten().tolist():
                alone = target.forward_embeddings(emb[:, slot : slot + 1], torch.tensor([[slot]]), one).hidden
                torch.testing.assert_close(hidden[row, slot], alone[0, 0], atol=1e-5, rtol=0)
        valid = mask[1].nonzero().flatten()  # image 1's one valid slot sees itself alone too
        alone = target.forward_embeddings(emb[:, valid], valid[None], one).hidden
        torch.testing.assert_close(hidden[3, valid], alone[0], atol=1e-5, rtol=0)

