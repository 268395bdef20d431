"""``vvs-export`` options that families on different machineries share: the official ``.pt`` checkpoints of
LlamaGen and MAR carry no config and keep EMA weights beside the model's. One option object each, so the commands
show them once; the folder-based official formats (Janus-Pro, Lumina-mGPT) say their size in config.json and hold one
set of weights."""
from __future__ import annotations

import click

NAMED_SIZE = click.Option(["--config"], default=None,
                          help="Named size of --checkpoint: GPT-B, GPT-L, GPT-XL, ... (llamagen) or mar_base, "
                               "mar_large, mar_huge (mar). Not needed for vvs files.")
EMA = click.Option(["--ema"], is_flag=True, help="Load the EMA weights of official checkpoints ('ema' / 'model_ema').")
