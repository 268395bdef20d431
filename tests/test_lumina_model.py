"""Lumina-mGPT's target against transformers' ``ChameleonForConditionalGeneration`` (the reference implementation of
the Chameleon architecture), and the strict loader of official folders.

The reference is a tiny random Chameleon with Chameleon's real vocabulary layout (image ids 4..8195 named
``IMGIMG...``, the special ids where the official tokenizer puts them) in a 9,000-id vocabulary, saved by
transformers itself as sharded safetensors with an index: the format of the official folders. Lumina-mGPT's
folders store one query/key norm row per model-parallel shard (``[1, head_dim]``) where transformers stores one per
head; both load. Logits are compared on the ids the image stream takes (image ids and end-of-line), for a prefill
of a prompt and for cached steps, within 1e-5.
"""
import json

import pytest
import torch

from vvs.families.lumina_mgpt.loading import image_codes, load_official
from vvs.models.loading import CheckpointError

from tests.lumina_reference import GRID, HEADS, hf_chameleon, rewrite, vocabulary, write_official_folder


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """transformers' layout (``Anole-7b``: a norm row per head, the VQGAN encoder inside) and Lumina-mGPT's (one
    row, no VQGAN), each with the reference model that computes it."""
    root = tmp_path_factory.mktemp("chameleon")
    out = {}
    for name, per_head in (("Anole-7b", True), ("Lumina-mGPT-7B-512", False)):
        model = hf_chameleon(per_head)
        out[name] = (write_official_folder(model, root / name, lumina_layout=not per_head), model)
    return out


