"""LlamaGen's registry entry: discrete VQ tokens, class- or text-conditional (c2i / t2i), decoded by the shared
speculative loop (ar, EAGLE-2 sd, LANTERN, VVS)."""
from __future__ import annotations

import click

from vvs.families.base import DecodingFlag, Family
from vvs.runtime.options import SKIP_POLICIES, DecodeOptions

SCALE_SIZES = ("GPT-B", "GPT-L", "GPT-XL", "GPT-XXL", "GPT-XXXL", "GPT-1B", "GPT-3B", "GPT-7B")
M = "vvs.families.llamagen"
D = "vvs.discrete"

# What every discrete-token family decoded by this machinery shares (Janus-Pro's entry takes them too).
BENCH_MODES = ("ar", "sd", "lantern", "vvs-uniform", "vvs-dynamic", "sjd", "sjd-pac", "gsd")
MODE_HELP = ("ar, sd, sjd and sjd-pac sample the target's distribution exactly; lantern, vvs and gsd change it by "
             "design, vvs committing a skipped cycle's drafts unverified, gsd accepting a draft for its group of "
             "near-equivalent codes; vvs-uniform and vvs-dynamic name VVS's skip schedule; sjd, sjd-pac and gsd "
             "need no drafter (speculative Jacobi decoding over a window of --window tokens); sjd-pac-official "
             "walks SJD-PAC's tree as its released code does, which changes the distribution")
# The official .pt checkpoints of LlamaGen and MAR carry no config and keep EMA weights beside the model's: one
# option object each, shared with MAR's entry, so the commands show them once. The folder-based official formats
# (Janus-Pro, Lumina-mGPT) say their size in config.json and hold one set of weights.
NAMED_SIZE = click.Option(["--config"], default=None,
                          help="Named size of --checkpoint: GPT-B, GPT-L, GPT-XL, ... (llamagen) or mar_base, "
                               "mar_large, mar_huge (mar). Not needed for vvs files.")
EMA = click.Option(["--ema"], is_flag=True, help="Load the EMA weights of official checkpoints ('ema' / 'model_ema').")
EXPORT_OPTIONS = (
    click.Option(["--precision"], type=click.Choice(["fp32", "fp16", "int8"]), default="fp32", show_default=True,
                 help="fp16: half-precision graphs, the VQ decoder included (RMSNorm, RoPE and the logits stay "
                      "fp32). int8: SmoothQuant W8A8 Q/DQ on the target's block linear layers, calibrated "
                      "on the model's own samples, in an otherwise fp16 graph (the drafter is never quantized)."),
    click.Option(["--weights"], type=click.Choice(["fp32", "int8", "int4"]), default="fp32", show_default=True,
                 help="int8 / int4: every constant matrix of the target's and the drafter's graphs (the heads "
                      "included; not the image decoder) as ONNX Runtime's block-wise MatMulNBits, with no float32 "
                      "copy at run time: a quarter (an eighth) of the weights' memory and bytes streamed per call. "
                      "Exact modes sample the quantised target's distribution exactly. The torch backend runs the "
                      "float32 models; --backend tensorrt-rtx builds int4 (the drafter's plan from the same values "
                      "in float32), TensorRT refuses it. Needs --precision fp32."),
    click.Option(["--drafter-weights"], type=click.Choice(["fp32", "int8", "int4"]), default=None,
                 help="The same for the drafter's graph alone (its layer and the head), the target left float32: "
                      "on a CPU the drafter call streams a quarter (an eighth) of the bytes, and this changes which "
                      "drafts are proposed, never what an exact mode samples. Default: as --weights; not with "
                      "--weights int8 / int4, which covers the drafter already."),
    click.Option(["--no-drafter"], is_flag=True,
                 help="Export without a drafter: the folder runs ar, sjd, sjd-pac and gsd. Also what --checkpoint "
                      "without --drafter exports."),
    click.Option(["--max-draft-top-k"], type=click.IntRange(1, 64), default=10, show_default=True,
                 help="Largest --draft-top-k this folder accepts at run time (draft_tree graphs are built per "
                      "tree shape)."),
    click.Option(["--lantern-k"], type=click.IntRange(1), default=None,
                 help="LANTERN neighbours stored per code (default: the decoding default lantern_k)."),
)
# the prompt-id families' (Janus-Pro, Lumina-mGPT): one option object, so the command shows it once
PROMPT_TOKENS = click.Option(
    ["--prompt-tokens"], type=click.IntRange(4, 4096), default=None,
    help="The longest prompt the folder takes, in tokens with the model's template (shorter ones are left-padded): "
         "the target's prompt slots (default: 64 for a Janus-Pro checkpoint, 128 for a Lumina-mGPT one, whose "
         "instruction template alone takes about 20; 48 for a shipped pair).")
