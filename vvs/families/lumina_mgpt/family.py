"""Lumina-mGPT's registry entry: text to image through Chameleon's decoder and VQGAN, decoded by the discrete-token
machinery and the shared speculative loop with end-of-line tokens forced at row ends."""
from __future__ import annotations

import click

from vvs.families.base import Family
from vvs.families.llamagen.family import BENCH_MODES, DECODING_FLAGS, EXPORT_OPTIONS, MODE_HELP, PROMPT_TOKENS
from vvs.runtime.options import DecodeOptions

SCALE_SIZES = ("Lumina-mGPT-7B",)  # vvs-bench --scale: the decoder of every resolution's folder
M = "vvs.families.lumina_mgpt"
D = "vvs.discrete"

# the official solver's image sampling: guidance 3, image top-k 2000, temperature 1 (create_logits_processor)
SAMPLING = {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 2000, "top_p": 1.0}

FAMILY = Family(
    name="lumina-mgpt",
    label="Lumina-mGPT",
    summary="Alpha-VLLM's Lumina-mGPT text to image (Chameleon: one vocabulary for text and VQGAN codes, an "
            "end-of-line token after every row); VVS, EAGLE-2, LANTERN, speculative Jacobi",
    options=DecodeOptions,
    bench_modes=BENCH_MODES,
    mode_help=MODE_HELP,
    manifest_schema={"required": ["max_draft_top_k", "tables", "prompts"],
                     "properties": {"model": {"required": ["vq"]}}},
    model_configs={"target": (f"{M}.model:ChameleonConfig", ("vocab_size", "num_image_tokens", "head_dim")),
                   "drafter": (f"{D}.drafter:DrafterConfig", ()), "vq": (f"{M}.vqgan:VQGANConfig", ())},
    condition_kind=lambda manifest: "text",
    num_classes=lambda manifest: 0,
    export_options=(
        *EXPORT_OPTIONS,
        click.Option(["--tokenizer-dir"], type=click.Path(file_okay=False), default=None,
                     help="Chameleon's tokenizer folder (vqgan.yaml, vqgan.ckpt, text_tokenizer.json) for "
                          "--checkpoint: the official folders do not carry the VQGAN."),
        click.Option(["--resolution"], type=click.IntRange(32, 4096), default=None,
                     help="Pixels per side of the images, a multiple of 32 (default: the one --checkpoint was trained "
                          "for, from its name: Lumina-mGPT-7B-768 -> 768)."),
        PROMPT_TOKENS,
    ),
    decoding_flags=DECODING_FLAGS,
    export=f"{M}.bundle:export_from_options",
    load_engines=f"{D}.engines:load_engines",
    pipeline="vvs.runtime.pipeline:Pipeline",
    instruments=f"{D}.engines:quality_instruments",
    tensorrt_profiles=f"{D}.exporter:tensorrt_profiles",
    target_arch=f"{M}.arch:ARCH",
    scale=f"{D}.scale:scale_folder",
    scale_sizes=SCALE_SIZES,
    describe_scale=f"{D}.scale:describe",
    serve=True,
    train_commands=(f"{M}.commands:train_lumina_cmd", f"{M}.commands:train_lumina_drafter_cmd"),
    sampling=SAMPLING,
    instead={"tune": "tunes draft trees of LlamaGen folders; for Lumina-mGPT folders compare tree shapes with --sweep"},
)
