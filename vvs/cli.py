"""Command-line entry points: vvs-export, vvs-run, vvs-bench, vvs-train, vvs-serve.

Every user error (bad option, bad file, bad folder) is printed as one line ``<prog>: error: ...`` and exits
with code 2; nothing half-written is left behind (writers use a temporary name and rename).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import click

from vvs.errors import VVSError
from dataclasses import fields

from vvs.runtime.options import ACCEPT_RULES, MAR_MODE_NAMES, MODE_NAMES, DecodeOptions, MAROptions, OptionsError


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered like Ctrl-C so that the same clean-up runs."""


_signalled: list[KeyboardInterrupt] = []  # the interrupt this process received, if any


def _interrupt(signum, frame):
    _signalled.append(Terminated() if signum == signal.SIGTERM else KeyboardInterrupt())
    raise _signalled[-1]


def _main(command: click.Command, prog: str) -> None:
    """Run a command: usage errors as one line and exit 2; Ctrl-C exits 130 and SIGTERM 143 after the clean-up
    (finished images kept, the scheduler stopped at a cycle boundary). Libraries may turn the interrupt into an
    error of their own (torch's exporter does, when it lands inside an import): any error after the signal is
    the interrupt."""
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        try:
            command.main(prog_name=prog, standalone_mode=False)
        except Exception as err:
            if _signalled and not isinstance(err, (click.exceptions.Exit, click.Abort)):
                raise _signalled[-1] from None
            raise
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as err:
        click.echo(f"{prog}: error: {err.format_message()} (see {prog} --help)", err=True)
        sys.exit(2)
    except OptionsError as err:
        click.echo(f"{prog}: error: {flag_message(err)}", err=True)
        sys.exit(2)
    except VVSError as err:
        click.echo(f"{prog}: error: {err}", err=True)
        sys.exit(2)
    except (click.Abort, KeyboardInterrupt):
        terminated = bool(_signalled) and isinstance(_signalled[-1], Terminated)  # every signal is recorded
        click.echo(f"{prog}: {'terminated' if terminated else 'interrupted'}", err=True)
        sys.exit(143 if terminated else 130)


# --------------------------------------------------------------------------- vvs-export

model_options = [
    click.option("--model", type=click.Choice(["llamagen", "mar"]), default="llamagen", show_default=True,
                 help="Model family: llamagen (discrete VQ tokens; VVS, EAGLE-2, LANTERN) or mar (continuous tokens; "
                      "continuous speculative decoding)."),
    click.option("--config", "config", default=None,
                 help="Named size of --checkpoint: GPT-B, GPT-L, GPT-XL, ... (llamagen) or mar_base, mar_large, "
                      "mar_huge (mar). Not needed for vvs files."),
    click.option("--t2i", is_flag=True, help="The checkpoint is text-conditional (120 caption slots)."),
    click.option("--grid-size", type=click.IntRange(1), default=None,
                 help="Token grid side of --checkpoint: 16 (256 px, default), 24 (384 px), 32 (512 px)."),
    click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
                 help="Target GPT weights (official .pt or vvs .safetensors). Default: the shipped model."),
    click.option("--vq", type=click.Path(dir_okay=False), default=None,
                 help="VQ tokenizer weights. Default: the shipped tokenizer."),
    click.option("--vq-config", default=None, help="Named VQ size of --vq (VQ-16, VQ-8). Not needed for vvs files."),
    click.option("--drafter", type=click.Path(), default=None,
                 help="Drafter: a LANTERN/EAGLE folder or a vvs .safetensors (llamagen); the draft MAR's weights "
                      "(mar). Default: the shipped one."),
    click.option("--draft-config", default=None, help="mar: named size of an official --drafter (e.g. mar_base)."),
    click.option("--vae", type=click.Path(dir_okay=False), default=None,
                 help="mar: MAR's KL-16 VAE (official kl16.ckpt) for official checkpoints."),
    click.option("--ema", is_flag=True, help="Load the EMA weights of official checkpoints ('ema' / 'model_ema')."),
]


def with_model_options(fn):
    for option in reversed(model_options):
        fn = option(fn)
    return fn


@click.command(help="Export the target, drafter and VQ decoder to ONNX and write an engine folder "
                    "(graphs, tables, torch weights, manifest.json). With no checkpoint options it exports the "
                    "model that ships with vvs.")
@with_model_options
@click.option("--precision", type=click.Choice(["fp32", "fp16", "int8"]), default="fp32", show_default=True,
              help="fp16: half-precision graphs, the VQ decoder included (RMSNorm, RoPE and the logits stay fp32). "
                   "int8: SmoothQuant W8A8 Q/DQ on the target's linear layers, calibrated on the model's own "
                   "samples, in an otherwise fp16 graph (the drafter is never quantized).")
@click.option("--out", type=click.Path(file_okay=False), default="engines", show_default=True,
              help="Engine folder to write; an existing engine folder is replaced only with --force, and only once "
                   "the new one is complete.")
@click.option("--force", is_flag=True, help="Replace an existing engine folder at --out.")
@click.option("--max-draft-top-k", type=click.IntRange(1, 64), default=10, show_default=True,
              help="Largest --draft-top-k this folder accepts at run time (draft_tree graphs are built per tree shape).")
@click.option("--lantern-k", type=click.IntRange(1), default=None,
              help="LANTERN neighbours stored per code (default: the decoding default lantern_k).")
