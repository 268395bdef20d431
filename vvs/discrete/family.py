"""The registry records of the discrete-token families: what every family decoded by the shared machinery
takes alike (its modes, decoding flags, export options, entry points on :mod:`vvs.discrete`) is stated once here,
and :func:`discrete_family` builds a family's :class:`~vvs.families.base.Family` from what is its own. Like every
registry record, it imports no model code."""
from __future__ import annotations

from typing import Any, Callable

import click

from vvs.families.base import DecodingFlag, Family
from vvs.runtime.options import MAX_PROMPT_TOKENS, SKIP_POLICIES, DecodeOptions

D = "vvs.discrete"

BENCH_MODES = ("ar", "sd", "lantern", "vvs-uniform", "vvs-dynamic", "sjd", "sjd-pac", "gsd")
MODE_HELP = ("ar, sd, sjd and sjd-pac sample the target's distribution exactly; lantern, vvs and gsd change it by "
             "design, vvs committing a skipped cycle's drafts unverified, gsd accepting a draft for its group of "
             "near-equivalent codes; vvs-uniform and vvs-dynamic name VVS's skip schedule; sjd, sjd-pac and gsd "
             "need no drafter (speculative Jacobi decoding over a window of --window tokens); sjd-pac-official "
             "walks SJD-PAC's tree as its released code does, which changes the distribution")
EXPORT_OPTIONS = (
    click.Option(["--precision"], type=click.Choice(["fp32", "fp16", "int8"]), default="fp32", show_default=True,
                 help="fp16: half-precision graphs, the VQ decoder included (RMSNorm, RoPE and the logits stay "
                      "fp32). int8: SmoothQuant W8A8 Q/DQ on the target's block linear layers, calibrated "
                      "on the model's own samples, in an otherwise fp16 graph (the drafter is never quantized)."),
    click.Option(["--weights"], type=click.Choice(["fp32", "int8", "int4", "int4-head8", "w8a8"]), default="fp32",
                 show_default=True,
                 help="int8 / int4: every constant matrix of the target's and the drafter's graphs (the heads "
                      "included; not the image decoder) as ONNX Runtime's block-wise MatMulNBits, with no float32 "
                      "copy at run time: a quarter (an eighth) of the weights' memory and bytes streamed per call. "
                      "int4-head8: int4, but the target's output head int8 (logits nearer float32's, for a few MB). "
                      "w8a8: int8 weights per channel times activations quantised to int8 per row in the graph "
                      "(MatMulInteger; the output head float32): a many-position call (a window, a tree) costs "
                      "little more than a step on CPUs with AVX-512 VNNI or AMX. Exact modes sample exactly the "
                      "distribution of the call that verifies; a quantised position's logits can differ slightly "
                      "between a step and a window (docs/usage.md, Exactness). The torch backend runs the "
                      "float32 models; --backend tensorrt-rtx builds int4 and int4-head8 (the drafter's plan from "
                      "the same values in float32), TensorRT refuses them. Needs --precision fp32."),
    click.Option(["--drafter-weights"], type=click.Choice(["fp32", "int8", "int4"]), default=None,
                 help="The same for the drafter's graph alone (its layer and the head), the target left float32: "
                      "on a CPU the drafter call streams a quarter (an eighth) of the bytes, and this changes which "
                      "drafts are proposed, never what an exact mode samples. Default: as --weights; not with "
                      "--weights int8 / int4, which covers the drafter already."),
    click.Option(["--no-drafter"], is_flag=True,
                 help="Export without a drafter: the folder runs ar, sjd, sjd-pac and gsd. Also what --checkpoint "
                      "without --drafter exports."),
    click.Option(["--torch-weights"], is_flag=True,
                 help="Also store the target's and the drafter's torch weights (a second copy of them): the torch "
                      "backend, vvs-bench --tune's other trees and --scale otherwise read them back from the graphs, "
                      "which an int8 folder's target graphs (SmoothQuant's integers) do not allow."),
    click.Option(["--max-draft-top-k"], type=click.IntRange(1, 64), default=10, show_default=True,
                 help="Largest --draft-top-k this folder accepts at run time (draft_tree graphs are built per "
                      "tree shape)."),
    click.Option(["--lantern-k"], type=click.IntRange(1), default=None,
                 help="LANTERN neighbours stored per code (default: the decoding default lantern_k)."),
)
# the prompt-id families' (Janus-Pro, Lumina-mGPT): one option object, so the command shows it once
PROMPT_TOKENS = click.Option(
    ["--prompt-tokens"], type=click.IntRange(4, MAX_PROMPT_TOKENS), default=None,
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


def _text(manifest: dict) -> str:
    return "text"


def _no_classes(manifest: dict) -> int:
    return 0


def discrete_family(*, name: str, label: str, summary: str, package: str, target_config: tuple[str, tuple[str, ...]],
                    scale_sizes: tuple[str, ...], train_commands: tuple[str, ...], prompt_ids: bool = False,
                    vq_config: str = "vvs.models.vq:VQConfig", condition_kind: Callable[[dict], str] = _text,
                    num_classes: Callable[[dict], int] = _no_classes, checkpoint_options: tuple[click.Option, ...] = (),
                    export_options: tuple[click.Option, ...] = (), tunes: bool = False,
                    sampling: dict[str, Any] | None = None, script_sampling: dict[str, dict] | None = None,
                    instead: dict[str, str] | None = None) -> Family:
    """The record of a discrete-token family whose package offers ``bundle:export_from_options`` and
    ``arch:ARCH``. ``target_config``: its target's config class (``"module:Class"``) and the sizes the loaders
    derive from it; ``prompt_ids``: the target reads prompt ids through its own tokenizer (the folder carries it,
    ``--prompt-tokens`` sizes its slots); ``checkpoint_options`` come before the shared export options (how an
    official checkpoint is read), ``export_options`` after them; ``tunes``: ``vvs-bench --tune`` picks its draft
    trees. Conditions default to text with no classes (a prompt-id family's)."""
    return Family(
        name=name,
        label=label,
        summary=summary,
        options=DecodeOptions,
        bench_modes=BENCH_MODES,
        mode_help=MODE_HELP,
        manifest_schema={"required": ["max_draft_top_k", "tables", *(["prompts"] if prompt_ids else [])],
                         "properties": {"model": {"required": ["vq"]}}},
        model_configs={"target": target_config, "drafter": (f"{D}.drafter:DrafterConfig", ()), "vq": (vq_config, ())},
        condition_kind=condition_kind,
        num_classes=num_classes,
        export_options=(*checkpoint_options, *EXPORT_OPTIONS, *export_options,
                        *((PROMPT_TOKENS,) if prompt_ids else ())),
        decoding_flags=DECODING_FLAGS,
        export=f"{package}.bundle:export_from_options",
        check_export=f"{D}.exporter:check_options",
        load_engines=f"{D}.engines:load_engines",
        check_options=f"{D}.engines:check_folder_options",
        pipeline="vvs.runtime.pipeline:Pipeline",
        instruments=f"{D}.engines:quality_instruments",
        tensorrt_profiles=f"{D}.exporter:tensorrt_profiles",
        target_arch=f"{package}.arch:ARCH",
        scale=f"{D}.scale:scale_folder",
        scale_sizes=scale_sizes,
        describe_scale=f"{D}.scale:describe",
        tune="vvs.tune:tune" if tunes else None,
        write_defaults=f"{D}.exporter:write_defaults" if tunes else None,
        serve=True,
        train_commands=train_commands,
        instead=instead or {},
        sampling=sampling or {},
        script_sampling=script_sampling or {},
    )
