"""Janus-Pro's registry entry: text to image through its language model's generation path (VQ-16 codes), decoded
by the discrete-token machinery and the shared speculative loop."""
from __future__ import annotations

from vvs.families.base import Family
from vvs.families.llamagen.family import BENCH_MODES, DECODING_FLAGS, EXPORT_OPTIONS, MODE_HELP, PROMPT_TOKENS
from vvs.runtime.options import DecodeOptions

SCALE_SIZES = ("Janus-Pro-1B", "Janus-Pro-7B")  # vvs-bench --scale
M = "vvs.families.janus_pro"
D = "vvs.discrete"

# the official script's sampling: guidance 5, temperature 1, no top-k or top-p (generation_inference.py)
SAMPLING = {"cfg_scale": 5.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}

FAMILY = Family(
    name="janus-pro",
    label="Janus-Pro",
    summary="deepseek-ai's Janus-Pro text to image (VQ-16 codes, prompts through its own tokenizer); VVS, EAGLE-2, "
            "LANTERN, speculative Jacobi",
    options=DecodeOptions,
    bench_modes=BENCH_MODES,
    mode_help=MODE_HELP,
    manifest_schema={"required": ["max_draft_top_k", "tables", "prompts"],
                     "properties": {"model": {"required": ["vq"]}}},
    model_configs={"target": (f"{M}.model:JanusConfig", ("num_image_tokens", "head_dim")),
                   "drafter": (f"{D}.drafter:DrafterConfig", ()), "vq": ("vvs.models.vq:VQConfig", ())},
    condition_kind=lambda manifest: "text",
    num_classes=lambda manifest: 0,
    export_options=(
        *EXPORT_OPTIONS,
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
    train_commands=(f"{M}.commands:train_janus_cmd", f"{M}.commands:train_janus_drafter_cmd"),
    sampling=SAMPLING,
    instead={"tune": "tunes draft trees of LlamaGen folders; for Janus-Pro folders compare tree shapes with --sweep"},
)
