"""MAR's ``vvs-train`` command: the shipped MAR pair (``mar``)."""
from __future__ import annotations

from vvs.train.commands import reproduce_command

train_mar_cmd = reproduce_command(
    "mar", help="Reproduce the shipped MAR pair (target and draft, continuous tokens) on the shipped VQ tokenizer's "
                "latents. Resumable.",
    out="runs/mar", vq_help="The VQ tokenizer whose latents the pair models.",
    reproduce="vvs.families.mar.train:reproduce_mar", shipping="mar_*.safetensors and shipped_mar.json")
