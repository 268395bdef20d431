"""Janus-Pro's generation path: numeric parity with transformers' ``JanusForConditionalGeneration`` (the reference
implementation), strict loading of official folders, and prompts as the official script builds them."""
from __future__ import annotations

import pytest
import torch

from tests.janus_reference import BOI, BOS, GRID, PAD, hf_janus, write_official_folder
from vvs.families.janus.loading import load_official
from vvs.families.janus.prompts import PromptIds, conversation, null_ids
from vvs.models.layers import causal_mask
from vvs.models.loading import CheckpointError

TOL = 1e-5


@pytest.fixture(scope="module")
def reference():
    return hf_janus()


@pytest.fixture(scope="module")
def official(reference, tmp_path_factory):
    """The reference's weights as an official folder, and what vvs loads from it (prompts of up to 12 tokens)."""
    folder = write_official_folder(reference, tmp_path_factory.mktemp("janus") / "Janus-Pro-tiny")
    target, vq = load_official(folder, prompt_slots=12)
    return folder, target, vq


def prompt_ids(folder, target, text="a red cat on the hill"):
    return PromptIds.from_file(folder / "tokenizer.json", target.config).ids(text)


@torch.no_grad()
def test_logits_match_transformers_for_a_prefill_and_cached_steps(reference, official):
    folder, target, _ = official
    ids = torch.tensor([prompt_ids(folder, target), prompt_ids(folder, target, "a blue dog at the river")])
    c = ids.shape[1]
    lm = reference.model.language_model
    ref = lm(input_ids=ids, use_cache=True)
    ref_logits = reference.model.generation_head(ref.last_hidden_state)
    ours = target(condition=ids, position_ids=torch.arange(c).expand(2, -1), mask=causal_mask(c))
    torch.testing.assert_close(ours.logits, ref_logits, atol=TOL, rtol=0)
    torch.testing.assert_close(ours.hidden, ref.last_hidden_state, atol=TOL, rtol=0)
    # cached decode steps: codes go in through gen_embed -> gen_aligner, a step of one and a step of three
    cache, kv = ref.past_key_values, ours.new_kv
    codes = torch.randint(0, target.config.vocab_size, (2, 4), generator=torch.Generator().manual_seed(1))
    for start, stop in ((0, 1), (1, 4)):
        step_codes = codes[:, start:stop]
        embeds = reference.prepare_embeddings_for_image_generation(step_codes)
        positions = torch.arange(c + start, c + stop).expand(2, -1)
        ref = lm(inputs_embeds=embeds, past_key_values=cache, position_ids=positions, use_cache=True)
        cache = ref.past_key_values
        t = stop - start
        mask = torch.ones(1, 1, t, c + stop, dtype=torch.bool)
        mask[..., c + start:] = causal_mask(t)
        ours = target(tokens=step_codes, position_ids=positions, mask=mask, past_kv=kv)
        kv = torch.cat([kv, ours.new_kv], dim=4)
        torch.testing.assert_close(ours.logits, reference.model.generation_head(ref.last_hidden_state),
                                   atol=TOL, rtol=0)


def test_official_folder_loads_strictly(reference, official, tmp_path):
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    folder, target, vq = official
    assert target.config.vocab_size == 16384 and vq.config.codebook_size == 16384
    assert (target.config.bos_id, target.config.pad_id, target.config.boi_id) == (BOS, PAD, BOI)
    stored = {k: v for shard in folder.glob("model-*.safetensors") for k, v in load_file(shard).items()}
    assert torch.equal(vq.quantize.embedding.weight, stored["gen_vision_model.quantize.embedding.weight"])
    assert torch.equal(target.gen_head.vision_head.bias, stored["gen_head.vision_head.bias"])
    # a key the generation path does not have, a missing key, a wrong shape: one line each, naming the folder
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    shard = sorted(broken.glob("model-*.safetensors"))[0]
    state = load_file(shard)
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    key = next(k for k in state if k.startswith("gen_head."))
    for change, expected in (("extra", "unexpected key"), ("missing", "missing 1 key"), ("shape", "wrong shape")):
        edited = dict(state)
        if change == "extra":
            edited["gen_head.extra.weight"] = torch.zeros(2)
        elif change == "missing":
            del edited[key]
        else:
            edited[key] = torch.zeros(3, 3)
        save_file(edited, shard)
        with pytest.raises(CheckpointError) as err:
            load_official(broken, prompt_slots=12)
        message = str(err.value)
        assert expected in message and str(broken) in message and "\n" not in message, message
    save_file(state, shard)
    del index["weight_map"]
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="weight_map"):
        load_official(broken, prompt_slots=12)


def test_prompt_is_the_official_conversation_and_the_null_keeps_bos_and_image_start(official):
    folder, target, _ = official
    assert conversation("a red cat") == "<|User|>: a red cat\n\n<|Assistant|>:<begin_of_image>"
    builder = PromptIds.from_file(folder / "tokenizer.json", target.config)
    ids, mask = builder.encode(["a red cat", "a big dog on the hill"])
    short = builder.ids("a red cat")
    assert short[0] == BOS and short[-1] == BOI and short.count(BOS) == 1
    assert ids[0, -len(short):].tolist() == short and not mask[0, : -len(short)].any() and mask[0, -len(short):].all()
    assert (ids[0, : -len(short)] == PAD).all()
    null = null_ids(ids, PAD)
    for row, length in ((0, len(short)), (1, int(mask[1].sum()))):
        first = ids.shape[1] - length
        assert null[row, first] == BOS and null[row, -1] == BOI
        assert (null[row, first + 1: -1] == PAD).all() and (null[row, :first] == PAD).all()
    with pytest.raises(Exception, match="at most 12"):
        builder.encode(["a photo of a small red cat on the big hill at night on a sunny day"])
