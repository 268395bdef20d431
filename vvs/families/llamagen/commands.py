"""LlamaGen's ``vvs-train`` commands: the shipped model set (``all``), the shipped text-to-image pair (``t2i``),
and a drafter for any LlamaGen target (``drafter``)."""
from __future__ import annotations

from pathlib import Path

import click

from vvs.errors import VVSError


@click.command("all", help="Reproduce the shipped weights (tokenizer, target, drafter, classifier) from a "
                               "fixed seed. Resumable: rerun the same command after an interruption.")
@click.option("--out", type=click.Path(file_okay=False), default="runs/shipped", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def train_all(out, seed):
    from vvs.families.llamagen.train_shipped import reproduce
    from vvs.output import ensure_writable_dir

    ensure_writable_dir(Path(out))
    weights = reproduce(Path(out), seed)
    click.echo(f"wrote {weights} (copy its files to vvs/weights/ to ship them); curves: {Path(out) / 'training_curves.png'}")


@click.command("t2i", help="Reproduce the shipped text-to-image pair (T5 encoder folder, target and drafter) on "
                               "the shipped tokenizer's codes, starting from the shipped class-conditional target. "
                               "Resumable.")
@click.option("--out", type=click.Path(file_okay=False), default="runs/t2i", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--vq", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The VQ tokenizer of the images. Default: the shipped one.")
@click.option("--start", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The class-conditional target of the same images to start from. Default: the shipped one.")
def train_t2i_cmd(out, seed, vq, start):
    from vvs.families.llamagen.train_t2i import reproduce_t2i
    from vvs.output import ensure_writable_dir
    from vvs.shipped import shipped_path

    ensure_writable_dir(Path(out))
    weights = reproduce_t2i(Path(out), Path(vq) if vq else shipped_path("vq"),
                            Path(start) if start else shipped_path("target"), seed)
    click.echo(f"wrote {weights} (copy its files to vvs/weights/ to ship them)")


@click.command("drafter", help="Train an EAGLE/LANTERN drafter for a target. --data is an .npz with "
                                   "'tokens' [M, N] (your images' VQ codes) and 'labels' [M] (c2i) or "
                                   "'captions' [M, C, caption_dim] + 'caption_mask' [M, C] (t2i, left-padded).")
@click.option("--checkpoint", type=click.Path(dir_okay=False), required=True, help="Target weights.")
@click.option("--config", default=None, help="Named GPT size of an official checkpoint (e.g. GPT-XL).")
@click.option("--t2i", is_flag=True, help="The target is text-conditional.")
@click.option("--data", type=click.Path(dir_okay=False, exists=True), required=True)
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Folder for checkpoints and drafter.safetensors.")
@click.option("--steps", type=click.IntRange(1), default=1500, show_default=True)
@click.option("--batch", type=click.IntRange(1), default=16, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def train_drafter_cmd(checkpoint, config, t2i, data, out, steps, batch, lr, seed):
    import numpy as np
    import torch

    from vvs.discrete.train_drafter import train_drafter
    from vvs.families.llamagen.gpt import gpt_config
    from vvs.families.llamagen.loading import load_gpt
    from vvs.models.loading import save_model
    from vvs.output import ensure_writable_dir

    ensure_writable_dir(Path(out))
    try:
        cfg = gpt_config(config, **({"model_type": "t2i"} if t2i else {})) if config else None
    except KeyError as err:
        raise VVSError(str(err.args[0])) from None
    target = load_gpt(checkpoint, cfg)
    try:
        arrays = np.load(data)
        tokens = torch.from_numpy(arrays["tokens"]).long()
        key = "labels" if target.config.model_type == "c2i" else "captions"
        conditions = torch.from_numpy(arrays[key])
        mask = torch.from_numpy(arrays["caption_mask"]).bool() if key == "captions" else None
    except (OSError, ValueError, KeyError) as err:
        raise VVSError(f"{data}: not a usable drafter dataset ({err}); see vvs-train drafter --help") from None
    if tokens.dim() != 2 or tokens.shape[1] != target.config.num_image_tokens or len(conditions) != len(tokens):
        raise VVSError(f"{data}: tokens must be [M, {target.config.num_image_tokens}] with one condition per row, "
                       f"got {list(tokens.shape)} and {len(conditions)} conditions")
    drafter = train_drafter(target, conditions.long() if key == "labels" else conditions.float(), tokens, Path(out),
                            seed, steps=steps, batch=batch, lr=lr, caption_mask=mask)
    path = save_model(drafter, Path(out) / "drafter.safetensors", "drafter")
    click.echo(f"wrote {path}")
