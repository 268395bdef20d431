"""Strict loader of EAGLE drafters for any discrete-token target: LANTERN / EAGLE drafter folders and vvs files,
through the safe readers of :mod:`vvs.models.loading`."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from vvs.discrete.drafter import Drafter, DrafterConfig
from vvs.discrete.target import TargetConfig
from vvs.models.loading import CheckpointError, check_config_values, config_from_meta, load_state, read_checkpoint


# a LANTERN/EAGLE config.json's sizes, checked before any arithmetic on them
DRAFTER_SIZES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                 "num_hidden_layers", "model_parallel_size")


def load_drafter(path, target: TargetConfig) -> Drafter:
    """A drafter from a LANTERN/EAGLE folder (config.json + weights) or a vvs safetensors file."""
    path = Path(path)
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise CheckpointError(path, "drafter folder has no config.json")
        try:
            hf = json.loads(cfg_file.read_text())
            check_config_values(cfg_file, hf, DRAFTER_SIZES, ("rms_norm_eps",))
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
    table = state.get("embed_tokens.weight")
    if table is None or table.shape[0] != target.joint_vocab_size:
        raise CheckpointError(path, f"the drafter's embed_tokens has {None if table is None else table.shape[0]} rows; "
                                    f"the target's vocabulary {target.joint_vocab_size}")
    state = {**state, "embed_tokens.weight": table[list(target.stream_ids)]}
    return state, dataclasses.replace(config, vocab_size=target.vocab_size)
