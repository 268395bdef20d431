"""``vvs-train``: reproduce the shipped models, or train a drafter for your own target. Each family brings its own
commands (its registry entry's ``train_commands``); the tokenizer's decoder is shared."""
from __future__ import annotations

import importlib
from pathlib import Path

import click

from vvs.cli.common import run_command
from vvs.families.registry import FAMILIES


@click.group(help="Train models: reproduce the shipped model set, or train a drafter for your own target.")
def train_cmd():
    pass


@train_cmd.command("decoder", help="Retrain a VQ tokenizer's decoder with reflection padding (how the shipped one "
                                   "was made): encoder and codebook stay frozen, so its codes and every model "
                                   "trained on them stay valid. Resumable.")
@click.option("--vq", type=click.Path(dir_okay=False, exists=True), required=True,
              help="The tokenizer whose decoder is retrained.")
@click.option("--out", type=click.Path(file_okay=False), default="runs/decoder", show_default=True)
@click.option("--seed", type=int, default=2, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=2400, show_default=True,
              help="Training steps (the decoder starts from the given tokenizer's).")
def train_decoder_cmd(vq, out, seed, steps):
    from vvs.output import ensure_writable_dir
    from vvs.train.decoder import reship_decoder

    ensure_writable_dir(Path(out))
    weights = reship_decoder(Path(out), Path(vq), seed, steps)
    click.echo(f"wrote {weights} (copy vq.safetensors and shipped.json to vvs/weights/ to ship them)")


def family_commands() -> list[click.Command]:
    """Every family's own subcommands (its registry entry's ``train_commands``)."""
    found = []
    for family in FAMILIES.values():
        for entry in family.train_commands:
            module, _, name = entry.partition(":")
            found.append(getattr(importlib.import_module(module), name))
    return found


for command in family_commands():
    train_cmd.add_command(command)


def main():
    run_command(train_cmd, "vvs-train")
