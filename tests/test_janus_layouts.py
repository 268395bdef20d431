"""Janus-Pro's two checkpoint layouts: deepseek-ai's folders (``multi_modality``) and transformers' conversion of
them (``janus``, ``JanusForConditionalGeneration``) load to the same target and VQ model.

The transformers folder is written by transformers itself (``save_pretrained`` of a tiny random
``JanusForConditionalGeneration`` whose VQ model has the released VQ-16's architecture, the one deepseek-ai's layout
holds); the deepseek-ai folder holds the same weights under deepseek-ai's names, with LlamaGen's VQ names."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.janus_reference import (BOI, BOS, DIM, FFN, GRID, HEADS, LAYERS, PAD, TEXT_VOCAB, official_config,
                                   official_state, tokenizer)
from vvs.families.janus_pro.loading import load_official
from vvs.families.janus_pro.prompts import PromptIds
from vvs.models.loading import CheckpointError
from vvs.models.vq import vq_config

TOL = 1e-5
SLOTS = 16
PROMPTS = ["a red cat on the hill", "a big dog", "a photo of a small green tree at night"]


def hf_janus(seed: int = 0, **vq):
    """A random ``JanusForConditionalGeneration``: tests/janus_reference.py's tiny sizes, its VQ model
    JanusVQVAEConfig's (the released VQ-16) unless ``vq`` says otherwise."""
    from transformers import JanusConfig, JanusForConditionalGeneration, LlamaConfig
    from transformers.models.janus.configuration_janus import JanusVisionConfig, JanusVQVAEConfig

    text = LlamaConfig(hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                       vocab_size=TEXT_VOCAB, rms_norm_eps=1e-6, max_position_embeddings=256, bos_token_id=BOS,
                       pad_token_id=PAD, eos_token_id=5)
    vision = JanusVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                               image_size=64, patch_size=64 // GRID, projection_dim=DIM, num_image_tokens=GRID * GRID)
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(JanusConfig(
        text_config=text, vision_config=vision, image_token_id=4,
        vq_config=JanusVQVAEConfig(embed_dim=8, projection_dim=DIM, image_token_embed_dim=DIM, **vq))).eval()
    with torch.no_grad():  # transformers zero-initialises biases and norms: random ones show they are loaded and used
        for name, p in model.named_parameters():
            if "generation_" in name or "vqmodel" in name:
                if name.endswith(".bias"):
                    p.normal_(0, 0.05)
                elif p.dim() == 1:
                    p.normal_(1, 0.05)
    model.generation_config.generation_kwargs = {"boi_token_id": BOI}
    return model


def llamagen_vq_name(name: str) -> str:
    """A key of transformers' VQ model (taming's names) by LlamaGen's, as deepseek-ai's checkpoints name it."""
    for old, new in ((r"^encoder\.down\.(\d+)\.block\.", r"encoder.conv_blocks.\1.res."),
                     (r"^decoder\.up\.(\d+)\.block\.", r"decoder.conv_blocks.\1.res."),
                     (r"^(encoder)\.down\.|^(decoder)\.up\.", r"\1\2.conv_blocks."),
                     (r"\.mid\.block_1\.", ".mid.0."), (r"\.mid\.attn_1\.", ".mid.1."),
                     (r"\.mid\.block_2\.", ".mid.2.")):
        name = re.sub(old, new, name)
    return name


def write_deepseek_folder(model, folder):
    """``model``'s weights as deepseek-ai's folder: one safetensors file, its VQ by LlamaGen's names with the
    codebook-usage counter its checkpoints carry."""
    folder.mkdir()
    state = official_state(model)
    state.update({f"gen_vision_model.{llamagen_vq_name(k.removeprefix('model.vqmodel.'))}": v.detach().clone()
                  for k, v in model.state_dict().items() if k.startswith("model.vqmodel.")})
    state["gen_vision_model.quantize.codebook_used"] = torch.zeros(65536)
    save_file(state, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(official_config()))
    tokenizer().save(str(folder / "tokenizer.json"))
    return folder


