"""Strict loaders of MAR's official checkpoints (``checkpoint-last.pth``, ``kl16.ckpt``) and of vvs files, through
the safe readers of :mod:`vvs.models.loading`."""
from __future__ import annotations

from vvs.families.mar.kl_vae import AutoencoderKL, KLConfig
from vvs.families.mar.model import MAR, MARConfig
from vvs.models.loading import CheckpointError, config_from_meta, load_state, read_checkpoint


def load_mar(path, config: MARConfig | None = None, *, ema: bool = False) -> MAR:
    """A MAR from an official ``checkpoint-last.pth`` (config required, e.g. ``mar_config("mar_base")``) or a vvs
    safetensors file (config inside)."""
    state, meta = read_checkpoint(path, ema=ema)
    stored = config_from_meta(meta, "mar", path)
    if stored is not None:
        config = MARConfig(**stored)
    if config is None:
        raise CheckpointError(path, "an official MAR checkpoint carries no config: pass --config (e.g. mar_base)")
    model = MAR(config)
    width = state.get("z_proj.weight")
    hint = ""
    if width is not None:
        hint = (f"the file's encoder is {width.shape[0]} wide over {width.shape[1]}-dim tokens, the config expects "
                f"{config.encoder_embed_dim} over {config.token_embed_dim}")
    load_state(model, state, path, hint)
    return model.eval()


def load_kl_vae(path, config: KLConfig | None = None) -> AutoencoderKL:
    """MAR's KL-16 VAE from the official ``kl16.ckpt`` (weights under 'model') or a vvs safetensors file."""
    state, meta = read_checkpoint(path)
    stored = config_from_meta(meta, "kl_vae", path)
    config = KLConfig(**stored) if stored is not None else (config or KLConfig())
    model = AutoencoderKL(config)
    load_state(model, state, path)
    return model.eval()