@click.option("--backend", type=click.Choice(["onnxruntime", "tensorrt", "tensorrt-rtx"]), default="onnxruntime",
              show_default=True,
              help="tensorrt: also build TensorRT 11 engines (data-centre GPUs; build on the GPU that runs them). "
                   "tensorrt-rtx: also build TensorRT-RTX engines (GeForce / RTX PRO GPUs), ahead of time on any "
                   "machine, no GPU needed.")
@click.option("--compute-capability", "compute_capability", default=None,
              help="tensorrt-rtx: GPUs to build for, e.g. 8.6,8.9,12.0 (default: every one the builder supports).")
@click.option("--max-images", type=click.IntRange(1, 64), default=8, show_default=True,
              help="TensorRT: the most images one engine call decodes (the profiles' batch range).")
@click.option("--text-encoder", type=str, default=None,
              help="--t2i: the T5-family encoder the target was trained with (FLAN-T5-XL for LlamaGen's t2i "
                   "checkpoints), a folder or name transformers loads; exported with its tokenizer as the "
                   "text_encode graph, so prompts work with no other files.")
def export_cmd(model, config, t2i, grid_size, checkpoint, vq, vq_config, drafter, draft_config, vae, ema, precision,
               out, force, max_draft_top_k, lantern_k, backend, compute_capability, max_images, text_encoder):
    import time

    from vvs.export.exporter import check_out_dir, export_folder
    from vvs.models.bundle import load_bundle, shipped_info, shipped_text_encoder

    start = time.time()
    check_out_dir(Path(out).resolve(), force)  # before loading anything
    if compute_capability and backend != "tensorrt-rtx":
        raise VVSError("option --compute-capability: needs --backend tensorrt-rtx")
    check_family_options(model, t2i=t2i, grid_size=grid_size, vq=vq, vq_config=vq_config, draft_config=draft_config,
                         vae=vae, precision=None if precision == "fp32" else precision, text_encoder=text_encoder)
    if text_encoder and not t2i:
        raise VVSError("option --text-encoder: needs --t2i (class-conditional targets take class ids, not text)")
    if backend == "tensorrt" and model == "mar":
        raise VVSError("option --backend tensorrt: MAR folders build for tensorrt-rtx only so far; use --backend "
                       "tensorrt-rtx or onnxruntime")
    if backend != "onnxruntime":  # fail before the export, not after it
        from vvs.engines.tensorrt_build import check_build_request, parse_compute_capabilities

        capabilities = parse_compute_capabilities(compute_capability)
        check_build_request(backend, capabilities)
    if model == "mar":
        manifest = export_mar(checkpoint, config, drafter, draft_config, vae, ema, Path(out), force)
    else:
        bundle = load_bundle(checkpoint, config, vq, vq_config, drafter, t2i=t2i, ema=ema, grid_size=grid_size)
        click.echo(bundle.summary())
        shipped = shipped_info() if not (checkpoint or drafter or vq) else None
        extra, defaults = {}, {}
        if shipped and t2i:  # the shipped text-to-image pair, with its own encoder unless another is given
            extra = {"image_size": shipped["image_size"]}
            defaults = shipped_info("shipped_t2i.json")["decoding_defaults"]
            text_encoder = text_encoder or str(shipped_text_encoder())
        elif shipped:
            extra = {"classes": [c["name"] for c in shipped["classes"]], "image_size": shipped["image_size"]}
            defaults = shipped["decoding_defaults"]
        encoder = None
        if text_encoder:
            from vvs.text.export import load_text_encoder

            encoder = load_text_encoder(text_encoder, bundle.target.config.caption_dim)
        manifest = export_folder(bundle, Path(out), precision, max_draft_top_k, lantern_k, defaults, extra,
                                 force=force, text_encoder=encoder)
    if backend != "onnxruntime":
        from vvs.engines.tensorrt_build import build_folder

        def report(name, seconds, size):
            click.echo(f"built {backend}/{name}.plan: {size / 1e6:.1f} MB in {seconds:.0f} s")

        manifest = build_folder(Path(out), backend, max_images, capabilities, progress=report)
    total = sum(f["bytes"] for f in manifest["files"].values())
    click.echo(f"wrote {out}/: {len(manifest['graphs'])} graphs ({precision}, opset {manifest['versions']['opset']}), "
               f"{len(manifest['files'])} files, {total / 1e6:.1f} MB, in {time.time() - start:.0f} s")
    example = ' --prompt "a photo of a cat"' if "text" in manifest else ""
    click.echo(f"next: vvs-run --engine {out}{example}")


LLAMAGEN_ONLY = {"t2i": "--t2i", "grid_size": "--grid-size", "vq": "--vq", "vq_config": "--vq-config",
                 "precision": "--precision", "text_encoder": "--text-encoder"}
MAR_ONLY = {"draft_config": "--draft-config", "vae": "--vae"}


def check_family_options(model: str, **given) -> None:
    """Options of the other model family are an error, not silently ignored."""
    wrong = LLAMAGEN_ONLY if model == "mar" else MAR_ONLY
    for name, flag in wrong.items():
        if given.get(name):
            other = "llamagen" if model == "mar" else "mar"
            raise VVSError(f"option {flag}: applies to --model {other} only"
                           + (" (MAR folders are fp32)" if name == "precision" else ""))