def write_transformers_folder(model, folder, **save):
    model.save_pretrained(folder, **save)
    tokenizer().save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def reference():
    return hf_janus()


@pytest.fixture(scope="module")
def layouts(reference, tmp_path_factory):
    """Each layout's folder and what vvs loads from it (prompts of up to 16 tokens, a GRID x GRID image). Building
    and writing a VQ-16 twice takes seconds: the tests that use this are marked slow."""
    root = tmp_path_factory.mktemp("janus-layouts")
    folders = {"deepseek-ai": write_deepseek_folder(reference, root / "Janus-Pro-tiny"),
               "transformers": write_transformers_folder(reference, root / "Janus-Pro-tiny-hf",
                                                         max_shard_size="100MB")}
    return {name: (folder, *load_official(folder, prompt_slots=SLOTS, grid_size=GRID))
            for name, folder in folders.items()}


@pytest.mark.slow
def test_both_layouts_load_to_the_same_weights(layouts):
    (_, target, vq), (folder, hf_target, hf_vq) = layouts["deepseek-ai"], layouts["transformers"]
    assert len(list(folder.glob("model-*.safetensors"))) > 1  # shards through transformers' index
    assert hf_target.config == target.config and hf_vq.config == vq.config
    assert vq.config == vq_config("VQ-16", codebook_show_usage=False)
    assert (target.config.bos_id, target.config.pad_id, target.config.boi_id) == (BOS, PAD, BOI)
    for ours, theirs in ((target, hf_target), (vq, hf_vq)):
        a, b = ours.state_dict(), theirs.state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:3]


@pytest.mark.slow
@torch.no_grad()
def test_a_transformers_folder_computes_transformers_generation_path(reference, layouts):
    """The target loaded from transformers' folder against ``JanusForConditionalGeneration``: the logits of a prompt
    and the image codes after it (embedded by its ``prepare_embeddings_for_image_generation``, scored by its
    ``generation_head``), and the VQ's pixels of a code grid."""
    folder, target, vq = layouts["transformers"]
    builder = PromptIds.from_file(folder / "tokenizer.json", target.config)
    ids = torch.tensor([builder.ids(PROMPTS[0])])
    codes = torch.randint(0, target.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(1))
    ours = target.teacher_forced(ids, codes)
    embeds = torch.cat([reference.get_input_embeddings()(ids),
                        reference.prepare_embeddings_for_image_generation(codes)], dim=1)
    hidden = reference.model.language_model(inputs_embeds=embeds).last_hidden_state
    torch.testing.assert_close(ours.logits, reference.model.generation_head(hidden), atol=TOL, rtol=0)
    grid = torch.randint(0, target.config.vocab_size, (1, GRID * GRID), generator=torch.Generator().manual_seed(2))
    pixels = reference.model.vqmodel.decode(grid)
    torch.testing.assert_close(vq.decode(vq.embed_codes(grid, GRID)), pixels, atol=1e-4 * float(pixels.abs().max()),
                               rtol=1e-4)


@pytest.mark.slow
@torch.no_grad()
def test_greedy_ar_tokens_are_the_same_from_either_layout(reference, layouts):
    """vvs's ar (guidance 5, a left-padded batch of three prompt lengths) gives the same tokens from both folders,
    and transformers' ``generate(..., generation_mode="image")`` gives them too."""
    from vvs.discrete.bundle import ModelBundle
    from vvs.discrete.engines import torch_engines
    from vvs.runtime.options import DecodeOptions
    from vvs.runtime.pipeline import Pipeline

    tokens = {}
    for name, (folder, target, vq) in layouts.items():
        bundle = ModelBundle(target, None, vq, "janus-pro", folder / "tokenizer.json")
        pipe = Pipeline(torch_engines(bundle), DecodeOptions(mode="ar", temperature=0.0, top_k=0, top_p=1.0,
                                                             cfg_scale=5.0))
        tokens[name] = pipe.generate(PROMPTS, decode_images=False).tokens
    assert torch.equal(tokens["deepseek-ai"], tokens["transformers"])
    builder = PromptIds.from_file(layouts["transformers"][0] / "tokenizer.json", layouts["transformers"][1].config)
    for prompt, row in zip(PROMPTS, tokens["transformers"]):
        ids = torch.tensor([builder.ids(prompt)])
        expected = reference.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                                      do_sample=False, guidance_scale=5.0)
        assert row.tolist() == expected[0].tolist(), prompt


