"""MAR's ``vvs-train`` command: the shipped MAR pair (``mar``)."""
from __future__ import annotations

from pathlib import Path

import click


@click.command("mar", help="Reproduce the shipped MAR pair (target and draft, continuous tokens) on the shipped "
                               "VQ tokenizer's latents. Resumable.")
@click.option("--out", type=click.Path(file_okay=False), default="runs/mar", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--vq", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The VQ tokenizer whose latents the pair models. Default: the shipped one.")
def train_mar_cmd(out, seed, vq):
    from vvs.families.llamagen.bundle import shipped_path
    from vvs.output import ensure_writable_dir
    from vvs.families.mar.train import reproduce_mar

    ensure_writable_dir(Path(out))
    weights = reproduce_mar(Path(out), Path(vq) if vq else shipped_path("vq"), seed)
    click.echo(f"wrote {weights} (copy mar_*.safetensors and shipped_mar.json to vvs/weights/ to ship them)")