def export_mar(checkpoint, config, drafter, draft_config, vae, ema, out: Path, force: bool) -> dict:
    from vvs.export.mar_exporter import export_mar_folder
    from vvs.models.bundle import load_mar_bundle

    bundle = load_mar_bundle(checkpoint, config, drafter, draft_config, vae, ema=ema)
    click.echo(bundle.summary())
    extra = {"classes": bundle.classes} if bundle.classes else {}
    return export_mar_folder(bundle.target, bundle.draft, bundle.tokenizer, out, bundle.image_size,
                             bundle.decoding_defaults, extra, force=force)


# --------------------------------------------------------------------------- vvs-run

PUBLISHED = DecodeOptions()
# decoding flag -> DecodeOptions field, with its help; defaults come from the engine folder's manifest
DECODING_FLAGS = {
    "--temperature": ("temperature", float, "Sampling temperature; 0 means greedy."),
    "--top-k": ("top_k", int, "Keep the k most likely tokens (0: all)."),
    "--top-p": ("top_p", float, "Nucleus sampling mass in (0, 1]."),
    "--cfg": ("cfg_scale", float, "Classifier-free guidance scale; guidance applies only above 1 (as in LlamaGen)."),
    "--tree-size": ("tree_size", int, "Draft-tree nodes verified per step, root included."),
    "--depth": ("depth", int, "Tree expansion rounds (paths hold up to depth + 1 drafts)."),
    "--draft-top-k": ("draft_top_k", int, "Children per expanded node."),
    "--skip-policy": ("skip_policy", click.Choice(["uniform", "dynamic"]), "VVS skip schedule."),
    "--skip-interval": ("skip_interval", int, "uniform: skip one verification every N cycles."),
    "--sim-threshold": ("sim_threshold", float, "dynamic: latent similarity needed to skip."),
    "--lantern-k": ("lantern_k", int, "LANTERN: latent neighbours per drafted token."),
    "--lantern-delta": ("lantern_delta", float, "LANTERN: total-variation budget δ."),
    "--num-iter": ("num_iter", int, "MAR: generation steps."),
    "--draft-steps": ("draft_steps", int, "MAR cspd: draft steps per verification."),
    "--accept-rule": ("accept_rule", click.Choice(ACCEPT_RULES),
                      "MAR cspd acceptance: exact (last denoising step) and trajectory (the whole aligned chain) are "
                      "lossless; official is the released code's rule (lossy), for comparing with the paper."),
    "--official-windows": ("official_windows", bool, "MAR cspd: verify at steps that are multiples of "
                           "--draft-steps, each window guided by its last step's scale, as the release."),
}
FLAG_OF = {field: flag for flag, (field, _, _) in DECODING_FLAGS.items()}


def _published(field: str):
    return getattr(PUBLISHED, field) if hasattr(PUBLISHED, field) else getattr(MAROptions(), field)


decoding_options = [
    click.option(flag, field, default=None, **({"is_flag": True} if kind is bool else {"type": kind}),
                 help=f"{text} Default: the engine folder's (published: {_published(field)}).")
    for flag, (field, kind, text) in DECODING_FLAGS.items()
]


def family_overrides(decoding: dict, mar: bool) -> dict:
    """The decoding flags given, checked against the folder's model family."""
    options = MAROptions if mar else DecodeOptions
    known = {f.name for f in fields(options)}
    given = {k: v for k, v in decoding.items() if v is not None}
    for name in given:
        if name not in known:
            family = "LlamaGen" if mar else "MAR"
            raise VVSError(f"option {FLAG_OF[name]}: applies to {family} engine folders only; this folder holds a "
                           f"{'MAR' if mar else 'LlamaGen'} model")
    return given


def flag_message(err: OptionsError) -> str:
    """An option error in the words the user typed: the flag, not the internal field."""
    if err.option not in FLAG_OF:
        return str(err)
    value = err.value if isinstance(err.value, (int, float)) else repr(err.value)
    return f"option {FLAG_OF[err.option]} {value}: {err.why}"


def with_decoding_options(fn):
    for option in reversed(decoding_options):
        fn = option(fn)
    return fn


