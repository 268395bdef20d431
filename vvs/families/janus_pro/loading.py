"""Strict loaders of Janus-Pro: official Hugging Face folders in either of their two layouts, and vvs files.

Both layouts of a checkpoint load to the same target and VQ tokenizer (the released checkpoints' VQ-16).
``config.json``'s ``model_type`` says which one a folder holds:

- ``multi_modality``: deepseek-ai's own folders (deepseek-ai/Janus-Pro-1B, -7B). A ``language_config`` for the
  Llama language model and ``gen_vision_config`` / ``gen_aligner_config`` / ``gen_head_config`` for the generation
  path; keys ``language_model.model.*``, ``gen_embed.*``, ``gen_aligner.*``, ``gen_head.*``, and the VQ under
  ``gen_vision_model.*`` in LlamaGen's names, which vvs's model keeps.
- ``janus``: transformers' conversion of them (deepseek-community/Janus-Pro-1B, -7B, ``JanusForConditionalGeneration``).
  A ``text_config`` (a LlamaConfig) and a ``vq_config`` that sizes the VQ model and the generation embeddings,
  aligner and head; keys ``model.language_model.*``, ``model.generation_{embeddings,aligner,head}.*``, and the VQ
  under ``model.vqmodel.*`` in taming's names (``down``/``up`` levels of ``block``s, ``mid.block_1``). These keys are
  renamed to deepseek-ai's before loading, so both layouts meet the same strict checks.

A config leaves out what equals its class's defaults (transformers writes only the differences, deepseek-ai's 7B
config sets a few keys): those defaults fill in. The weights are one file or shards listed by an index json,
safetensors or ``pytorch_model.bin``, read through the safe readers of :mod:`vvs.models.loading`; the folder's
``tokenizer.json`` numbers the special tokens. The understanding path (the SigLIP tower and its aligner), the text
``lm_head`` and the VQ's codebook-usage counter are recognised and left out; every other key must be one the
generation path has, with its shape.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from vvs.families.janus_pro.model import JanusConfig, JanusGen
from vvs.models.loading import CheckpointError, check_config_values, load_state, load_vvs_model, read_hf_weights
from vvs.models.vq import VQConfig, VQModel, vq_config

# keys of a deepseek-ai checkpoint that image generation does not use (the usage counter is a training statistic,
# which transformers' conversion drops)
UNUSED = ("vision_model.", "aligner.", "language_model.lm_head.", "gen_vision_model.quantize.codebook_used")
VQ_PREFIX = "gen_vision_model."
# the special tokens a prompt is built from, by the names the official tokenizer gives them
SPECIAL_TOKENS = {"bos_id": "<｜begin▁of▁sentence｜>", "pad_id": "<｜▁pad▁｜>", "boi_id": "<begin_of_image>"}
# what transformers' image generation reads from generation_config.json for the same three ids
GENERATION_CONFIG_IDS = {"bos_id": "bos_token_id", "pad_id": "pad_token_id", "boi_id": "boi_token_id"}
LAYOUTS = ("multi_modality", "janus")  # config.json's model_type: deepseek-ai's layout, transformers'
# LlamaConfig's defaults, for what language_config / text_config leave out
LLAMA_DEFAULTS = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
                  "vocab_size": 32000, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
                  "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "head_dim": None,
                  "num_key_value_heads": None}
# JanusVQVAEConfig's defaults (the released VQ-16), for what vq_config leaves out
# the language model's sizes and constants, each checked before any arithmetic on it
LLAMA_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
               "head_dim", "num_key_value_heads")
LLAMA_NUMBERS = ("rms_norm_eps", "rope_theta")
VQ_SIZES = ("codebook_size", "codebook_embed_dim", "base_channels", "z_channels", "num_res_blocks")
JANUS_VQ_DEFAULTS = {"embed_dim": 8, "num_embeddings": 16384, "double_latent": False, "latent_channels": 256,
                     "in_channels": 3, "out_channels": 3, "base_channels": 128, "channel_multiplier": [1, 1, 2, 2, 4],
                     "num_res_blocks": 2, "projection_dim": 2048, "num_hidden_layers": 2, "hidden_act": "gelu",
                     "image_token_embed_dim": 2048}
# transformers' key prefixes -> deepseek-ai's
TRANSFORMERS_PREFIXES = (
    ("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."),
    ("model.generation_embeddings.", "gen_embed."), ("model.generation_aligner.fc1.", "gen_aligner.layers.0."),
    ("model.generation_aligner.hidden_layers.0.", "gen_aligner.layers.2."),
    ("model.generation_head.proj_out.", "gen_head.output_mlp_projector."),
    ("model.generation_head.vision_head.", "gen_head.vision_head."),
    ("model.vision_model.", "vision_model."), ("model.aligner.", "aligner."), ("model.vqmodel.", VQ_PREFIX))
# transformers' VQ (taming's names) -> LlamaGen's, within the VQ model; applied in order
VQ_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"^encoder\.down\.(\d+)\.block\.", r"encoder.conv_blocks.\1.res."),
    (r"^encoder\.down\.(\d+)\.", r"encoder.conv_blocks.\1."),
    (r"^decoder\.up\.(\d+)\.block\.", r"decoder.conv_blocks.\1.res."),
    (r"^decoder\.up\.(\d+)\.", r"decoder.conv_blocks.\1."),
    (r"^(encoder|decoder)\.mid\.block_1\.", r"\1.mid.0."),
    (r"^(encoder|decoder)\.mid\.attn_1\.", r"\1.mid.1."),
    (r"^(encoder|decoder)\.mid\.block_2\.", r"\1.mid.2.")))


def _read_config(folder: Path) -> tuple[Path, dict, str]:
    """config.json, its contents, and the layout it names (one of :data:`LAYOUTS`)."""
    path = folder / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(folder, "no config.json: give the folder of a Janus-Pro checkpoint (deepseek-ai's or "
                                      "transformers' layout)") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(path, f"not a readable config.json: {err}") from None
    layout = data.get("model_type") if isinstance(data, dict) else None
    if layout not in LAYOUTS:
        raise CheckpointError(path, f"model_type {layout!r} is not a Janus-Pro layout: give deepseek-ai's folder "
                                    "(multi_modality) or transformers' (janus)")
    return path, data, layout


def official_config(folder: Path, prompt_slots: int, grid_size: int = 24) -> tuple[JanusConfig, VQConfig]:
    """The :class:`JanusConfig` of an official folder of either layout (``prompt_slots``: the longest prompt it
    will take, in tokens; ``grid_size``: the code grid's side, 24 for the released 384 px) and its VQ's config."""
    path, data, layout = _read_config(folder)
    try:
        llama, sizes, vq, problems = (_deepseek_sizes if layout == "multi_modality" else _transformers_sizes)(data)
    except (KeyError, TypeError, AttributeError) as err:
        expected = ("language_config and the gen_* configs" if layout == "multi_modality"
                    else "text_config and vq_config")
        raise CheckpointError(path, f"not a Janus-Pro config ({layout} with {expected}): "
                                    f"{type(err).__name__} {err}") from None
    check_config_values(path, llama, LLAMA_SIZES, LLAMA_NUMBERS)
    check_config_values(path, sizes, tuple(sizes))
    check_config_values(path, vars(vq), VQ_SIZES)
    heads = llama["num_attention_heads"]
    if llama["num_key_value_heads"] not in (None, heads):
        problems.append(f"num_key_value_heads {llama['num_key_value_heads']} differs from {heads} attention heads")
    if llama["head_dim"] not in (None, llama["hidden_size"] // heads):
        problems.append(f"head_dim {llama['head_dim']} is not hidden_size / num_attention_heads")
    if llama["hidden_act"] != "silu" or llama["rope_scaling"] is not None or llama["attention_bias"] \
            or llama["mlp_bias"]:
        problems.append("the language model is not a plain Llama (silu, no rope_scaling, no biases)")
    if problems:
        raise CheckpointError(path, "; ".join(problems))
    try:
        config = JanusConfig(
            dim=llama["hidden_size"], n_layer=llama["num_hidden_layers"], n_head=heads,
            ffn_hidden=llama["intermediate_size"], text_vocab_size=llama["vocab_size"], **sizes,
            norm_eps=llama["rms_norm_eps"], rope_base=llama["rope_theta"], cls_token_num=prompt_slots,
            grid_size=grid_size, **special_token_ids(folder, llama["vocab_size"]))
    except (TypeError, ValueError) as err:
        raise CheckpointError(path, f"unusable sizes: {err}") from None
    return config, vq


def _deepseek_sizes(data: dict) -> tuple[dict, dict, VQConfig, list[str]]:
    """deepseek-ai's config: the language model's LlamaConfig, the generation path's sizes (JanusConfig fields),
    the VQ's config, and what vvs cannot run."""
    llama = {**LLAMA_DEFAULTS, **data["language_config"]}
    head = data["gen_head_config"]["params"]
    aligner = data["gen_aligner_config"]["params"]
    aligner_kind = data["gen_aligner_config"].get("cls", "MlpProjector")
    vision = data["gen_vision_config"]
    dim = llama["hidden_size"]
    problems = []
    if (aligner_kind, aligner.get("projector_type"), aligner.get("depth")) != ("MlpProjector", "mlp_gelu", 2):
        problems.append(f"gen_aligner is {aligner_kind} {aligner.get('projector_type')} depth {aligner.get('depth')}, "
                        "not MlpProjector mlp_gelu depth 2")
    if head.get("n_embed", dim) != dim or aligner.get("n_embed", dim) != dim:
        problems.append("gen_head / gen_aligner n_embed differ from the language model's hidden_size")
    codes = vision.get("params", {}).get("image_token_size", head.get("image_token_size", 16384))
    if head.get("image_token_size", codes) != codes:
        problems.append(f"gen_head scores {head['image_token_size']} codes, gen_vision_config has {codes}")
    name = vision.get("cls", "VQ-16")
    if name != "VQ-16":
        problems.append(f"gen_vision_config cls {name!r}: only VQ-16 (the released tokenizer) is supported")
    code_dim = aligner.get("input_dim", 8)
    vq = vq_config("VQ-16", codebook_size=codes, codebook_embed_dim=code_dim, codebook_show_usage=False)
    return llama, dict(vocab_size=codes, code_dim=code_dim, head_hidden=head.get("image_token_embed")), vq, problems


def _transformers_sizes(data: dict) -> tuple[dict, dict, VQConfig, list[str]]:
    """transformers' config, as :func:`_deepseek_sizes` reads deepseek-ai's."""
    text, stated_vq = data["text_config"], data["vq_config"]
    llama = {**LLAMA_DEFAULTS, **text}
    vq = {**JANUS_VQ_DEFAULTS, **stated_vq}
    dim = llama["hidden_size"]
    problems = []
    if text.get("model_type", "llama") != "llama":
        problems.append(f"text_config model_type {text['model_type']!r} is not 'llama'")
    if (vq["num_hidden_layers"], vq["hidden_act"]) != (2, "gelu"):
        problems.append(f"vq_config gives the generation aligner {vq['num_hidden_layers']} layers and "
                        f"{vq['hidden_act']!r}, not 2 and 'gelu'")
    # the aligner's output and the head's input are both the language model's width in transformers' modules
    if vq["projection_dim"] != dim or vq["image_token_embed_dim"] != dim:
        problems.append(f"vq_config projection_dim {vq['projection_dim']} / image_token_embed_dim "
                        f"{vq['image_token_embed_dim']} differ from text_config hidden_size {dim}")
    if (vq["in_channels"], vq["out_channels"], vq["double_latent"]) != (3, 3, False):
        problems.append("vq_config is not an RGB VQ model with one latent (in_channels 3, out_channels 3, "
                        "double_latent false)")
    try:
        levels = tuple(vq["channel_multiplier"])
    except TypeError:
        raise TypeError(f"vq_config channel_multiplier {vq['channel_multiplier']!r} is not a list") from None
    vq_model = VQConfig(codebook_size=vq["num_embeddings"], codebook_embed_dim=vq["embed_dim"],
                        codebook_show_usage=False, base_channels=vq["base_channels"], encoder_ch_mult=levels,
                        decoder_ch_mult=levels, z_channels=vq["latent_channels"], num_res_blocks=vq["num_res_blocks"])
    sizes = dict(vocab_size=vq["num_embeddings"], code_dim=vq["embed_dim"], head_hidden=vq["projection_dim"])
    return llama, sizes, vq_model, problems


def special_token_ids(folder: Path, vocab: int) -> dict[str, int]:
    """``bos_id``, ``pad_id``, ``boi_id`` as the folder's ``tokenizer.json`` numbers them; where the folder's
    ``generation_config.json`` (transformers' layout) states them too, it must agree."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises its own exception types
        raise CheckpointError(path, f"not a readable tokenizer.json ({err}); the official folders carry one") from None
    ids = {field: tokenizer.token_to_id(name) for field, name in SPECIAL_TOKENS.items()}
    missing = [SPECIAL_TOKENS[f] for f, i in ids.items() if i is None or not 0 <= i < vocab]
    if missing:
        raise CheckpointError(path, f"lacks the special token(s) {', '.join(missing)} (or numbers them beyond the "
                                    f"{vocab}-token vocabulary): not Janus-Pro's tokenizer")
    generation = folder / "generation_config.json"
    if generation.is_file():
        try:
            stated = json.loads(generation.read_text())
            stated = {**stated, **(stated.get("generation_kwargs") or {})}
        except (OSError, ValueError, TypeError, AttributeError) as err:
            raise CheckpointError(generation, f"not a readable generation config: {err}") from None
        # transformers' generate pads the guidance null and keeps BOS and the image-start tag by these ids
        differ = [f"{key} {stated[key]} (tokenizer.json: {ids[field]} for {SPECIAL_TOKENS[field]})"
                  for field, key in GENERATION_CONFIG_IDS.items() if stated.get(key) not in (None, ids[field])]
        if differ:
            raise CheckpointError(generation, f"{'; '.join(differ)}: the folder's tokenizer and generation config "
                                              "disagree")
    return ids


def _deepseek_names(state: dict[str, torch.Tensor], path) -> dict[str, torch.Tensor]:
    """transformers' Janus weights under deepseek-ai's names; a key of neither path is a one-line error."""
    renamed, strays = {}, []
    for key, value in state.items():
        old, new = next(((old, new) for old, new in TRANSFORMERS_PREFIXES if key.startswith(old)), (None, None))
        if old is None:
            strays.append(key)
            continue
        rest = key[len(old):]
        if new == VQ_PREFIX:
            for pattern, replacement in VQ_RENAMES:
                rest = pattern.sub(replacement, rest)
        renamed[new + rest] = value
    if strays:
        raise CheckpointError(path, f"{len(strays)} unexpected key(s) ({', '.join(sorted(strays)[:3])}"
                                    f"{' and more' if len(strays) > 3 else ''}): not keys of transformers' Janus model")
    return renamed


def load_official(folder, prompt_slots: int = 64, grid_size: int = 24) -> tuple[JanusGen, VQModel]:
    """The generation path of an official Janus-Pro folder (either layout): the target and its VQ-16 tokenizer, in
    float32. ``grid_size``: 24, the official script's 576 codes (384 px); tests use smaller grids."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(folder, "not a folder: give the folder of an official Janus-Pro checkpoint "
                                      "(config.json, weights, tokenizer.json)")
    config, vq_model = official_config(folder, prompt_slots, grid_size)
    state = read_hf_weights(folder)
    transformers_layout = _read_config(folder)[2] == "janus"
    if transformers_layout:
        state = _deepseek_names(state, folder)
    vq_state = {k.removeprefix(VQ_PREFIX): v for k, v in state.items()
                if k.startswith(VQ_PREFIX) and not k.startswith(UNUSED)}
    target_state = {k: v for k, v in state.items() if not k.startswith((VQ_PREFIX, *UNUSED))}
    hint = _hint(target_state, config)
    vq_hint = f"the {VQ_PREFIX[:-1]} weights should be VQ-16's"
    if transformers_layout:  # the messages name keys as renamed
        hint += "; keys by deepseek-ai's names, to which transformers' are renamed"
        vq_hint = ("the model.vqmodel weights should be the VQ model vq_config describes; keys by LlamaGen's names, "
                   "to which transformers' are renamed")
    target = JanusGen(config)
    load_state(target, {k: v.float() for k, v in target_state.items()}, folder, hint)
    vq = VQModel(vq_model)
    load_state(vq, {k: v.float() for k, v in vq_state.items()}, folder, vq_hint)
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