def _edit_weights(folder, edit):
    path = folder / "model.safetensors"
    state = load_file(path)
    edit(state)
    save_file(state, path)


def _edit_json(folder, name, edit):
    path = folder / name
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_a_broken_transformers_folder_is_a_one_line_error(tmp_path):
    """A small VQ model (its sizes from vq_config), then one fault at a time: a missing, misshapen or foreign key, a
    config vvs cannot run or that lacks vq_config, ids the generation config and tokenizer disagree on."""
    model = hf_janus(seed=1, base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1, latent_channels=32)
    good = write_transformers_folder(model, tmp_path / "good")
    target, vq = load_official(good, prompt_slots=SLOTS, grid_size=GRID)
    assert (vq.config.base_channels, vq.config.decoder_ch_mult, vq.config.z_channels) == (32, (1, 2), 32)
    assert torch.equal(vq.decoder.conv_blocks[0].res[1].conv2.weight,
                       model.model.vqmodel.decoder.up[0].block[1].conv2.weight)
    assert torch.equal(target.gen_aligner.layers[2].bias, model.model.generation_aligner.hidden_layers[0].bias)
    faults = [
        ("missing", lambda f: _edit_weights(f, lambda s: s.pop("model.generation_head.vision_head.bias")),
         "missing 1 key(s) (gen_head.vision_head.bias)"),
        ("shape", lambda f: _edit_weights(f, lambda s: s.update({"model.vqmodel.decoder.mid.block_1.conv1.weight":
                                                                torch.zeros(3, 3)})),
         "wrong shape, e.g. decoder.mid.0.conv1.weight"),
        ("unknown", lambda f: _edit_weights(f, lambda s: s.update({"model.extra.weight": torch.zeros(2)})),
         "1 unexpected key(s) (model.extra.weight): not keys of transformers' Janus model"),
        ("deepseek key", lambda f: _edit_weights(f, lambda s: s.update({"gen_head.vision_head.bias": torch.zeros(2)})),
         "unexpected key(s) (gen_head.vision_head.bias)"),
        ("model type", lambda f: _edit_json(f, "config.json", lambda d: d.update(model_type="llama")),
         "model_type 'llama' is not a Janus-Pro layout"),
        ("no vq_config", lambda f: _edit_json(f, "config.json", lambda d: d.pop("vq_config")),
         "not a Janus-Pro config (janus with text_config and vq_config): KeyError 'vq_config'"),
        ("aligner", lambda f: _edit_json(f, "config.json", lambda d: d["vq_config"].update(hidden_act="silu")),
         "vq_config gives the generation aligner 2 layers and 'silu', not 2 and 'gelu'"),
        ("grouped attention", lambda f: _edit_json(f, "config.json", lambda d: d["text_config"].update(
            num_key_value_heads=2)), "num_key_value_heads 2 differs from 4 attention heads"),
        ("boi", lambda f: _edit_json(f, "generation_config.json", lambda d: d["generation_kwargs"].update(
            boi_token_id=7)), "boi_token_id 7 (tokenizer.json: 3 for <begin_of_image>)"),
    ]
    for fault, edit, expected in faults:
        broken = tmp_path / fault.replace(" ", "-")
        shutil.copytree(good, broken)
        edit(broken)
        with pytest.raises(CheckpointError) as err:
            load_official(broken, prompt_slots=SLOTS, grid_size=GRID)
        message = str(err.value)
        assert expected in message and str(broken) in message and "\n" not in message, (fault, message)
