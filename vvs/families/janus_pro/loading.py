"""Strict loaders of Janus-Pro: the official Hugging Face folders (deepseek-ai/Janus-Pro-1B, -7B) and vvs files.

An official folder holds ``config.json`` (``model_type`` "multi_modality": a ``language_config`` for the Llama
language model, and ``gen_vision_config`` / ``gen_aligner_config`` / ``gen_head_config`` for the generation
path), the weights (``pytorch_model.bin`` or safetensors, either one file or shards listed by an index json),
and ``tokenizer.json``. The weights are read through the safe readers of :mod:`vvs.models.loading`; the
understanding path (``vision_model``, ``aligner``) and the text ``lm_head`` are recognised and left out, every
other key must be one the generation path has, with its shape.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from vvs.families.janus_pro.model import JanusConfig, JanusGen
from vvs.models.loading import CheckpointError, load_state, load_vvs_model, read_hf_weights
from vvs.models.vq import VQModel, vq_config

# keys of an official checkpoint that image generation does not use
UNUSED = ("vision_model.", "aligner.", "language_model.lm_head.")
VQ_PREFIX = "gen_vision_model."
# the special tokens a prompt is built from, by the names the official tokenizer gives them
SPECIAL_TOKENS = {"bos_id": "<｜begin▁of▁sentence｜>", "pad_id": "<｜▁pad▁｜>", "boi_id": "<begin_of_image>"}


def official_config(folder: Path, prompt_slots: int, grid_size: int = 24) -> tuple[JanusConfig, str]:
    """The :class:`JanusConfig` of an official folder (``prompt_slots``: the longest prompt it will take, in
    tokens; ``grid_size``: the code grid's side, 24 for the released 384 px) and the name of its VQ tokenizer."""
    path = folder / "config.json"
    try:
        data = json.loads(path.read_text())
        language = data["language_config"]
        head = data["gen_head_config"]["params"]
        aligner = data["gen_aligner_config"]["params"]
        aligner_kind = data["gen_aligner_config"].get("cls", "MlpProjector")
        vision = data["gen_vision_config"]
    except FileNotFoundError:
        raise CheckpointError(folder, "no config.json: give the folder of an official Janus-Pro checkpoint") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(path, f"not a Janus-Pro config (multi_modality with language_config and the gen_* "
                                    f"configs): {type(err).__name__} {err}") from None
    # LlamaConfig's defaults fill what language_config leaves out (the official 7B config sets only a few keys)
    llama = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "vocab_size": 32000, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
             "rope_scaling": None, "attention_bias": False, "mlp_bias": False, **language}
    problems = []
    heads = llama["num_attention_heads"]
    if llama.get("num_key_value_heads") not in (None, heads):
        problems.append(f"num_key_value_heads {llama['num_key_value_heads']} differs from {heads} attention heads")
    if llama["hidden_act"] != "silu" or llama["rope_scaling"] is not None or llama["attention_bias"] \
            or llama["mlp_bias"]:
        problems.append("the language model is not a plain Llama (silu, no rope_scaling, no biases)")
    if (aligner_kind, aligner.get("projector_type"), aligner.get("depth")) != ("MlpProjector", "mlp_gelu", 2):
        problems.append(f"gen_aligner is {aligner_kind} {aligner.get('projector_type')} depth {aligner.get('depth')}, "
                        "not MlpProjector mlp_gelu depth 2")
    if head.get("n_embed", llama["hidden_size"]) != llama["hidden_size"] or \
            aligner.get("n_embed", llama["hidden_size"]) != llama["hidden_size"]:
        problems.append("gen_head / gen_aligner n_embed differ from the language model's hidden_size")
    codes = vision.get("params", {}).get("image_token_size", head.get("image_token_size", 16384))
    if head.get("image_token_size", codes) != codes:
        problems.append(f"gen_head scores {head['image_token_size']} codes, gen_vision_config has {codes}")
    vq = vision.get("cls", "VQ-16")
    if vq != "VQ-16":
        problems.append(f"gen_vision_config cls {vq!r}: only VQ-16 (the released tokenizer) is supported")
    if problems:
        raise CheckpointError(path, "; ".join(problems))
    try:
        config = JanusConfig(
            dim=llama["hidden_size"], n_layer=llama["num_hidden_layers"], n_head=heads,
            ffn_hidden=llama["intermediate_size"], text_vocab_size=llama["vocab_size"], vocab_size=codes,
            code_dim=aligner.get("input_dim", 8), head_hidden=head.get("image_token_embed"),
            norm_eps=llama["rms_norm_eps"], rope_base=llama["rope_theta"], cls_token_num=prompt_slots, grid_size=grid_size,
            **special_token_ids(folder, llama["vocab_size"]))
    except (TypeError, ValueError) as err:
        raise CheckpointError(path, f"unusable sizes: {err}") from None
    return config, vq


def special_token_ids(folder: Path, vocab: int) -> dict[str, int]:
    """``bos_id``, ``pad_id``, ``boi_id`` as the folder's ``tokenizer.json`` numbers them."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises its own exception types
        raise CheckpointError(path, f"not a readable tokenizer.json ({err}); the official folder carries one") from None
    ids = {field: tokenizer.token_to_id(name) for field, name in SPECIAL_TOKENS.items()}
    missing = [SPECIAL_TOKENS[f] for f, i in ids.items() if i is None or not 0 <= i < vocab]
    if missing:
        raise CheckpointError(path, f"lacks the special token(s) {', '.join(missing)} (or numbers them beyond the "
                                    f"{vocab}-token vocabulary): not Janus-Pro's tokenizer")
    return ids


def load_official(folder, prompt_slots: int = 64, grid_size: int = 24) -> tuple[JanusGen, VQModel]:
    """The generation path of an official Janus-Pro folder: the target and its VQ-16 tokenizer, in float32.
    ``grid_size``: 24, the official script's 576 codes (384 px); tests use smaller grids."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(folder, "not a folder: give the folder of an official Janus-Pro checkpoint "
                                      "(config.json, weights, tokenizer.json)")
    config, vq_name = official_config(folder, prompt_slots, grid_size)
    state = read_hf_weights(folder)
    vq_state = {k.removeprefix(VQ_PREFIX): v for k, v in state.items() if k.startswith(VQ_PREFIX)}
    target_state = {k: v for k, v in state.items() if not k.startswith((VQ_PREFIX, *UNUSED))}
    target = JanusGen(config)
    load_state(target, {k: v.float() for k, v in target_state.items()}, folder, _hint(target_state, config))
    vq = VQModel(vq_config(vq_name, codebook_size=config.vocab_size, codebook_embed_dim=config.code_dim))
    load_state(vq, {k: v.float() for k, v in vq_state.items()}, folder,
               f"the {VQ_PREFIX[:-1]} weights should be {vq_name}'s")
    return target.eval(), vq.eval()


def _hint(state: dict[str, torch.Tensor], config: JanusConfig) -> str:
    emb = state.get("language_model.model.embed_tokens.weight")
    if emb is None:
        return "is this an official Janus-Pro checkpoint?"
    layers = len({k.split(".")[3] for k in state if k.startswith("language_model.model.layers.")})
    return (f"the weights hold {layers} layers of width {emb.shape[1]} over {emb.shape[0]} text tokens; config.json "
            f"says {config.n_layer} of {config.dim} over {config.text_vocab_size}")


def load_janus(path, config: JanusConfig | None = None) -> JanusGen:
    """A Janus target from a vvs safetensors file (config inside)."""
    return load_vvs_model(path, "janus", JanusConfig, JanusGen, config, label="Janus",
                          instead="give an official folder instead")
