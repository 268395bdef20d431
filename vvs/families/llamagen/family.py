"""LlamaGen's registry entry: discrete VQ tokens, class- or text-conditional (c2i / t2i), decoded by the shared
speculative loop (ar, EAGLE-2 sd, LANTERN, VVS)."""
from __future__ import annotations

import click

from vvs.discrete.family import discrete_family
from vvs.families.options import EMA, NAMED_SIZE

SCALE_SIZES = ("GPT-B", "GPT-L", "GPT-XL", "GPT-XXL", "GPT-XXXL", "GPT-1B", "GPT-3B", "GPT-7B")
M = "vvs.families.llamagen"

FAMILY = discrete_family(
    name="llamagen",
    label="LlamaGen",
    summary="discrete VQ tokens, class- or text-conditional; VVS, EAGLE-2, LANTERN",
    package=M,
    target_config=(f"{M}.gpt:GPTConfig", ("num_image_tokens", "head_dim")),
    condition_kind=lambda manifest: "text" if manifest["model"]["target"]["model_type"] == "t2i" else "class",
    num_classes=lambda manifest: manifest["model"]["target"]["num_classes"],
    checkpoint_options=(NAMED_SIZE, EMA),
    export_options=(
        click.Option(["--t2i"], is_flag=True, help="The checkpoint is text-conditional (120 caption slots)."),
        click.Option(["--grid-size"], type=click.IntRange(1), default=None,
                     help="Token grid side of --checkpoint: 16 (256 px, default), 24 (384 px), 32 (512 px)."),
        click.Option(["--vq"], type=click.Path(dir_okay=False), default=None,
                     help="VQ tokenizer weights. Default: the shipped tokenizer."),
        click.Option(["--vq-config"], default=None,
                     help="Named VQ size of --vq (VQ-16, VQ-8). Not needed for vvs files."),
        click.Option(["--text-encoder"], type=click.Path(), default=None,
                     help="--t2i: the T5-family encoder the target was trained with (FLAN-T5-XL for LlamaGen's t2i "
                          "checkpoints), a folder or name transformers loads; exported with its tokenizer as the "
                          "text_encode graph, so prompts work with no other files."),
    ),
    scale_sizes=SCALE_SIZES,
    tunes=True,
    # the options class's defaults are the text-to-image script's (sample_t2i.py); the class-conditional one
    # (sample_c2i.py) samples with guidance 4 and top-k 2000
    script_sampling={"c2i": {"cfg_scale": 4.0, "top_k": 2000}, "t2i": {}},
    train_commands=(f"{M}.commands:train_all", f"{M}.commands:train_t2i_cmd", f"{M}.commands:train_drafter_cmd"),
)
