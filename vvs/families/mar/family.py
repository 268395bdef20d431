"""MAR's registry entry: continuous tokens from a diffusion head, class-conditional, decoded by MAR's sampler
(ar) and continuous speculative decoding (cspd)."""
from __future__ import annotations

import click

from vvs.families.base import DecodingFlag, Family
from vvs.families.mar.options import ACCEPT_RULES, MAROptions
from vvs.families.options import EMA, NAMED_SIZE

M = "vvs.families.mar"

FAMILY = Family(
    name="mar",
    label="MAR",
    summary="continuous tokens from a diffusion head; continuous speculative decoding",
    options=MAROptions,
    bench_modes=("ar", "cspd"),
    mode_help="ar is MAR's own sampler; cspd is continuous speculative decoding, exact with --accept-rule exact or "
              "trajectory",
    manifest_schema={"properties": {"model": {"required": ["draft", "tokenizer", "image_size"]}}},
    model_configs={"target": (f"{M}.model:MARConfig", ("seq_len", "token_embed_dim")),
                   "draft": (f"{M}.model:MARConfig", ("seq_len", "token_embed_dim"))},
    condition_kind=lambda manifest: "class",
    num_classes=lambda manifest: manifest["model"]["target"]["class_num"],
    export_options=(
        NAMED_SIZE,
        EMA,
        click.Option(["--draft-config"], default=None, help="Named size of an official --drafter (e.g. mar_base)."),
        click.Option(["--vae"], type=click.Path(dir_okay=False), default=None,
                     help="MAR's KL-16 VAE (official kl16.ckpt) for official checkpoints."),
    ),
    decoding_flags=(
        DecodingFlag("--temperature", "temperature", float, "Scales the diffusion sampler's noise (> 0)."),
        DecodingFlag("--cfg", "cfg_scale", float, "Classifier-free guidance scale on the diffusion head; above 1."),
        DecodingFlag("--num-iter", "num_iter", int, "Generation steps."),
        DecodingFlag("--draft-steps", "draft_steps", int, "cspd: draft steps per verification."),
        DecodingFlag("--accept-rule", "accept_rule", click.Choice(ACCEPT_RULES),
                     "cspd acceptance: exact (last denoising step) and trajectory (the whole aligned chain) are "
                     "lossless; official is the released code's rule (lossy), for comparing with the paper."),
        DecodingFlag("--official-windows", "official_windows", bool,
                     "cspd: verify at steps that are multiples of --draft-steps, each window guided by its last "
                     "step's scale, as the release."),
    ),
    export=f"{M}.exporter:export_from_options",
    load_engines=f"{M}.engines:load_mar_folder",
    pipeline=f"{M}.pipeline:MARPipeline",
    instruments=f"{M}.engines:quality_instruments",
    tensorrt_profiles=f"{M}.exporter:tensorrt_profiles",
    check_options=f"{M}.engines:check_folder_options",
    build_backends=("tensorrt-rtx",),
    run_backends=("onnxruntime", "openvino", "torch"),
    train_commands=(f"{M}.commands:train_mar_cmd",),
    remeasure_tokenizer=f"{M}.train:remeasured_record",
    instead={
        "tensorrt": "MAR folders build for tensorrt-rtx only so far; use --backend tensorrt-rtx or onnxruntime",
        "run tensorrt": "vvs does not run MAR plans yet",
        "run tensorrt-rtx": "vvs-export --backend tensorrt-rtx builds their plans, but vvs does not run them yet",
        "tune": "tunes draft trees of LlamaGen folders; for MAR folders compare --draft-steps with --sweep "
                "draft_steps=4,8,16",
        "scale": "inflates LlamaGen folders; this is a MAR folder",
        "serve": "vvs-serve serves LlamaGen folders so far (run MAR folders with vvs-run, vvs-bench or "
                 "vvs.families.mar.pipeline.MARPipeline)",
    },
)
