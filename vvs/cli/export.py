"""``vvs-export``: a family's checkpoints (or the shipped model set) -> an engine folder, optionally with
TensorRT / TensorRT-RTX plans. The options common to every family come first; each family adds its own."""
from __future__ import annotations

import time
from pathlib import Path

import click

from vvs.cli.common import FamilyCommand, family_heading, listing, run_command
from vvs.errors import VVSError
from vvs.families.registry import DEFAULT, FAMILIES, family

COMMON = [
    click.Option(["--model"], type=click.Choice(list(FAMILIES)), default=DEFAULT, show_default=True,
                 help="Model family: " + "; ".join(f"{f.name} ({f.summary})" for f in FAMILIES.values()) + "."),
    click.Option(["--checkpoint"], type=click.Path(), default=None,
                 help="Target weights: an official checkpoint file or a vvs .safetensors (llamagen, mar); the "
                      "official Hugging Face folder (janus-pro, lumina-mgpt). Default: the shipped model."),
    click.Option(["--drafter"], type=click.Path(), default=None,
                 help="Drafter: a LANTERN/EAGLE folder or a vvs .safetensors (llamagen, janus-pro, lumina-mgpt); "
                      "the draft MAR's weights (mar). Default: the shipped one."),
    click.Option(["--out"], type=click.Path(file_okay=False), default="engines", show_default=True,
                 help="Engine folder to write; an existing engine folder is replaced only with --force, and only "
                      "once the new one is complete."),
    click.Option(["--force"], is_flag=True, help="Replace an existing engine folder at --out."),
    click.Option(["--backend"], type=click.Choice(["onnxruntime", *dict.fromkeys(
                     b for f in FAMILIES.values() for b in f.build_backends)]), default="onnxruntime",
                 show_default=True,
                 help="tensorrt: also build TensorRT 11 engines (data-centre GPUs; build on the GPU that runs them). "
                      "tensorrt-rtx: also build TensorRT-RTX engines (GeForce / RTX PRO GPUs), ahead of time on any "
                      "machine, no GPU needed."),
    click.Option(["--compute-capability", "compute_capability"], default=None,
                 help="tensorrt-rtx: GPUs to build for, e.g. 8.6,8.9,12.0 (default: every one the builder "
                      "supports)."),
    click.Option(["--max-images"], type=click.IntRange(1, 64), default=8, show_default=True,
                 help="TensorRT: the most images one engine call decodes (the profiles' batch range)."),
]
# an option -> the families that take it (families built on one machinery share option objects); each option once
OWNERS: dict[str, list] = {}
OPTIONS: dict[str, click.Option] = {}
for _family in FAMILIES.values():
    for _option in _family.export_options:
        OWNERS.setdefault(_option.name, []).append(_family)
        OPTIONS.setdefault(_option.name, _option)


def export(model, out, force, backend, compute_capability, max_images, **options):
    from vvs.engines.manifest import update_manifest
    from vvs.export.folder import check_out_dir
    from vvs.models.hub import resolve_options

    start = time.time()
    chosen = family(model)
    check_out_dir(Path(out).resolve(), force)  # before loading anything
    if compute_capability and backend != "tensorrt-rtx":
        raise VVSError("option --compute-capability: needs --backend tensorrt-rtx")
    ctx = click.get_current_context()
    for name, value in options.items():  # another family's option, set: an error, not silently ignored
        owners = OWNERS.get(name)
        param = next((p for p in ctx.command.params if p.name == name), None)
        if owners is not None and chosen not in owners and value != param.get_default(ctx):
            raise VVSError(f"option {OPTIONS[name].opts[0]}: applies to --model "
                           f"{listing([f.name for f in owners], 'or')} only")
    if backend != "onnxruntime" and backend not in chosen.build_backends:
        raise VVSError(f"option --backend {backend}: " + chosen.instead.get(
            backend, f"{chosen.label} folders build {', '.join(chosen.build_backends) or 'no plans'}"))
    if backend != "onnxruntime":  # fail before the export, not after it
        from vvs.engines.manifest import KERNEL
        from vvs.engines.tensorrt_build import BUILDS_WEIGHT_ONLY, check_build_request, parse_compute_capabilities

        for name in ("weights", "drafter_weights"):
            value = options.get(name)
            if value not in (None, "fp32") and value not in BUILDS_WEIGHT_ONLY[backend]:
                raise VVSError(f"option --{name.replace('_', '-')} {value}: ONNX Runtime's {KERNEL[value]}, which "
                               f"{backend} does not build; export it for --backend onnxruntime, or without it for "
                               f"{backend}" + (f" (which takes {' or '.join(BUILDS_WEIGHT_ONLY[backend])})"
                                               if BUILDS_WEIGHT_ONLY[backend] else ""))
        capabilities = parse_compute_capabilities(compute_capability)
        check_build_request(backend, capabilities)
    own = {name: value for name, value in options.items() if name not in OWNERS or chosen in OWNERS[name]}
    if chosen.check_export is not None:  # before a download or a load, which take minutes at 7B
        chosen.call("check_export", own)
    own, sources = resolve_options(own, ctx.command.params, click.echo)  # hub ids -> the hub cache's files
    manifest = chosen.call("export", own, Path(out), force, click.echo)
    if sources:
        manifest = update_manifest(Path(out), sources=sources)
    if backend != "onnxruntime":
        from vvs.engines.tensorrt_build import build_folder

        def report(name, seconds, size):
            click.echo(f"built {backend}/{name}.plan: {size / 1e6:.1f} MB in {seconds:.0f} s")

        manifest = build_folder(Path(out), backend, max_images, capabilities, progress=report)
    total = sum(f["bytes"] for f in manifest["files"].values())
    click.echo(f"wrote {out}/: {len(manifest['graphs'])} graphs ({graph_formats(manifest)}, opset "
               f"{manifest['versions']['opset']}), {len(manifest['files'])} files, {total / 1e6:.1f} MB, in "
               f"{time.time() - start:.0f} s")
    example = ' --prompt "a photo of a cat"' if chosen.takes_prompts(manifest) else ""
    click.echo(f"next: vvs-run --engine {out}{example}")


def graph_formats(manifest: dict) -> str:
    """What the graphs' matrices are stored as, the most common first: ``int4 weights, vq_decode fp32``."""
    from vvs.engines.manifest import graph_weights

    formats: dict[str, list[str]] = {}
    for name in manifest["graphs"]:
        formats.setdefault(graph_weights(manifest, name), []).append(name)
    ranked = sorted(formats, key=lambda f: -len(formats[f]))
    return ", ".join([f"{ranked[0]} weights", *(f"{' and '.join(formats[f])} {f}" for f in ranked[1:])])


export_cmd = FamilyCommand(
    "vvs-export", callback=export,
    params=COMMON + list(OPTIONS.values()),
    family_options={name: family_heading([f.name for f in owners]) for name, owners in OWNERS.items()},
    help="Export a model family's target, drafter and image decoder to ONNX and write an engine folder (graphs, "
         "tables, torch weights, manifest.json). With no checkpoint options it exports the model that ships with vvs.")


def main():
    run_command(export_cmd, "vvs-export")
