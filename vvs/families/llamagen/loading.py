"""Strict loader of LlamaGen's GPT: official checkpoints (``.pt``) and vvs files, through the safe readers of
:mod:`vvs.models.loading`."""
from __future__ import annotations

import torch

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


def _diff(a, b) -> str:
    da, db = a.to_dict(), b.to_dict()
    return ", ".join(f"{k}: file {da[k]} vs requested {db[k]}" for k in da if da[k] != db.get(k))

