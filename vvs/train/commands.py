"""The ``vvs-train`` command that reproduces a family's shipped pair from the shipped VQ tokenizer's codes or latents:
one definition for every family that ships one (``mar``, ``janus-pro``, ``lumina-mgpt``)."""
from __future__ import annotations

from importlib import import_module
from pathlib import Path

import click


def reproduce_command(name: str, help: str, out: str, vq_help: str, reproduce: str, shipping: str) -> click.Command:
    """``vvs-train <name> [--out DIR] [--seed S] [--vq F]``, running ``reproduce`` (``"module:function"``, imported
    when the command runs, called as ``function(out, vq, seed)`` and returning the folder it wrote); ``shipping``
    says which of its files to copy to ``vvs/weights/``."""

    @click.command(name, help=help)
    @click.option("--out", type=click.Path(file_okay=False), default=out, show_default=True)
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--vq", type=click.Path(dir_okay=False, exists=True), default=None,
                  help=f"{vq_help} Default: the shipped one.")
    def command(out, seed, vq):
        from vvs.shipped import shipped_path
        from vvs.output import ensure_writable_dir

        module, function = reproduce.split(":")
        ensure_writable_dir(Path(out))
        weights = getattr(import_module(module), function)(Path(out), Path(vq) if vq else shipped_path("vq"), seed)
        click.echo(f"wrote {weights} (copy {shipping} to vvs/weights/ to ship them)")

    return command
