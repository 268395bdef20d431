"""Lumina-mGPT's registry entry: text to image through Chameleon's decoder and VQGAN, decoded by the discrete-token
machinery and the shared speculative loop with end-of-line tokens forced at row ends."""
from __future__ import annotations

import click

from vvs.discrete.family import discrete_family

SCALE_SIZES = ("Lumina-mGPT-7B",)  # vvs-bench --scale: the decoder of every resolution's folder
M = "vvs.families.lumina_mgpt"

# the official solver's image sampling: guidance 3, image top-k 2000, temperature 1 (create_logits_processor)
SAMPLING = {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 2000, "top_p": 1.0}

FAMILY = discrete_family(
    name="lumina-mgpt",
    label="Lumina-mGPT",
    summary="Alpha-VLLM's Lumina-mGPT text to image (Chameleon: one vocabulary for text and VQGAN codes, an "
            "end-of-line token after every row); VVS, EAGLE-2, LANTERN, speculative Jacobi",
    package=M,
    target_config=(f"{M}.model:ChameleonConfig", ("vocab_size", "num_image_tokens", "head_dim")),
    vq_config=f"{M}.vqgan:VQGANConfig",
    prompt_ids=True,
    export_options=(
        click.Option(["--tokenizer-dir"], type=click.Path(file_okay=False), default=None,
                     help="Chameleon's tokenizer folder (vqgan.yaml, vqgan.ckpt, text_tokenizer.json) for "
                          "--checkpoint: the official folders do not carry the VQGAN."),
        click.Option(["--resolution"], type=click.IntRange(32, 4096), default=None,
                     help="Pixels per side of the images, a multiple of 32 (default: the one --checkpoint was trained "
                          "for, from its name: Lumina-mGPT-7B-768 -> 768)."),
    ),
    scale_sizes=SCALE_SIZES,
    train_commands=(f"{M}.commands:train_lumina_cmd", f"{M}.commands:train_lumina_drafter_cmd"),
    sampling=SAMPLING,
    instead={"tune": "tunes draft trees of LlamaGen folders; for Lumina-mGPT folders compare tree shapes with --sweep"},
)
