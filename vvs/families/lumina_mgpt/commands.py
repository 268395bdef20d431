"""Lumina-mGPT's ``vvs-train`` commands: the shipped pair (``lumina-mgpt``) and a drafter for an official checkpoint
(``lumina-drafter``)."""
from __future__ import annotations

from pathlib import Path

import click

from vvs.train.commands import reproduce_command


train_lumina_cmd = reproduce_command(
    "lumina-mgpt", help="Reproduce the shipped Lumina-mGPT pair (a small Chameleon-architecture target, its drafter, "
                        "the shipped VQ tokenizer as a Chameleon VQGAN and a text tokenizer in Chameleon's vocabulary "
                        "layout) on the shipped photographs and their captions. Resumable.",
    out="runs/lumina", vq_help="The VQ tokenizer the VQGAN is made from and the images are coded with.",
    reproduce="vvs.families.lumina_mgpt.train:reproduce_lumina", shipping="its files")


@click.command("lumina-drafter", help="Train an EAGLE drafter of Chameleon layers (LANTERN's kind) for an official "
                                      "Lumina-mGPT checkpoint. --data is an .npz with 'codes' [M, side x side] (your "
                                      "images' Chameleon VQGAN codes in raster order: 48 x 48 at 768 px) and "
                                      "'prompts' [M] (their captions, strings).")
@click.option("--checkpoint", type=click.Path(file_okay=False, exists=True), required=True,
              help="The official Lumina-mGPT folder (config.json and its weights).")
@click.option("--tokenizer-dir", type=click.Path(file_okay=False, exists=True), required=True,
              help="Chameleon's tokenizer folder (vqgan.yaml, vqgan.ckpt, text_tokenizer.json).")
@click.option("--data", type=click.Path(dir_okay=False, exists=True), required=True)
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="Folder for checkpoints and drafter.safetensors (give it to vvs-export --drafter).")
@click.option("--steps", type=click.IntRange(1), default=1500, show_default=True)
@click.option("--batch", type=click.IntRange(1), default=16, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def train_lumina_drafter_cmd(checkpoint, tokenizer_dir, data, out, steps, batch, lr, seed):
    import dataclasses
    import math

    import numpy as np
    import torch

    from vvs.discrete.train_drafter import train_drafter
    from vvs.errors import VVSError
    from vvs.families.lumina_mgpt.bundle import load_bundle
    from vvs.families.lumina_mgpt.model import ChameleonGen
    from vvs.families.lumina_mgpt.prompts import PromptIds, null
    from vvs.models.loading import save_model
    from vvs.output import ensure_writable_dir

    try:
        arrays = np.load(data)  # allow_pickle stays False: strings are stored as fixed-width unicode
        codes = torch.from_numpy(arrays["codes"]).long()
        prompts = [str(p) for p in arrays["prompts"]]
    except (OSError, ValueError, KeyError) as err:
        raise VVSError(f"{data}: not a usable drafter dataset ({err}); see vvs-train lumina-drafter --help") from None
    grid = math.isqrt(codes.shape[1]) if codes.dim() == 2 else 0
    if codes.dim() != 2 or grid * grid != codes.shape[1] or grid % 2 or len(prompts) != len(codes):
        raise VVSError(f"{data}: codes must be [M, side x side] (an even side) with one prompt per row, got "
                       f"{list(codes.shape)} and {len(prompts)} prompts")
    ensure_writable_dir(Path(out))
    bundle = load_bundle(checkpoint, tokenizer_dir, prompt_tokens=4096, no_drafter=True, resolution=grid * 16)
    book = bundle.vq.config.n_embed
    if int(codes.min()) < 0 or int(codes.max()) >= book:
        raise VVSError(f"{data}: codes must lie in [0, {book}) (the VQGAN's codebook)")
    # the prompt slots follow from the longest prompt
    slots = max(len(PromptIds.from_file(bundle.tokenizer, bundle.target.config).ids(p)) for p in prompts)
    target = ChameleonGen(dataclasses.replace(bundle.target.config, cls_token_num=slots))
    target.load_state_dict(bundle.target.state_dict())
    target.eval()
    cfg = target.config
    # codes -> the stream: each code's image id, an end-of-line token after every row
    stream_index = torch.empty(book, dtype=torch.long)
    stream_index[bundle.vq.quantize.stream_codes] = torch.arange(book)
    rows = stream_index[codes].view(len(codes), grid, grid)
    stream = torch.cat([rows, torch.full((len(codes), grid, 1), cfg.eol)], 2).view(len(codes), -1)
    ids, mask = PromptIds.from_file(bundle.tokenizer, cfg).encode(prompts)
    drafter = train_drafter(target, ids, stream, Path(out), seed, steps=steps, batch=batch, lr=lr, caption_mask=mask,
                            null=lambda conditions, slots_mask: null(conditions, slots_mask, cfg))
    path = save_model(drafter, Path(out) / "drafter.safetensors", "drafter")
    click.echo(f"wrote {path}")