def reference_logits(hf, prompt: torch.Tensor, steps: list[torch.Tensor]) -> list[torch.Tensor]:
    """Hidden states through transformers' decoder with its own cache, then its lm_head (its forward masks image
    ids to the dtype's minimum for text generation, which is not what is compared here)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    outs = []
    with torch.no_grad():
        for ids in [prompt, *steps]:
            hidden = hf.model(input_ids=ids, past_key_values=cache, use_cache=True).last_hidden_state
            outs.append(hf.lm_head(hidden))
    return outs


def vvs_logits(target, prompt: torch.Tensor, steps: list[torch.Tensor]) -> list[torch.Tensor]:
    from vvs.models.layers import causal_mask

    c = prompt.shape[1]
    with torch.no_grad():
        out = target(condition=prompt, position_ids=torch.arange(c)[None], mask=causal_mask(c))
        outs, past, pos = [out.logits], out.new_kv, c
        for ids in steps:
            t = ids.shape[1]
            mask = torch.cat([torch.ones(1, 1, t, pos, dtype=torch.bool), causal_mask(t)], -1)
            stream = ids - target.config.first_code_id
            stream[ids == target.config.eol_id] = target.config.eol
            out = target(tokens=stream, position_ids=torch.arange(pos, pos + t)[None], mask=mask, past_kv=past)
            outs.append(out.logits)
            past, pos = torch.cat([past, out.new_kv], 4), pos + t
    return outs


@pytest.mark.parametrize("name", ["Anole-7b", "Lumina-mGPT-7B-512"])
def test_logits_match_transformers_chameleon(hf_folders, name):
    folder, hf = hf_folders[name]
    target, _ = load_official(folder, prompt_slots=12, grid_size=GRID)
    assert target.config.qk_norm_groups == (HEADS if name == "Anole-7b" else 1)
    prompt = torch.tensor([[1, 8900, 8901, 8950, 8710, 8197, 8805, 8805] + [8960, 8961, 8962, 8963]])
    steps = [torch.tensor([[4 + 17]]), torch.tensor([[4 + 8000, 8803, 4 + 5]]), torch.tensor([[4 + 1]])]
    ours = vvs_logits(target, prompt, steps)
    theirs = reference_logits(hf, prompt, steps)
    ids = torch.tensor(target.config.stream_ids)
    for mine, ref in zip(ours, theirs):
        want = ref[..., ids]
        assert (mine - want).abs().max() <= 1e-5 * want.abs().max(), (mine - want).abs().max()
    # the query/key norms matter: the same weights without them (Llama's attention) differ by far more
    for layer in target.model.layers:
        layer.self_attn.q_norm = layer.self_attn.k_norm = torch.nn.Identity()
    broken = vvs_logits(target, prompt, steps)[0]
    assert (broken - theirs[0][..., ids]).abs().max() > 1e-3 * theirs[0].abs().max()


def test_the_vocabulary_names_each_image_id_its_code():
    assert image_codes(vocabulary(), 4, 8192) == list(range(8191, -1, -1))
    assert image_codes(vocabulary(codes_reversed=False), 4, 8192) == list(range(8192))
    broken = vocabulary()
    broken.pop("IMGIMGAZ")  # code 0's name
    assert image_codes(broken, 4, 8192) is None


def test_special_ids_come_from_the_vocabulary(hf_folders):
    target, codes = load_official(hf_folders["Anole-7b"][0], prompt_slots=12, grid_size=GRID)
    c = target.config
    assert (c.bos_id, c.pad_id, c.sep_id, c.boi_id, c.eoi_id, c.eol_id, c.size_base) == \
        (1, 3, 8710, 8197, 8196, 8803, 8804)
    assert c.size_token(GRID) == 8806 and codes[0] == 8191


@pytest.mark.parametrize("damage, message", [
    (lambda k, v: (k + "_renamed", v) if k.endswith("layers.0.self_attn.q_proj.weight") else v,
     r"missing 1 key\(s\) \(model.layers.0.self_attn.q_proj.weight\); 1 unexpected key"),
    (lambda k, v: v[:, :-1].clone() if k.endswith("layers.1.mlp.down_proj.weight") else v,
     r"1 tensor\(s\) have the wrong shape, e.g. model.layers.1.mlp.down_proj.weight: "
     r"file \[64, 95\] vs model \[64, 96\]"),
    (lambda k, v: v[:-1].clone() if k == "lm_head.weight" else v,
     r"lm_head.weight is \[8999, 64\], config.json says \[9000, 64\]"),
    (lambda k, v: v.expand(2, -1).clone() if k.endswith("layers.0.self_attn.q_norm.weight") else v,
     r"wrong shape"),
])
def test_a_damaged_folder_is_refused_in_one_line(hf_folders, tmp_path, damage, message):
    import shutil

    folder = tmp_path / "Lumina-mGPT-7B-512"
    shutil.copytree(hf_folders["Lumina-mGPT-7B-512"][0], folder)
    rewrite(folder, damage)
    with pytest.raises(CheckpointError, match=message) as err:
        load_official(folder, prompt_slots=12, grid_size=GRID)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(hidden_size=128), r"wrong shape.*config.json says 2 of 128"),
    (lambda c: c["vocabulary_map"].pop("<racm3:break>"), r"lacks <racm3:break>: not Chameleon's vocabulary"),
    (lambda c: c["vocabulary_map"].pop("IMGIMGAZ"), r"does not name ids 4..8195 as the 8192 image codes"),
    (lambda c: c.update(model_type="llama"), r"model_type 'llama' is not 'chameleon'"),
    (lambda c: c.update(swin_norm=True), r"not Lumina-mGPT's \(silu, no rope_scaling, no biases, pre-norm"),
])
def test_a_wrong_config_is_refused_in_one_line(hf_folders, tmp_path, edit, message):
    import shutil

    folder = tmp_path / "Anole-7b"
    shutil.copytree(hf_folders["Anole-7b"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message) as err:
        load_official(folder, prompt_slots=12, grid_size=GRID)
    assert "\n" not in str(err.value)


def test_the_resolution_comes_from_the_folder_name(hf_folders, tmp_path):
    import shutil

    target, _ = load_official(hf_folders["Lumina-mGPT-7B-512"][0], prompt_slots=12)
    assert target.config.grid_size == 32 and target.config.num_image_tokens == 32 * 33
    shutil.copytree(hf_folders["Anole-7b"][0], tmp_path / "anole")
    with pytest.raises(CheckpointError, match="does not say its resolution .* give --resolution"):
        load_official(tmp_path / "anole", prompt_slots=12)
