"""Janus-Pro's ``vvs-train`` command: the shipped pair (``janus-pro``)."""
from __future__ import annotations

from pathlib import Path

import click

from vvs.train.commands import reproduce_command


train_janus_cmd = reproduce_command(
    "janus-pro", help="Reproduce the shipped Janus-Pro pair (its prompt tokenizer, a small target of Janus-Pro's "
                      "generation architecture and its drafter) on the shipped tokenizer's codes of the shipped "
                      "photographs and their captions. Resumable.",
    out="runs/janus", vq_help="The VQ tokenizer of the images.",
    reproduce="vvs.families.janus_pro.train:reproduce_janus", shipping="its files")


@click.command("janus-drafter", help="Train an EAGLE drafter for an official Janus-Pro checkpoint. --data is an .npz "
                                     "with 'tokens' [M, 576] (your images' VQ-16 codes, 24 x 24 at 384 px) and "
                                     "'prompts' [M] (their captions, strings).")
@click.option("--checkpoint", type=click.Path(file_okay=False, exists=True), required=True,
              help="The official Janus-Pro folder (config.json, weights, tokenizer.json).")
@click.option("--data", type=click.Path(dir_okay=False, exists=True), required=True)
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="Folder for checkpoints and drafter.safetensors (give it to vvs-export --drafter).")
@click.option("--steps", type=click.IntRange(1), default=1500, show_default=True)
@click.option("--batch", type=click.IntRange(1), default=16, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def train_janus_drafter_cmd(checkpoint, data, out, steps, batch, lr, seed):
    import math

    import numpy as np
    import torch

    from vvs.discrete.train_drafter import train_drafter
    from vvs.errors import VVSError
    from vvs.families.janus_pro.loading import load_official, official_config
    from vvs.families.janus_pro.prompts import PromptIds
    from vvs.models.loading import save_model
    from vvs.output import ensure_writable_dir

    try:
        arrays = np.load(data)  # allow_pickle stays False: strings are stored as fixed-width unicode
        tokens = torch.from_numpy(arrays["tokens"]).long()
        prompts = [str(p) for p in arrays["prompts"]]
    except (OSError, ValueError, KeyError) as err:
        raise VVSError(f"{data}: not a usable drafter dataset ({err}); see vvs-train janus-drafter --help") from None
    grid = math.isqrt(tokens.shape[1]) if tokens.dim() == 2 else 0
    if tokens.dim() != 2 or grid * grid != tokens.shape[1] or len(prompts) != len(tokens):
        raise VVSError(f"{data}: tokens must be [M, grid x grid] with one prompt per row, got "
                       f"{list(tokens.shape)} and {len(prompts)} prompts")
    ensure_writable_dir(Path(out))
    tokenizer = Path(checkpoint) / "tokenizer.json"
    config, _ = official_config(Path(checkpoint), 4096, grid)  # the prompt slots follow from the longest prompt
    slots = max(len(PromptIds.from_file(tokenizer, config).ids(p)) for p in prompts)
    target, _ = load_official(checkpoint, prompt_slots=slots, grid_size=grid)
    ids, mask = PromptIds.from_file(tokenizer, target.config).encode(prompts)
    drafter = train_drafter(target, ids, tokens, Path(out), seed, steps=steps, batch=batch, lr=lr, caption_mask=mask)
    path = save_model(drafter, Path(out) / "drafter.safetensors", "drafter")
    click.echo(f"wrote {path}")
