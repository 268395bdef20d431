"""The reference models: KV-cache decoding, tree verification, 2-D RoPE and CFG batching."""
import pytest
import torch

from vvs.discrete.drafter import Drafter, DrafterConfig
from vvs.families.llamagen.gpt import GPT, gpt_config
from vvs.models.layers import Rotary, apply_rope, causal_mask, rope_2d_table

TOL = 1e-5


def tiny(model_type: str) -> GPT:
    torch.manual_seed(0)
    if model_type == "t2i":
        return GPT(gpt_config("GPT-tiny", model_type="t2i", cls_token_num=5, caption_dim=24)).eval()
    return GPT(gpt_config("GPT-tiny")).eval()


def condition_for(model: GPT, batch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    if model.config.model_type == "c2i":
        return torch.randint(0, model.config.num_classes, (batch,), generator=g)
    return torch.randn(batch, model.config.cls_token_num, model.config.caption_dim, generator=g)


def prefill(model: GPT, cond: torch.Tensor):
    c = model.config.cls_token_num
    pos = torch.arange(c).expand(cond.shape[0], -1)
    return model(condition=cond, position_ids=pos, mask=causal_mask(c))


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
@torch.no_grad()
def test_incremental_decoding_equals_full_causal_forward(model_type):
    model = tiny(model_type)
    c, n = model.config.cls_token_num, model.config.num_image_tokens
    cond = condition_for(model, 2)
    tokens = torch.randint(0, model.config.vocab_size, (2, n - 1), generator=torch.Generator().manual_seed(2))
    full = model.teacher_forced(cond, tokens)

    out = prefill(model, cond)
    kv, logits, hidden = out.new_kv, [out.logits], [out.hidden]
    for i in range(n - 1):
        length = c + i
        step = model(tokens=tokens[:, i : i + 1], position_ids=torch.full((2, 1), length),
                     mask=torch.ones(1, 1, 1, length + 1, dtype=torch.bool), past_kv=kv)
        kv = torch.cat([kv, step.new_kv], dim=4)
        logits.append(step.logits)
        hidden.append(step.hidden)
    torch.testing.assert_close(torch.cat(logits, 1), full.logits, atol=TOL, rtol=0)
    torch.testing.assert_close(torch.cat(hidden, 1), full.hidden, atol=TOL, rtol=0)


def random_tree(num_nodes: int, gen: torch.Generator) -> list[int]:
    """parents[i] < i for every non-root node (node 0 is the root)."""
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, num_nodes)]


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
@torch.no_grad()
def test_tree_forward_equals_causal_forward_of_each_path(model_type):
    model = tiny(model_type)
    gen = torch.Generator().manual_seed(3)
    cond = condition_for(model, 1)
    prefix = torch.randint(0, model.config.vocab_size, (1, 4), generator=gen)
    parents = random_tree(9, gen)
    nodes = torch.randint(0, model.config.vocab_size, (1, len(parents)), generator=gen)

    # KV of the committed prefix, built by a causal forward
    committed = model.teacher_forced(cond, prefix)
    past = committed.new_kv
    p = past.shape[4]

    depth = [0] * len(parents)
    ancestors = torch.eye(len(parents), dtype=torch.bool)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
        ancestors[i] |= ancestors[parents[i]]
    mask = torch.cat([torch.ones(len(parents), p, dtype=torch.bool), ancestors], dim=1)[None, None]
    positions = torch.tensor([p + d for d in depth])[None]
    tree = model(tokens=nodes, position_ids=positions, mask=mask, past_kv=past)

    for i in range(len(parents)):
        path = [j for j in range(len(parents)) if ancestors[i, j]]
        reference = model.teacher_forced(cond, torch.cat([prefix, nodes[:, path]], dim=1))
        torch.testing.assert_close(tree.logits[0, i], reference.logits[0, -1], atol=TOL, rtol=0)
        torch.testing.assert_close(tree.hidden[0, i], reference.hidden[0, -1], atol=TOL, rtol=0)


