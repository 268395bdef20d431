"""Strict loaders of Lumina-mGPT: targets from official Hugging Face folders (Alpha-VLLM/Lumina-mGPT-7B-512, -768,
-1024; GAIR's Anole-7b in transformers' layout), Chameleon's VQGAN from its tokenizer folder (``vqgan.yaml`` +
``vqgan.ckpt``), and vvs files of either.

An official folder holds ``config.json`` (``model_type`` "chameleon", with the tokenizer's whole
``vocabulary_map``) and the weights (safetensors or ``.bin``, one file or the shards an index lists). The special
ids are looked up by name in the vocabulary map, never assumed. transformers' layout also carries the VQGAN's
encoder (``model.vqmodel.*``), which generation does not use: those keys are recognised and left out; every other
key must be one the target has, with its shape. The query/key norms' rows (one per model-parallel shard, or one
per head) are read from the weights.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from vvs.families.lumina_mgpt.model import ChameleonConfig, ChameleonGen
from vvs.families.lumina_mgpt.vqgan import ChameleonVQGAN, VQGANConfig
from vvs.models.hub import folder_name
from vvs.models.loading import (CheckpointError, check_config_values, load_state, load_vvs_model, read_checkpoint,
                                read_hf_weights)

UNUSED = ("model.vqmodel.",)
# the ids a prompt and an image are built from, by the names Chameleon's vocabulary gives them
SPECIAL_TOKENS = {"bos_id": "<s>", "sep_id": "<reserved08706>", "boi_id": "<racm3:break>", "eoi_id": "<eoss>",
                  "eol_id": "<reserved08799>", "size_base": "<reserved08800>"}
PAD_TOKEN = "<pad>"
IMAGE_PREFIX = "IMGIMG"  # image ids are named IMGIMG + the code's digits written as letters A-J + one more letter
RESOLUTIONS = {"512": 32, "768": 48, "1024": 64}  # Lumina-mGPT's folders by name -> codes per side


def grid_of(folder: Path) -> int | None:
    """The code grid a folder was trained for, from its name (Lumina-mGPT-7B-768 -> 48; a snapshot in the Hugging
    Face cache goes by its repository's); None if it does not say."""
    tail = folder_name(folder).rsplit("-", 1)[-1]
    return RESOLUTIONS.get(tail)


def image_codes(vocabulary: dict[str, int], first: int, count: int) -> list[int] | None:
    """The VQGAN code of each image id ``first..first + count - 1``, as the vocabulary's names spell them; None if
    the vocabulary does not name exactly those ids as images."""
    letters = {chr(ord("A") + i): str(i) for i in range(10)}
    codes = {}
    for name, index in vocabulary.items():
        if name.startswith(IMAGE_PREFIX):
            digits = "".join(letters.get(c, c) for c in name[len(IMAGE_PREFIX):-1])
            if not digits.isdigit():
                return None
            codes[index] = int(digits)
    if sorted(codes) != list(range(first, first + count)) or sorted(codes.values()) != list(range(count)):
        return None
    return [codes[first + i] for i in range(count)]


def official_config(folder: Path, prompt_slots: int, grid_size: int, state: dict[str, torch.Tensor]) -> tuple[
        ChameleonConfig, list[int]]:
    """The :class:`ChameleonConfig` of an official folder and the VQGAN code of each image id.

    ``prompt_slots``: the longest prompt it will take, in tokens, start and size tokens included; ``grid_size``:
    codes per image side (32 at 512 px)."""
    path = folder / "config.json"
    try:
        data = json.loads(path.read_text())
        vocabulary = data["vocabulary_map"]
        heads = data["num_attention_heads"]
        sizes = dict(dim=data["hidden_size"], n_layer=data["num_hidden_layers"], n_head=heads,
                     ffn_hidden=data["intermediate_size"], joint_vocab_size=data["vocab_size"])
    except FileNotFoundError:
        raise CheckpointError(folder, "no config.json: give the folder of an official Lumina-mGPT checkpoint") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(path, f"not a Lumina-mGPT config (chameleon, with its vocabulary_map): "
                                    f"{type(err).__name__} {err}") from None
    check_config_values(path, data, ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                     "vocab_size", "num_key_value_heads"), ("rms_norm_eps", "rope_theta"))
    problems = []
    if data.get("model_type") != "chameleon":
        problems.append(f"model_type {data.get('model_type')!r} is not 'chameleon'")
    if data.get("num_key_value_heads", heads) != heads:
        problems.append(f"num_key_value_heads {data['num_key_value_heads']} differs from {heads} attention heads")
    if data.get("hidden_act", "silu") != "silu" or data.get("rope_scaling") is not None \
            or data.get("attention_bias", False) or data.get("mlp_bias", False) or data.get("swin_norm", False) \
            or data.get("tie_word_embeddings", False):
        problems.append("the decoder is not Lumina-mGPT's (silu, no rope_scaling, no biases, pre-norm, untied head)")
    known = vocabulary if isinstance(vocabulary, dict) else {}
    ids = {field: known.get(name) for field, name in SPECIAL_TOKENS.items()}
    missing = [SPECIAL_TOKENS[f] for f in SPECIAL_TOKENS if not isinstance(ids.get(f), int)]
    if missing:
        problems.append(f"the vocabulary_map lacks {', '.join(missing)}: not Chameleon's vocabulary")
    norm = state.get("model.layers.0.self_attn.q_norm.weight")
    groups = norm.shape[0] if norm is not None and norm.dim() == 2 else 1
    if problems:
        raise CheckpointError(path, "; ".join(problems))
    codes = image_codes(vocabulary, 4, 8192)
    if codes is None:
        raise CheckpointError(path, "the vocabulary_map does not name ids 4..8195 as the 8192 image codes "
                                    "(IMGIMG...): not Chameleon's vocabulary")
    try:
        config = ChameleonConfig(
            **sizes, norm_eps=data.get("rms_norm_eps", 1e-5), rope_base=data.get("rope_theta", 10000.0),
            qk_norm_groups=groups, grid_size=grid_size, cls_token_num=prompt_slots,
            pad_id=vocabulary.get(PAD_TOKEN, ids["bos_id"]), **ids)
    except (TypeError, ValueError) as err:
        raise CheckpointError(path, f"unusable sizes: {err}") from None
    return config, codes