def split_values(values: tuple[str, ...]) -> list[str]:
    """Repeatable options that also take comma-separated lists: ``--mode ar,sd --mode vvs``."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def resolve_modes(values: tuple[str, ...], default: list[str], names: dict = MODE_NAMES) -> list[str]:
    modes = split_values(values) or default
    unknown = [m for m in modes if m not in names]
    if unknown:
        raise VVSError(f"option --mode {unknown[0]!r}: unknown; choose from {', '.join(names)}")
    return modes


def resolve_classes(values: tuple[str, ...], names: list[str] | None, num_classes: int, count: int) -> list[int]:
    """Class ids from ``--class`` values (ids or names, repeatable or comma-separated), cycled to ``count``."""
    values = split_values(values)
    if not values:
        return [i % num_classes for i in range(count)]
    ids = []
    for v in values:
        if v.isascii() and v.lstrip("-").isdigit():
            ids.append(int(v))
        elif names and v in names:
            ids.append(names.index(v))
        else:
            known = f"; known names: {', '.join(names)}" if names else ""
            raise VVSError(f"option --class {v!r}: not a class id or name{known}")
    for i in ids:
        if not 0 <= i < num_classes:
            raise VVSError(f"option --class {i}: out of range, the model has {num_classes} classes (0-{num_classes - 1})")
    if count < len(ids):
        raise VVSError(f"option --num-images {count}: fewer than the {len(ids)} classes given; ask for at least "
                       f"{len(ids)} images (the classes repeat in turn) or give fewer classes")
    return [ids[i % len(ids)] for i in range(count)]


def resolve_conditions(engine_dir, manifest: dict, classes, prompts, prompts_file, count: int | None,
                       class_default: int) -> list:
    """Each image's condition: prompts for a text-conditional folder (``--class`` refused; the folder must hold its
    text encoder), else class ids (``--prompt`` refused). ``count`` images, or one per prompt, or ``class_default``
    classes in turn."""
    from vvs.engines.manifest import is_mar

    mar, target = is_mar(manifest), manifest["model"]["target"]
    if not mar and target["model_type"] == "t2i":
        if classes:
            raise VVSError("option --class: this folder's model is text-conditional; give --prompt or --prompts")
        if "text" not in manifest:
            raise VVSError(f"{engine_dir}: has no text encoder, so prompts cannot be encoded; re-export it with "
                           "vvs-export --t2i --text-encoder, or pass caption embeddings to the Pipeline API")
        return resolve_prompts(prompts, prompts_file, count)
    if prompts or prompts_file:
        raise VVSError(f"option {'--prompt' if prompts else '--prompts'}: this folder's model is class-conditional; "
                       "give --class")
    num_classes = target["class_num"] if mar else target["num_classes"]
    return resolve_classes(classes, manifest["model"].get("classes"), num_classes, count or class_default)


def resolve_prompts(prompts: tuple[str, ...], prompts_file: str | None, count: int | None) -> list[str]:
    """Prompts from ``--prompt`` (repeatable) then ``--prompts FILE`` (one a line, blank lines skipped), cycled to
    ``count``."""
    texts = list(prompts)
    if prompts_file is not None:
        try:
            lines = Path(prompts_file).read_bytes().decode("utf-8").splitlines()
        except FileNotFoundError:
            raise VVSError(f"option --prompts {prompts_file}: the file does not exist") from None
        except UnicodeDecodeError as err:
            line = Path(prompts_file).read_bytes()[: err.start].count(b"\n") + 1
            raise VVSError(f"option --prompts {prompts_file}: line {line} is not UTF-8; save the file as UTF-8") \
                from None
        except OSError as err:
            raise VVSError(f"option --prompts {prompts_file}: cannot read it ({err.strerror or err})") from None
        texts += [line for line in lines if line.strip()]
    if not texts:
        raise VVSError("this folder's model is text-conditional: give --prompt TEXT or --prompts FILE")
    for i, text in enumerate(texts):
        if not text.strip():
            raise VVSError(f"option --prompt: prompt {i + 1} is empty; describe the image to generate")
    count = count or len(texts)
    if count < len(texts):
        raise VVSError(f"option --num-images {count}: fewer than the {len(texts)} prompts given; ask for at least "
                       f"{len(texts)} images (the prompts repeat in turn) or give fewer prompts")
    return [texts[i % len(texts)] for i in range(count)]


def resolve_seeds(text: str, count: int) -> list[int]:
    """``--seed S`` (image i gets S + i) or ``--seed S1,S2,...`` (one per image)."""
    from vvs.runtime.random import image_seeds

    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise VVSError(f"option --seed {text!r}: give a non-negative integer, or one per image separated by commas")
    try:
        return image_seeds(int(parts[0]) if len(parts) == 1 else [int(p) for p in parts], count)
    except VVSError as err:
        raise VVSError(f"option --{err}") from None


MAX_IMAGES = 100_000  # per mode; more is almost certainly a typo


def mode_option(default: str):
    return click.option("--mode", "modes", multiple=True,
                        help=f"{', '.join(MODE_NAMES)} (vvs-uniform / vvs-dynamic: VVS with that skip schedule); "
                             "ar and sd sample the target's distribution exactly, lantern and vvs change it by design "
                             "(a skipped cycle's drafts are committed unverified); MAR folders: ar, cspd. Repeat or "
                             f"comma-separate to compare on the same classes and seeds. Default: {default}.")


def engine_options(fn):
    """--engine, --backend, --device: which folder, and how to run it."""
    fn = click.option("--device", default=None, help="cpu, cuda or cuda:N (default: what the backend finds).")(fn)
    fn = click.option("--backend", type=click.Choice(["auto", "onnxruntime", "torch", "tensorrt", "tensorrt-rtx"]),
                      default="auto", show_default=True,
                      help="auto: TensorRT plans when built and installed, else ONNX Runtime.")(fn)
    return click.option("--engine", "engine_dir", type=click.Path(), default="engines", show_default=True,
                        help="Engine folder.")(fn)


class_option = click.option("--class", "classes", multiple=True,
                            help="Class id or name; repeat or comma-separate. Default: every class in turn.")
num_images_option = click.option("--num-images", type=click.IntRange(1, MAX_IMAGES), default=None,
                                 help="Images per mode (default: one per --class or prompt, or 4; vvs-bench: 16).")


def prompt_options(fn):
    """--prompt, --prompts: what text-to-image folders draw."""
    fn = click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
                      help="Text-to-image: a UTF-8 file of prompts, one a line (e.g. MS-COCO captions).")(fn)
    return click.option("--prompt", "prompts", multiple=True,
                        help="Text-to-image: a prompt; repeat for more (cleaned and encoded as LlamaGen does).")(fn)


@click.command(help="Generate images from an engine folder and report decoding statistics. Modes: ar (vanilla), "
                    "sd (EAGLE-2 speculative decoding), lantern (relaxed acceptance), vvs (verification skipping). "
                    "Defaults come from the folder's manifest.")
@engine_options
@mode_option("the folder's default mode")
@class_option
@prompt_options
@num_images_option
@click.option("--batch-size", type=click.IntRange(1, 256), default=8, show_default=True, help="Images decoded together.")
@click.option("--seed", default="0", show_default=True,
              help="S: image i gets seed S + i; or S1,S2,... one seed per image. An image depends only on its class, "
                   "seed and options, never on the images decoded beside it.")
@with_decoding_options
@click.option("--threads", type=click.IntRange(1, 1024), default=None, help="CPU threads for the backend.")
@click.option("--out", type=click.Path(file_okay=False), default="outputs", show_default=True,
              help="Folder for the PNGs and grids (refused when it holds files, unless --overwrite).")
@click.option("--overwrite", is_flag=True, help="Replace the files an earlier run wrote to --out.")
@click.option("--stats-json", type=click.Path(dir_okay=False), default=None, help="Write per-image statistics here.")
@click.option("--save-tokens", type=click.Path(dir_okay=False), default=None, help="Write token ids (.npy) here.")
def run_cmd(engine_dir, backend, device, modes, classes, prompts, prompts_file, num_images, batch_size, seed, threads,
            out, overwrite, stats_json, save_tokens, **decoding):
    from tqdm import tqdm

    from vvs.engines import load_engines
    from vvs.engines.manifest import is_mar, read_manifest
    from vvs.output import RunWriter
    from vvs.runtime.pipeline import as_conditions

    manifest = read_manifest(Path(engine_dir))
    mar = is_mar(manifest)
    mode_names = MAR_MODE_NAMES if mar else MODE_NAMES
    modes = resolve_modes(modes, [], mode_names)
    overrides = family_overrides(decoding, mar)
    names = manifest["model"].get("classes")
    labels = resolve_conditions(engine_dir, manifest, classes, prompts, prompts_file, num_images,
                                len(split_values(classes)) or 4)
    seeds = resolve_seeds(seed, len(labels))
    engines = load_engines(engine_dir, backend, device, threads)
    pipe = make_pipeline(engines, batch_size)
    modes = modes or [pipe.options.mode]
    for mode in modes:  # every mode's options are checked before the first image
        pipe.options_for(**{**mode_names[mode], **overrides})
    writer = RunWriter(Path(out), stats_json, save_tokens, overwrite)  # checks every output path before any work
    try:
        with tqdm(total=len(modes) * len(labels), desc="generate", unit="img", dynamic_ncols=True) as bar:
            for mode in modes:
                for start in range(0, len(labels), batch_size):
                    chunk = labels[start : start + batch_size]
                    bar.set_postfix_str(mode)
                    result = pipe.generate(as_conditions(chunk), seed=seeds[start : start + batch_size],
                                           **{**mode_names[mode], **overrides})
                    writer.add(mode, start, chunk, result, names)
                    bar.update(len(chunk))
                writer.grid(mode)
        writer.finish(engines.backend)
    except KeyboardInterrupt:
        writer.keep_finished()
        raise
    finally:
        writer.close()


def make_pipeline(engines, max_batch: int):
    """The pipeline of the engine set's model family."""
    from vvs.engines.mar import MAREngineSet

    if isinstance(engines, MAREngineSet):
        from vvs.runtime.mar_pipeline import MARPipeline

        return MARPipeline(engines, max_batch=max_batch)
    from vvs.runtime.pipeline import Pipeline

    return Pipeline(engines, max_batch=max_batch)