DECODING_FLAGS = (
    DecodingFlag("--temperature", "temperature", float, "Sampling temperature; 0 means greedy."),
    DecodingFlag("--top-k", "top_k", int, "Keep the k most likely tokens (0: all)."),
    DecodingFlag("--top-p", "top_p", float, "Nucleus sampling mass in (0, 1]."),
    DecodingFlag("--cfg", "cfg_scale", float,
                 "Classifier-free guidance scale; guidance applies only above 1 (as in LlamaGen)."),
    DecodingFlag("--tree-size", "tree_size", int, "Draft-tree nodes verified per step, root included."),
    DecodingFlag("--depth", "depth", int, "Tree expansion rounds (paths hold up to depth + 1 drafts)."),
    DecodingFlag("--draft-top-k", "draft_top_k", int, "Children per expanded node."),
    DecodingFlag("--skip-policy", "skip_policy", click.Choice(SKIP_POLICIES), "VVS skip schedule."),
    DecodingFlag("--skip-interval", "skip_interval", int, "uniform: skip one verification every N cycles."),
    DecodingFlag("--sim-threshold", "sim_threshold", float, "dynamic: latent similarity needed to skip."),
    DecodingFlag("--lantern-k", "lantern_k", int, "LANTERN: latent neighbours per drafted token."),
    DecodingFlag("--lantern-delta", "lantern_delta", float, "LANTERN: total-variation budget δ."),
    DecodingFlag("--window", "window", int,
                 "sjd, sjd-pac, gsd: tokens per window forward, root included (0: the paper's, 16 or 64)."),
    DecodingFlag("--pac-tree-width", "pac_tree_width", int, "sjd-pac: candidates per position of its tree."),
    DecodingFlag("--pac-tree-depth", "pac_tree_depth", int, "sjd-pac: that tree's depth, root included (1: none)."),
    DecodingFlag("--gsd-group-size", "gsd_group_size", int, "gsd: codes ranked around a draft that may group."),
    DecodingFlag("--gsd-prob-gap", "gsd_prob_gap", float, "gsd: largest probability gap within a group."),
    DecodingFlag("--gsd-distance", "gsd_distance", float, "gsd: largest squared latent distance in a group."),
)

FAMILY = Family(
    name="llamagen",
    label="LlamaGen",
    summary="discrete VQ tokens, class- or text-conditional; VVS, EAGLE-2, LANTERN",
    options=DecodeOptions,
    bench_modes=BENCH_MODES,
    mode_help=MODE_HELP,
    manifest_schema={"required": ["max_draft_top_k", "tables"],
                     "properties": {"model": {"required": ["vq"]}}},
    model_configs={"target": (f"{M}.gpt:GPTConfig", ("num_image_tokens", "head_dim")),
                   "drafter": (f"{D}.drafter:DrafterConfig", ()), "vq": ("vvs.models.vq:VQConfig", ())},
    condition_kind=lambda manifest: "text" if manifest["model"]["target"]["model_type"] == "t2i" else "class",
    num_classes=lambda manifest: manifest["model"]["target"]["num_classes"],
    export_options=(
        NAMED_SIZE,
        EMA,
        *EXPORT_OPTIONS,
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
    tune="vvs.tune:tune",
    write_defaults=f"{D}.exporter:write_defaults",
    serve=True,
    train_commands=(f"{M}.commands:train_all", f"{M}.commands:train_t2i_cmd", f"{M}.commands:train_drafter_cmd"),
)
