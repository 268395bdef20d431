"""Command-line entry points: vvs-export, vvs-run, vvs-bench, vvs-train.

Every user error (bad option, bad file, bad folder) is printed as one line ``<prog>: error: ...`` and exits
with code 2; nothing half-written is left behind (writers use a temporary name and rename).
"""
from __future__ import annotations

import sys

import click

from vvs.errors import VVSError


def _main(command: click.Command, prog: str) -> None:
    try:
        command.main(prog_name=prog, standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as err:
        click.echo(f"{prog}: error: {err.format_message()} (see {prog} --help)", err=True)
        sys.exit(2)
    except VVSError as err:
        click.echo(f"{prog}: error: {err}", err=True)
        sys.exit(2)
    except click.Abort:
        click.echo(f"{prog}: interrupted", err=True)
        sys.exit(130)


# --------------------------------------------------------------------------- vvs-export

model_options = [
    click.option("--model", type=click.Choice(["llamagen"]), default="llamagen", show_default=True,
                 help="Model family."),
    click.option("--config", "config", default=None,
                 help="Named GPT size of --checkpoint (GPT-B, GPT-L, GPT-XL, ...). Not needed for vvs files."),
    click.option("--t2i", is_flag=True, help="The checkpoint is text-conditional (120 caption slots)."),
    click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
                 help="Target GPT weights (official .pt or vvs .safetensors). Default: the shipped model."),
    click.option("--vq", type=click.Path(dir_okay=False), default=None,
                 help="VQ tokenizer weights. Default: the shipped tokenizer."),
    click.option("--vq-config", default=None, help="Named VQ size of --vq (VQ-16, VQ-8). Not needed for vvs files."),
    click.option("--drafter", type=click.Path(), default=None,
                 help="Drafter: a LANTERN/EAGLE folder or a vvs .safetensors. Default: the shipped drafter."),
    click.option("--ema", is_flag=True, help="Load the 'ema' weights of official checkpoints."),
]


def with_model_options(fn):
    for option in reversed(model_options):
        fn = option(fn)
    return fn


@click.command(help="Export the target, drafter and VQ decoder to ONNX and write an engine folder.")
@with_model_options
def export_cmd(model, config, t2i, checkpoint, vq, vq_config, drafter, ema):
    from vvs.models.bundle import load_bundle

    bundle = load_bundle(checkpoint, config, vq, vq_config, drafter, t2i=t2i, ema=ema)
    click.echo(bundle.summary())
    raise VVSError("ONNX export is not implemented yet")


def _not_implemented(name: str) -> click.Command:
    @click.command(name=name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def stub():
        raise VVSError(f"{name} is not implemented yet")

    return stub


def export_main():
    _main(export_cmd, "vvs-export")


def run_main():
    _main(_not_implemented("vvs-run"), "vvs-run")


def bench_main():
    _main(_not_implemented("vvs-bench"), "vvs-bench")


def train_main():
    _main(_not_implemented("vvs-train"), "vvs-train")