def export_main():
    _main(export_cmd, "vvs-export")


def run_main():
    _main(run_cmd, "vvs-run")


# --------------------------------------------------------------------------- vvs-bench


@click.command(help="Run decoding modes side by side on the same classes and seeds (interleaved, warm-up "
                    "excluded): TPF, forwards, skips, seconds per image and speed-up vs ar from the same run, and "
                    "for the shipped model class accuracy, domain FID and NLL with AR's seed-to-seed spread. "
                    "The default run decodes 240 images (5 modes x 16 images x 3 seed sets): about 10 minutes on 2 "
                    "CPU cores with the shipped model; --num-images 4 --num-seeds 1 for a quick look. "
                    "Writes results.json, table.md, pareto.png and sample grids. --tune picks the tree and skip "
                    "interval fastest on this machine and stores them as the engine folder's defaults.")
@engine_options
@mode_option("ar,sd,lantern,vvs-uniform,vvs-dynamic")
@class_option
@prompt_options
@num_images_option
@click.option("--seed", type=click.IntRange(0, 2**62), default=0, show_default=True,
              help="Base seed: seed set j gives image i the seed S + 1000 j + i.")
@click.option("--num-seeds", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="Seed sets per setting (the quality spread is measured across them).")
@click.option("--batch-size", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Images decoded together (1 = latency).")
@click.option("--sweep", multiple=True, help="KEY=V1,V2 (skip_interval, sim_threshold, delta, lantern_k, tree_size, "
                                             "depth, draft_top_k; MAR: num_iter, draft_steps, accept_rule); "
                                             "repeatable, one key at a time.")
@with_decoding_options
@click.option("--threads", type=click.IntRange(1, 1024), default=None, help="CPU threads for the backend.")
@click.option("--tune", is_flag=True, help="Tune tree and skip interval for this machine and save them as defaults.")
@click.option("--scale", default=None, metavar="SIZE",
              help="Measure at an official size's compute cost (GPT-B, GPT-L, GPT-XL, ...): the folder's target and "
                   "drafter are inflated to SIZE, computing the same tokens, and exported once to "
                   "<engine>-scale/SIZE; acceptance stays the folder's pair's, the code vocabulary its own.")
@click.option("--out", type=click.Path(file_okay=False), default="bench-results", show_default=True,
              help="Folder for results.json, table.md, pareto.png and sample grids.")
def bench_cmd(engine_dir, backend, device, modes, classes, prompts, prompts_file, num_images, seed, num_seeds,
              batch_size, sweep, threads, tune, scale, out, **decoding):
    from vvs.bench import (OPTION_OF, load_instruments, machine, make_settings, parse_sweep, run_benchmark,
                           write_results)
    from vvs.engines import load_engines
    from vvs.engines.manifest import MANIFEST, is_mar, read_manifest
    from vvs.output import ensure_writable_dir
    from vvs.scale import OFFICIAL_SIZES, describe, scale_folder

    manifest = read_manifest(Path(engine_dir))
    mar = is_mar(manifest)
    if scale is not None and (tune or mar or scale not in OFFICIAL_SIZES):
        raise VVSError(f"option --scale {scale!r}: " + (
            "tune on the folder itself (--tune), then measure the tuned defaults with --scale" if tune else
            "inflates LlamaGen folders; this is a MAR folder" if mar else f"choose one of {', '.join(OFFICIAL_SIZES)}"))
    if mar and tune:
        raise VVSError("option --tune: tunes draft trees of LlamaGen folders; for MAR folders compare --draft-steps "
                       "with --sweep draft_steps=4,8,16")
    ensure_writable_dir(Path(out))
    if tune and not os.access(Path(engine_dir) / MANIFEST, os.W_OK):
        raise VVSError(f"option --tune: {Path(engine_dir) / MANIFEST} is not writable, so the tuned defaults could "
                       "not be saved; copy the folder somewhere writable")
    labels = resolve_conditions(engine_dir, manifest, classes, prompts, prompts_file, num_images,
                                max(16, len(split_values(classes))))
    num_images = len(labels)
    instruments = load_instruments(Path(engine_dir), manifest)  # an inflated pair's quality is its source's
    if scale is not None:
        ensure_writable_dir(Path(engine_dir).parent)
        engine_dir = scale_folder(Path(engine_dir), scale)
        click.echo(describe(read_manifest(engine_dir)))
    if instruments is not None and num_images < 2:
        raise VVSError("option --num-images: the quality statistics (FID) need at least 2 images per seed set")
    mode_names = MAR_MODE_NAMES if mar else MODE_NAMES
    default_modes = ["ar", "cspd"] if mar else "ar,sd,lantern,vvs-uniform,vvs-dynamic".split(",")
    swept = parse_sweep(sweep)
    settings = make_settings(resolve_modes(modes, default_modes, mode_names), swept, mode_names)
    overrides = family_overrides(decoding, mar)
    engines = load_engines(engine_dir, backend, device, threads)
    pipe = make_pipeline(engines, batch_size)
    pipe.options = pipe.options_for(**overrides)
    for s in settings:  # every setting before any long work (tuning, the runs), named as the user gave it
        try:
            pipe.options_for(**s.overrides)
        except OptionsError as err:
            key = next((k for k in swept if OPTION_OF.get(k, k) == err.option), None)
            if key is None:
                raise
            raise VVSError(f"option --sweep {key}={err.value}: {err.why}") from None
    labels = labels[:num_images]
    if tune:
        from vvs.export.exporter import write_defaults
        from vvs.tune import tune as run_tune

        best, record = run_tune(pipe, labels, num_seeds, instruments, log=click.echo)
        write_defaults(Path(engine_dir), best.to_dict(), record)
        click.echo(f"saved as the defaults of {engine_dir}/manifest.json")
        pipe.options = best
    results, samples = run_benchmark(pipe, settings, labels, num_seeds, batch_size, instruments, base_seed=seed)
    results.update({"engine": str(engine_dir), "backend": engines.backend, "machine": machine(),
                    "num_images": num_images, "seed": seed, "num_seeds": num_seeds, "batch_size": batch_size,
                    "defaults": pipe.options.to_dict(), "scale": describe(read_manifest(Path(engine_dir)))})
    write_results(results, Path(out), samples)
    from vvs.bench import markdown_table

    click.echo(markdown_table(results))
    click.echo(f"wrote {out}/results.json, table.md, pareto.png and sample grids")


def bench_main():
    _main(bench_cmd, "vvs-bench")


@click.group(help="Train models: reproduce the shipped model set, or train a drafter for your own target.")
def train_cmd():
    pass


@train_cmd.command("all", help="Reproduce the shipped weights (tokenizer, target, drafter, classifier) from a "
                               "fixed seed. Resumable: rerun the same command after an interruption.")
@click.option("--out", type=click.Path(file_okay=False), default="runs/shipped", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def train_all(out, seed):
    from vvs.output import ensure_writable_dir
    from vvs.train.shipped import reproduce

    ensure_writable_dir(Path(out))
    weights = reproduce(Path(out), seed)
    click.echo(f"wrote {weights} (copy its files to vvs/weights/ to ship them); curves: {Path(out) / 'training_curves.png'}")


@train_cmd.command("decoder", help="Retrain a VQ tokenizer's decoder with reflection padding (how the shipped one "
                                   "was made): encoder and codebook stay frozen, so its codes and every model "
                                   "trained on them stay valid. Resumable.")
@click.option("--vq", type=click.Path(dir_okay=False, exists=True), required=True,
              help="The tokenizer whose decoder is retrained.")
@click.option("--out", type=click.Path(file_okay=False), default="runs/decoder", show_default=True)
@click.option("--seed", type=int, default=2, show_default=True)
def train_decoder_cmd(vq, out, seed):
    from vvs.output import ensure_writable_dir
    from vvs.train.decoder import reship_decoder

    ensure_writable_dir(Path(out))
    weights = reship_decoder(Path(out), Path(vq), seed)
    click.echo(f"wrote {weights} (copy vq.safetensors and shipped.json to vvs/weights/ to ship them)")


@train_cmd.command("mar", help="Reproduce the shipped MAR pair (target and draft, continuous tokens) on the shipped "
                               "VQ tokenizer's latents. Resumable.")
@click.option("--out", type=click.Path(file_okay=False), default="runs/mar", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--vq", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The VQ tokenizer whose latents the pair models. Default: the shipped one.")
def train_mar_cmd(out, seed, vq):
    from vvs.models.bundle import shipped_path
    from vvs.output import ensure_writable_dir
    from vvs.train.mar import reproduce_mar

    ensure_writable_dir(Path(out))
    weights = reproduce_mar(Path(out), Path(vq) if vq else shipped_path("vq"), seed)
    click.echo(f"wrote {weights} (copy mar_*.safetensors and shipped_mar.json to vvs/weights/ to ship them)")


@train_cmd.command("t2i", help="Reproduce the shipped text-to-image pair (T5 encoder folder, target and drafter) on "
                               "the shipped tokenizer's codes, starting from the shipped class-conditional target. "
                               "Resumable.")
@click.option("--out", type=click.Path(file_okay=False), default="runs/t2i", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--vq", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The VQ tokenizer of the images. Default: the shipped one.")
@click.option("--start", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The class-conditional target of the same images to start from. Default: the shipped one.")
def train_t2i_cmd(out, seed, vq, start):
    from vvs.models.bundle import shipped_path
    from vvs.output import ensure_writable_dir
    from vvs.train.t2i import reproduce_t2i

    ensure_writable_dir(Path(out))
    weights = reproduce_t2i(Path(out), Path(vq) if vq else shipped_path("vq"),
                            Path(start) if start else shipped_path("target"), seed)
    click.echo(f"wrote {weights} (copy its files to vvs/weights/ to ship them)")


@train_cmd.command("drafter", help="Train an EAGLE/LANTERN drafter for a target. --data is an .npz with "
                                   "'tokens' [M, N] (your images' VQ codes) and 'labels' [M] (c2i) or "
                                   "'captions' [M, C, caption_dim] + 'caption_mask' [M, C] (t2i, left-padded).")
@click.option("--checkpoint", type=click.Path(dir_okay=False), required=True, help="Target weights.")
@click.option("--config", default=None, help="Named GPT size of an official checkpoint (e.g. GPT-XL).")
@click.option("--t2i", is_flag=True, help="The target is text-conditional.")
@click.option("--data", type=click.Path(dir_okay=False, exists=True), required=True)
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Folder for checkpoints and drafter.safetensors.")
@click.option("--steps", type=click.IntRange(1), default=1500, show_default=True)
@click.option("--batch", type=click.IntRange(1), default=16, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def train_drafter_cmd(checkpoint, config, t2i, data, out, steps, batch, lr, seed):
    import numpy as np
    import torch

    from vvs.models import gpt_config, load_gpt, save_model
    from vvs.output import ensure_writable_dir
    from vvs.train.drafter import train_drafter

    ensure_writable_dir(Path(out))
    try:
        cfg = gpt_config(config, **({"model_type": "t2i"} if t2i else {})) if config else None
    except KeyError as err:
        raise VVSError(str(err.args[0])) from None
    target = load_gpt(checkpoint, cfg)
    try:
        arrays = np.load(data)
        tokens = torch.from_numpy(arrays["tokens"]).long()
        key = "labels" if target.config.model_type == "c2i" else "captions"
        conditions = torch.from_numpy(arrays[key])
        mask = torch.from_numpy(arrays["caption_mask"]).bool() if key == "captions" else None
    except (OSError, ValueError, KeyError) as err:
        raise VVSError(f"{data}: not a usable drafter dataset ({err}); see vvs-train drafter --help") from None
    if tokens.dim() != 2 or tokens.shape[1] != target.config.num_image_tokens or len(conditions) != len(tokens):
        raise VVSError(f"{data}: tokens must be [M, {target.config.num_image_tokens}] with one condition per row, "
                       f"got {list(tokens.shape)} and {len(conditions)} conditions")
    drafter = train_drafter(target, conditions.long() if key == "labels" else conditions.float(), tokens, Path(out),
                            seed, steps=steps, batch=batch, lr=lr, caption_mask=mask)
    path = save_model(drafter, Path(out) / "drafter.safetensors", "drafter")
    click.echo(f"wrote {path}")


def train_main():
    _main(train_cmd, "vvs-train")


# --------------------------------------------------------------------------- vvs-serve


@click.command(help="Serve an engine folder over HTTP with Ray Serve: POST /v1/generate (JSON), GET /v1/model, "
                    "GET /healthz. Starts a local Ray instance, or joins a cluster with --address; each replica holds "
                    "a Pipeline that merges concurrent requests into running batches. Needs the serve extra: "
                    "pip install 'vvs[serve]'.")
@engine_options
@click.option("--threads", type=click.IntRange(1, 1024), default=None,
              help="CPU threads per replica, backend and torch (default: --cpus-per-replica).")
@click.option("--replicas", type=click.IntRange(1), default=1, show_default=True, help="Replicas (fixed count).")
@click.option("--min-replicas", type=click.IntRange(0), default=None, help="Autoscale: fewest replicas.")
@click.option("--max-replicas", type=click.IntRange(1), default=None, help="Autoscale: most replicas (turns it on).")
@click.option("--target-ongoing-requests", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Autoscale: requests per replica Ray aims for (default: --max-batch).")
@click.option("--max-batch", type=click.IntRange(1, 1024), default=16, show_default=True,
              help="Images a replica decodes together.")
@click.option("--max-queue", type=click.IntRange(1), default=256, show_default=True,
              help="Images a replica lets wait; beyond it requests get 503 (retry).")
@click.option("--max-images", type=click.IntRange(1), default=64, show_default=True,
              help="Images per request; more gets 413.")
@click.option("--max-request-mb", type=click.FloatRange(min=0, min_open=True), default=64, show_default=True,
              help="Request body size limit in MiB; larger bodies get 413.")
@click.option("--grace-s", type=click.FloatRange(min=0), default=30, show_default=True,
              help="On Ctrl-C or SIGTERM, new requests get 503 and in-flight ones have this many seconds to finish "
                   "before the replicas stop.")
@click.option("--gpus-per-replica", type=click.FloatRange(min=0), default=None,
              help="GPUs Ray reserves per replica (default: 1 for a CUDA device or TensorRT backend, else 0).")
@click.option("--cpus-per-replica", type=click.FloatRange(min=0), default=None,
              help="CPUs Ray reserves per replica (default: this machine's cores / --replicas, or 1 when autoscaling).")
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP address (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--address", default=None, help="Ray cluster to join (e.g. ray://head:10001 or auto); default: a "
                                                "new local instance.")
def serve_cmd(engine_dir, backend, device, threads, replicas, min_replicas, max_replicas, target_ongoing_requests,
              max_batch, max_queue, max_images, max_request_mb, grace_s, gpus_per_replica, cpus_per_replica, host, port,
              address):
    from vvs.engines import check_device
    from vvs.engines.manifest import is_mar, read_manifest, verify_files

    check_device(device)
    folder = Path(engine_dir).resolve()  # replicas run in other working directories
    manifest = read_manifest(folder)
    if is_mar(manifest):
        raise VVSError(f"{engine_dir}: holds a MAR model; vvs-serve serves LlamaGen folders so far (run MAR folders "
                       "with vvs-run, vvs-bench or vvs.runtime.mar_pipeline.MARPipeline)")
    verify_files(folder, manifest, hashes=False)  # before Ray starts; each replica checks the sha256 as it loads
    check_port_free(host, port)
    if min_replicas is not None and max_replicas is None:
        raise click.UsageError("--min-replicas needs --max-replicas (autoscaling)")
    autoscaling = None
    if max_replicas is not None:
        low = 1 if min_replicas is None else min_replicas
        if low > max_replicas:
            raise click.UsageError(f"--min-replicas {low} is above --max-replicas {max_replicas}")
        autoscaling = {"min_replicas": low, "max_replicas": max_replicas,
                       "target_ongoing_requests": target_ongoing_requests or max_batch}
    if cpus_per_replica is None:
        cpus_per_replica = 1 if autoscaling else max(1, (os.cpu_count() or 1) // replicas)
    if gpus_per_replica is None:
        gpus_per_replica = 1 if backend in ("tensorrt", "tensorrt-rtx") or (device or "").startswith("cuda") else 0
    try:
        from ray import serve

        from vvs.serve import drain
        from vvs.serve.deployment import application, start_ray
    except ImportError as err:
        raise VVSError(f"vvs-serve needs Ray Serve ({err.name} is missing): pip install 'vvs[serve]'") from None
    start_ray(address, logging_level="WARNING")
    drain_state = drain.create()
    serve.start(http_options={"host": host, "port": port})
    serve.run(application(str(folder), backend=backend, device=device, threads=threads, max_batch=max_batch,
                          max_queue=max_queue, max_images=max_images, replicas=replicas, autoscaling=autoscaling,
                          gpus_per_replica=gpus_per_replica, cpus_per_replica=cpus_per_replica,
                          max_request_bytes=int(max_request_mb * (1 << 20)), grace_s=grace_s), name="vvs")
    click.echo(f"vvs-serve: serving {folder} at http://{host}:{port}/v1/generate (Ctrl-C stops)", err=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        click.echo(f"vvs-serve: stopping; new requests get 503, in-flight ones have up to {grace_s:g} s to finish",
                   err=True)
        drain.drain(drain_state, grace_s)
        serve.delete("vvs")
        serve.shutdown()
        raise


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another server listens on, instead of sharing its traffic."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed server's TIME_WAIT does not count
        try:
            probe.bind((host, port))
        except OSError as err:
            raise VVSError(f"option --port {port}: {host}:{port} is not free ({err.strerror or err}; another "
                           "vvs-serve?); choose another --port or stop that server") from None


def serve_main():
    _main(serve_cmd, "vvs-serve")