def load_official(folder, prompt_slots: int = 96, grid_size: int | None = None) -> tuple[ChameleonGen, list[int]]:
    """The target of an official folder, in float32, and the VQGAN code of each image id. ``grid_size``: codes
    per side; None takes it from the folder's name (``...-512`` / ``-768`` / ``-1024``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(folder, "not a folder: give the folder of an official Lumina-mGPT checkpoint "
                                      "(config.json and its weights)")
    grid_size = grid_size or grid_of(folder)
    if grid_size is None:
        raise CheckpointError(folder, "the folder's name does not say its resolution (-512, -768 or -1024): give "
                                      "--resolution")
    state = {k: v for k, v in read_hf_weights(folder).items() if not k.startswith(UNUSED)}
    config, codes = official_config(folder, prompt_slots, grid_size, state)
    head = state.get("lm_head.weight")
    if head is not None and head.dim() == 2 and head.shape[1] == config.dim:  # (another width: load_state says so)
        if head.shape[0] != config.joint_vocab_size:
            raise CheckpointError(folder, f"lm_head.weight is {list(head.shape)}, config.json says "
                                          f"[{config.joint_vocab_size}, {config.dim}]")
        state["lm_head.weight"] = head[list(config.stream_ids)]  # the stream's rows (vvs.families.lumina_mgpt.model)
    target = ChameleonGen(config)
    load_state(target, {k: v.float() for k, v in state.items()}, folder, _hint(state, config))
    return target.eval(), codes


def _hint(state: dict[str, torch.Tensor], config: ChameleonConfig) -> str:
    emb = state.get("model.embed_tokens.weight")
    if emb is None:
        return "is this an official Lumina-mGPT checkpoint?"
    layers = len({k.split(".")[2] for k in state if k.startswith("model.layers.")})
    return (f"the weights hold {layers} layers of width {emb.shape[1]} over {emb.shape[0]} ids; config.json says "
            f"{config.n_layer} of {config.dim} over {config.joint_vocab_size}")


def load_lumina(path, config: ChameleonConfig | None = None) -> ChameleonGen:
    """A Lumina-mGPT target from a vvs safetensors file (config inside)."""
    return load_vvs_model(path, "chameleon", ChameleonConfig, ChameleonGen, config, label="Lumina-mGPT",
                          instead="give an official folder instead")


# --------------------------------------------------------------------------- the image tokenizer

VQGAN_UNUSED = ("loss.",)  # a training checkpoint's discriminator and perceptual loss


def vqgan_config(path: Path) -> VQGANConfig:
    """The :class:`VQGANConfig` of an official ``vqgan.yaml`` (``model.params``: embed_dim, n_embed, ddconfig)."""
    import yaml

    try:
        params = yaml.safe_load(path.read_text())["model"]["params"]
        dd = params["ddconfig"]
        fields = dict(embed_dim=params["embed_dim"], n_embed=params["n_embed"], z_channels=dd["z_channels"],
                      resolution=dd["resolution"], in_channels=dd["in_channels"], out_ch=dd["out_ch"], ch=dd["ch"],
                      ch_mult=dd["ch_mult"], num_res_blocks=dd["num_res_blocks"],
                      attn_resolutions=dd.get("attn_resolutions", []))
    except FileNotFoundError:
        raise CheckpointError(path, "no such file: Chameleon's tokenizer folder holds vqgan.yaml, vqgan.ckpt and "
                                    "text_tokenizer.json") from None
    except (OSError, yaml.YAMLError, KeyError, TypeError) as err:
        raise CheckpointError(path, f"not a VQGAN config (model.params with embed_dim, n_embed, ddconfig): "
                                    f"{type(err).__name__} {err}") from None
    if dd.get("double_z", False):
        raise CheckpointError(path, "ddconfig.double_z is true: Chameleon's VQGAN encodes single latents")
    try:
        return VQGANConfig(**fields)
    except (TypeError, ValueError) as err:
        raise CheckpointError(path, f"unusable sizes: {err}") from None


def load_official_vqgan(folder, stream_codes: list[int] | None = None) -> ChameleonVQGAN:
    """Chameleon's VQGAN from its tokenizer folder (``vqgan.yaml`` + ``vqgan.ckpt``), in float32, with the code
    of each image id of the target's vocabulary (:func:`image_codes`; None: the identity)."""
    folder = Path(folder)
    config = vqgan_config(folder / "vqgan.yaml")
    path = folder / "vqgan.ckpt"
    state, _ = read_checkpoint(path)
    state = {k: v.float() for k, v in state.items() if not k.startswith(VQGAN_UNUSED)}
    model = ChameleonVQGAN(config)
    if stream_codes is not None:
        if sorted(stream_codes) != list(range(config.n_embed)):
            raise CheckpointError(path, f"the target's vocabulary names {len(stream_codes)} image codes, the VQGAN "
                                        f"has {config.n_embed}: not the target's image tokenizer")
        state["quantize.stream_codes"] = torch.tensor(stream_codes)
    else:
        state["quantize.stream_codes"] = model.quantize.stream_codes
    book = state.get("quantize.embedding.weight")
    hint = "" if book is None else (f"the file's codebook is {list(book.shape)}, vqgan.yaml says "
                                    f"[{config.n_embed}, {config.embed_dim}]")
    load_state(model, state, path, hint)
    return model.eval()


def load_vqgan(path) -> ChameleonVQGAN:
    """A VQGAN from a vvs safetensors file (config inside)."""
    return load_vvs_model(path, "chameleon-vqgan", VQGANConfig, ChameleonVQGAN, label="VQGAN",
                          instead="give Chameleon's tokenizer folder instead")
