"""Strict loaders of LlamaGen's official GPT checkpoints (``.pt``), LANTERN / EAGLE drafter folders and vvs files,
through the safe readers of :mod:`vvs.models.loading`."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from vvs.families.llamagen.drafter import Drafter, DrafterConfig
from vvs.families.llamagen.gpt import GPT, GPTConfig
from vvs.models.loading import CheckpointError, config_from_meta, load_state, read_checkpoint


def _gpt_hint(state: dict[str, torch.Tensor], config: GPTConfig) -> str:
    emb = state.get("tok_embeddings.weight")
    if emb is None:
        return "is this a LlamaGen GPT checkpoint?"
    layers = len({k.split(".")[1] for k in state if k.startswith("layers.")})
    kind = "c2i" if "cls_embedding.embedding_table.weight" in state else "t2i"
    if (kind, emb.shape[1], layers, emb.shape[0]) == (config.model_type, config.dim, config.n_layer, config.vocab_size):
        return ""  # the sizes agree: another --config would not help
    return (
        f"the file holds a {kind} model with dim {emb.shape[1]}, {layers} layers, vocab {emb.shape[0]}; the config "
        f"expects {config.model_type} dim {config.dim}, {config.n_layer} layers, vocab {config.vocab_size} "
        "(pick the matching --config)"
    )


def load_gpt(path, config: GPTConfig | None = None, *, ema: bool = False) -> GPT:
    """A LlamaGen GPT from an official ``.pt`` (config required) or a vvs safetensors file (config inside)."""
    state, meta = read_checkpoint(path, ema=ema)
    stored = config_from_meta(meta, "gpt", path)
    if stored is not None:
        stored_cfg = GPTConfig(**stored)
        if config is not None and config != stored_cfg:
            raise CheckpointError(path, f"the file's config does not match the requested one ({_diff(stored_cfg, config)})")
        config = stored_cfg
    if config is None:
        raise CheckpointError(path, "an official checkpoint carries no config: pass --config (e.g. GPT-XL)")
    # LlamaGen keeps its RoPE table as a buffer that some official files carry (its loaders use strict=False,
    # its serving code drops it); vvs computes the table from the config
    state.pop("freqs_cis", None)
    model = GPT(config)
    load_state(model, state, path, _gpt_hint(state, config))
    return model.eval()


def load_drafter(path, target: GPTConfig) -> Drafter:
    """A drafter from a LANTERN/EAGLE folder (config.json + weights) or a vvs safetensors file."""
    path = Path(path)
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise CheckpointError(path, "drafter folder has no config.json")
        try:
            hf = json.loads(cfg_file.read_text())
            config = DrafterConfig.from_hf_json(hf)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
            raise CheckpointError(cfg_file, f"not a usable drafter config: {err}") from None
        trained_for = hf.get("input_type")  # LANTERN records which kind of target the drafter was trained on
        if trained_for is not None and trained_for != target.model_type:
            raise CheckpointError(cfg_file, f"the drafter was trained for a {trained_for} target (input_type) but the "
                                            f"target is {target.model_type}; pass the drafter trained for this target")
        weights = next((path / n for n in ("model.safetensors", "pytorch_model.bin") if (path / n).is_file()), None)
        if weights is None:
            raise CheckpointError(path, "drafter folder has neither model.safetensors nor pytorch_model.bin")
        state, _ = read_checkpoint(weights)
        norm = state.get("layers.0.self_attn.q_norm.weight")
        if config.qk_norm_groups and norm is not None and norm.dim() == 2:  # a row per shard, or per head (Anole's)
            config = dataclasses.replace(config, qk_norm_groups=norm.shape[0])
        if hasattr(target, "stream_ids") and config.vocab_size != target.vocab_size:
            state, config = _stream_rows(state, config, target, weights)
    else:
        weights = path
        state, meta = read_checkpoint(path)
        stored = config_from_meta(meta, "drafter", path)
        if stored is None:
            raise CheckpointError(path, "not a vvs drafter file; pass a LANTERN-style folder with config.json instead")
        config = DrafterConfig(**stored)
    try:
        model = Drafter(config, target)
    except ValueError as err:
        raise CheckpointError(weights, f"drafter does not fit the target: {err}") from None
    load_state(model, state, weights)
    return model.eval()


def _stream_rows(state: dict, config: DrafterConfig, target, path) -> tuple[dict, DrafterConfig]:
    """A drafter over a joint text + image vocabulary (LANTERN's for Lumina-mGPT copies the target's whole embedding
    table) keeps the rows of the ids the image stream takes, in the stream's order."""
    import dataclasses

    table = state.get("embed_tokens.weight")
    if table is None or table.shape[0] != target.joint_vocab_size:
        raise CheckpointError(path, f"the drafter's embed_tokens has {None if table is None else table.shape[0]} rows; "
                                    f"the target's vocabulary {target.joint_vocab_size}")
    state = {**state, "embed_tokens.weight": table[list(target.stream_ids)]}
    return state, dataclasses.replace(config, vocab_size=target.vocab_size)


def _diff(a, b) -> str:
    da, db = a.to_dict(), b.to_dict()
    return ", ".join(f"{k}: file {da[k]} vs requested {db[k]}" for k in da if da[k] != db.get(k))