def test_rope_condition_rows_are_zero_and_pairs_interleaved():
    c, grid, hd = 3, 4, 16
    table = rope_2d_table(grid, hd, 10000.0, c)
    assert table.shape == (c + grid * grid, hd // 2, 2)
    x = torch.randn(1, c + grid * grid, 2, hd)
    rotary = Rotary(table, interleaved=True)
    rotated = apply_rope(x, *rotary(torch.arange(c + grid * grid)[None]))
    # the official pairwise form, element for element
    xs = x.reshape(*x.shape[:-1], -1, 2)
    cos, sin = table[None, :, None, :, 0], table[None, :, None, :, 1]
    official = torch.stack([xs[..., 0] * cos - xs[..., 1] * sin, xs[..., 1] * cos + xs[..., 0] * sin], -1).flatten(3)
    assert torch.equal(rotated, official)
    # condition queries/keys are zeroed, not left unrotated
    assert torch.count_nonzero(rotated[:, :c]) == 0
    # a token's rotation depends on its (row, column) only: the row angles sit on the first half of the pairs
    for r in range(grid):
        for col in range(grid):
            row_half, col_half = table[c + r * grid + col, : hd // 4], table[c + r * grid + col, hd // 4 :]
            torch.testing.assert_close(row_half, table[c + r * grid, : hd // 4])
            torch.testing.assert_close(col_half, table[c + col, hd // 4 :])
    # interleaved pairs: element (2m, 2m+1) is rotated by angle m; rotate-half would mix m with m + hd/2
    pos = c + 1 * grid + 2
    v = torch.zeros(1, 1, 1, hd)
    v[..., 2] = 1.0  # the first element of pair m = 1
    out = apply_rope(v, *rotary(torch.tensor([[pos]])))
    cos, sin = table[pos, 1]
    assert out[0, 0, 0, 2].item() == pytest.approx(cos.item())
    assert out[0, 0, 0, 3].item() == pytest.approx(sin.item())
    assert torch.count_nonzero(out[0, 0, 0, [0, 1] + list(range(4, hd))]) == 0


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
@torch.no_grad()
def test_cfg_halves_in_one_batch_equal_separate_forwards(model_type):
    model = tiny(model_type)
    cond = condition_for(model, 2)
    uncond = model.null_condition(cond)
    tokens = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(4))
    both = model.teacher_forced(torch.cat([cond, uncond]), torch.cat([tokens, tokens]))
    alone_c = model.teacher_forced(cond, tokens)
    alone_u = model.teacher_forced(uncond, tokens)
    torch.testing.assert_close(both.logits[:2], alone_c.logits, atol=TOL, rtol=0)
    torch.testing.assert_close(both.logits[2:], alone_u.logits, atol=TOL, rtol=0)


@torch.no_grad()
def test_drafter_incremental_equals_full_and_shares_target_rope():
    target = tiny("c2i").config
    torch.manual_seed(5)
    drafter = Drafter(DrafterConfig.for_target(target), target).eval()
    torch.testing.assert_close(drafter.rotary.rope_cos, target.rotary().rope_cos, atol=0, rtol=0)
    torch.testing.assert_close(drafter.rotary.rope_sin, target.rotary().rope_sin, atol=0, rtol=0)
    feats = torch.randn(2, 6, target.dim)
    ids = torch.randint(0, target.vocab_size, (2, 6))
    pos = torch.arange(1, 7).expand(2, -1)
    full = drafter(feats, ids, pos, causal_mask(6))
    first = drafter(feats[:, :4], ids[:, :4], pos[:, :4], causal_mask(4))
    rest = drafter(feats[:, 4:], ids[:, 4:], pos[:, 4:], torch.ones(1, 1, 2, 6, dtype=torch.bool).tril(4),
                   past_kv=first.new_kv)
    torch.testing.assert_close(torch.cat([first.hidden, rest.hidden], 1), full.hidden, atol=TOL, rtol=0)


def test_drafter_rejects_mismatched_width():
    target = gpt_config("GPT-tiny")
    with pytest.raises(ValueError, match="does not match"):
        Drafter(DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, vocab_size=256), target)


@torch.no_grad()
def test_a_reflection_padded_decoder_has_no_position_to_paint_from():
    """A grid of one repeated code decodes to one flat colour with reflection padding (the shipped tokenizer's), and
    not with LlamaGen's zero padding, whose border tells a decoder where it is. Padding adds no weights, so both
    read the same checkpoints; a misspelt padding is refused by name."""
    from vvs.models.vq import VQModel, vq_config

    codes = torch.full((1, 16 * 16), 7)
    std = {}
    for padding in ("zeros", "reflect"):
        torch.manual_seed(0)
        vq = VQModel(vq_config("VQ-vvs-S", decoder_padding=padding)).eval()
        std[padding] = float(vq.decode_codes(codes, 16).std(dim=(2, 3)).max())
        keys = sorted(vq.state_dict())
    assert std["reflect"] < 1e-6 < 1e-3 < std["zeros"]
    assert keys == sorted(VQModel(vq_config("VQ-vvs-S", decoder_padding="zeros")).state_dict())
    assert vq_config("VQ-16").decoder_padding == "zeros"
    with pytest.raises(ValueError, match="decoder_padding must be 'zeros' or 'reflect', not 'reflection'"):
        vq_config("VQ-vvs-S", decoder_padding="reflection")


def test_the_speck_measure_sees_coloured_specks_in_a_corner_and_nothing_else():
    """``top_left_speck_ratio`` on smooth random images: about 1 as they are; far above 1 with single coloured
    pixels planted in the top-left 32 px; about 1 again when the same specks are planted in every corner, or when
    the planted pixels only differ in brightness (brightness is not colour)."""
    import torch.nn.functional as F

    from vvs.quality import top_left_speck_ratio

    gen = torch.Generator().manual_seed(0)
    smooth = F.interpolate(torch.rand(32, 3, 8, 8, generator=gen), size=128, mode="bicubic", align_corners=False)
    smooth = smooth.clamp(0, 1)
    rows, cols = torch.randint(0, 32, (2, 32, 12), generator=gen)
    idx = torch.arange(32)[:, None]

    def planted(image, corners, colour=None):
        out = image.clone()
        for r0, c0 in corners:
            r, c = r0 + rows, c0 + cols
            out[idx, :, r, c] = colour if colour is not None else out[idx, :, r, c] + 0.3
        return out

    red = torch.tensor([1.0, 0.0, 0.0])
    every = [(0, 0), (0, 96), (96, 0), (96, 96)]
    assert 0.8 < top_left_speck_ratio(smooth) < 1.25
    assert top_left_speck_ratio(planted(smooth, [(0, 0)], red)) > 3
    assert 0.8 < top_left_speck_ratio(planted(smooth, every, red)) < 1.25
    assert 0.8 < top_left_speck_ratio(planted(smooth, [(0, 0)])) < 1.25
