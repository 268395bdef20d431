"""Command-line entry points: vvs-export, vvs-run, vvs-bench, vvs-train.

Every user error (bad option, bad file, bad folder) is printed as one line ``<prog>: error: ...`` and exits
with code 2; nothing half-written is left behind (writers use a temporary name and rename).
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from vvs.errors import VVSError


def _main(command: click.Command, prog: str) -> None:
    try:
        command.main(prog_name=prog, standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as err:
        click.echo(f"{prog}: error: {err.format_message()} (see {prog} --help)", err=True)
        sys.exit(2)
    except VVSError as err:
        click.echo(f"{prog}: error: {err}", err=True)
        sys.exit(2)
    except click.Abort:
        click.echo(f"{prog}: interrupted", err=True)
        sys.exit(130)


# --------------------------------------------------------------------------- vvs-export

model_options = [
    click.option("--model", type=click.Choice(["llamagen"]), default="llamagen", show_default=True,
                 help="Model family."),
    click.option("--config", "config", default=None,
                 help="Named GPT size of --checkpoint (GPT-B, GPT-L, GPT-XL, ...). Not needed for vvs files."),
    click.option("--t2i", is_flag=True, help="The checkpoint is text-conditional (120 caption slots)."),
    click.option("--grid-size", type=click.IntRange(1), default=None,
                 help="Token grid side of --checkpoint: 16 (256 px, default), 24 (384 px), 32 (512 px)."),
    click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
                 help="Target GPT weights (official .pt or vvs .safetensors). Default: the shipped model."),
    click.option("--vq", type=click.Path(dir_okay=False), default=None,
                 help="VQ tokenizer weights. Default: the shipped tokenizer."),
    click.option("--vq-config", default=None, help="Named VQ size of --vq (VQ-16, VQ-8). Not needed for vvs files."),
    click.option("--drafter", type=click.Path(), default=None,
                 help="Drafter: a LANTERN/EAGLE folder or a vvs .safetensors. Default: the shipped drafter."),
    click.option("--ema", is_flag=True, help="Load the 'ema' weights of official checkpoints."),
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
              help="Engine folder to write (replaced only once the new one is complete).")
@click.option("--max-draft-top-k", type=click.IntRange(1, 64), default=10, show_default=True,
              help="Candidates per node the drafter graph returns (upper bound for --draft-top-k at run time).")
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
def export_cmd(model, config, t2i, grid_size, checkpoint, vq, vq_config, drafter, ema, precision, out,
               max_draft_top_k, lantern_k, backend, compute_capability, max_images):
    import time

    from vvs.export.exporter import export_folder
    from vvs.models.bundle import load_bundle, shipped_info

    start = time.time()
    if compute_capability and backend != "tensorrt-rtx":
        raise VVSError("option --compute-capability: needs --backend tensorrt-rtx")
    if backend != "onnxruntime":  # fail before the export, not after it
        from vvs.engines.tensorrt_build import check_build_request, parse_compute_capabilities

        capabilities = parse_compute_capabilities(compute_capability)
        check_build_request(backend, capabilities)
    bundle = load_bundle(checkpoint, config, vq, vq_config, drafter, t2i=t2i, ema=ema, grid_size=grid_size)
    click.echo(bundle.summary())
    shipped = shipped_info() if not (checkpoint or drafter or vq) else None
    extra = {"classes": [c["name"] for c in shipped["classes"]], "image_size": shipped["image_size"]} if shipped else {}
    defaults = shipped["decoding_defaults"] if shipped else {}
    manifest = export_folder(bundle, Path(out), precision, max_draft_top_k, lantern_k, defaults, extra)
    if backend != "onnxruntime":
        from vvs.engines.tensorrt_build import build_folder

        def report(name, seconds, size):
            click.echo(f"built {backend}/{name}.plan: {size / 1e6:.1f} MB in {seconds:.0f} s")

        manifest = build_folder(Path(out), backend, max_images, capabilities, progress=report)
    total = sum(f["bytes"] for f in manifest["files"].values())
    click.echo(f"wrote {out}/: {len(manifest['graphs'])} graphs ({precision}, opset {manifest['versions']['opset']}), "
               f"{len(manifest['files'])} files, {total / 1e6:.1f} MB, in {time.time() - start:.0f} s")
    click.echo(f"next: vvs-run --engine {out}")


# --------------------------------------------------------------------------- vvs-run

decoding_options = [
    click.option("--temperature", type=float, default=None, help="Sampling temperature; 0 means greedy."),
    click.option("--top-k", type=int, default=None, help="Keep the k most likely tokens (0: all)."),
    click.option("--top-p", type=float, default=None, help="Nucleus sampling mass in (0, 1]."),
    click.option("--cfg", "cfg_scale", type=float, default=None, help="Classifier-free guidance scale; guidance applies only above 1 (as in LlamaGen)."),
    click.option("--tree-size", type=int, default=None, help="Draft-tree nodes verified per step, root included."),
    click.option("--depth", type=int, default=None, help="Tree expansion rounds (paths hold up to depth + 1 drafts)."),
    click.option("--draft-top-k", type=int, default=None, help="Children per expanded node."),
    click.option("--skip-policy", type=click.Choice(["uniform", "dynamic"]), default=None, help="VVS skip schedule."),
    click.option("--skip-interval", type=int, default=None, help="uniform: skip one verification every N cycles."),
    click.option("--sim-threshold", type=float, default=None, help="dynamic: latent similarity needed to skip."),
    click.option("--lantern-k", type=int, default=None, help="LANTERN: latent neighbours per drafted token."),
    click.option("--lantern-delta", type=float, default=None, help="LANTERN: total-variation budget δ."),
]


def with_decoding_options(fn):
    for option in reversed(decoding_options):
        fn = option(fn)
    return fn


def resolve_classes(values: tuple[str, ...], names: list[str] | None, num_classes: int, count: int) -> list[int]:
    """Class ids from ``--class`` values (ids or names), cycled to ``count`` images."""
    if not values:
        return [i % num_classes for i in range(count)]
    ids = []
    for v in values:
        if v.lstrip("-").isdigit():
            ids.append(int(v))
        elif names and v in names:
            ids.append(names.index(v))
        else:
            known = f"; known names: {', '.join(names)}" if names else ""
            raise VVSError(f"option --class {v!r}: not a class id or name{known}")
    for i in ids:
        if not 0 <= i < num_classes:
            raise VVSError(f"option --class {i}: out of range, the model has {num_classes} classes (0-{num_classes - 1})")
    return [ids[i % len(ids)] for i in range(max(count, len(ids)))]


def resolve_seeds(text: str, count: int) -> list[int]:
    """``--seed S`` (image i gets S + i) or ``--seed S1,S2,...`` (one per image)."""
    from vvs.runtime.random import image_seeds

    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise VVSError(f"option --seed {text!r}: give a non-negative integer, or one per image separated by commas")
    try:
        return image_seeds(int(parts[0]) if len(parts) == 1 else [int(p) for p in parts], count)
    except VVSError as err:
        raise VVSError(f"option --{err}") from None


@click.command(help="Generate images from an engine folder and report decoding statistics. Modes: ar (vanilla), "
                    "sd (EAGLE-2 speculative decoding), lantern (relaxed acceptance), vvs (verification skipping). "
                    "Defaults come from the folder's manifest.")
@click.option("--engine", "engine_dir", type=click.Path(), default="engines", show_default=True, help="Engine folder.")
@click.option("--backend", type=click.Choice(["auto", "onnxruntime", "torch", "tensorrt", "tensorrt-rtx"]), default="auto",
              show_default=True)
@click.option("--device", default=None, help="cpu or cuda (default: what the backend finds).")
@click.option("--mode", "modes", multiple=True, type=click.Choice(["ar", "sd", "lantern", "vvs"]),
              help="Decoding mode; repeat to compare modes on the same classes and seeds. Default: the manifest's.")
@click.option("--class", "classes", multiple=True, help="Class id or name; repeatable. Default: 0, 1, 2, ...")
@click.option("--num-images", type=click.IntRange(1), default=None, help="Images per mode (default: one per --class, or 4).")
@click.option("--batch-size", type=click.IntRange(1), default=8, show_default=True, help="Images decoded together.")
@click.option("--seed", default="0", show_default=True,
              help="S: image i gets seed S + i; or S1,S2,... one seed per image. An image depends only on its class, "
                   "seed and options, never on the images decoded beside it.")
@with_decoding_options
@click.option("--threads", type=click.IntRange(1), default=None, help="CPU threads for the backend.")
@click.option("--out", type=click.Path(file_okay=False), default="outputs", show_default=True,
              help="Folder for the PNGs and the grid.")
@click.option("--stats-json", type=click.Path(dir_okay=False), default=None, help="Write per-image statistics here.")
@click.option("--save-tokens", type=click.Path(dir_okay=False), default=None, help="Write token ids (.npy) here.")
def run_cmd(engine_dir, backend, device, modes, classes, num_images, batch_size, seed, threads, out, stats_json,
            save_tokens, **decoding):
    from vvs.engines import load_engines
    from vvs.engines.manifest import read_manifest
    from vvs.output import RunWriter
    from vvs.runtime.pipeline import Pipeline

    manifest = read_manifest(Path(engine_dir))
    writer = RunWriter(Path(out), stats_json, save_tokens)  # fails early on unwritable places
    engines = load_engines(engine_dir, backend, device, threads)
    pipe = Pipeline(engines)
    overrides = {k: v for k, v in decoding.items() if v is not None}
    target = engines.target
    if target.model_type != "c2i":
        raise VVSError("vvs-run generates class-conditional images; use the Pipeline API with caption embeddings "
                       "for text-conditional models")
    labels = resolve_classes(classes, manifest["model"].get("classes"), target.num_classes,
                             num_images or (len(classes) or 4))
    seeds = resolve_seeds(seed, len(labels))
    names = manifest["model"].get("classes")
    for mode in modes or (pipe.options.mode,):
        pipe.options.updated(mode=mode, **overrides)  # validate before any work
        results = []
        for start in range(0, len(labels), batch_size):
            chunk = torch_tensor(labels[start : start + batch_size])
            results.append(pipe.generate(chunk, mode=mode, seed=seeds[start : start + batch_size], **overrides))
        writer.add(mode, labels, results, names)
    writer.finish(engines.backend)


def torch_tensor(values):
    import torch

    return torch.tensor(values, dtype=torch.long)


def export_main():
    _main(export_cmd, "vvs-export")


def run_main():
    _main(run_cmd, "vvs-run")


# --------------------------------------------------------------------------- vvs-bench


@click.command(help="Run decoding modes side by side on the same classes and seeds (interleaved, warm-up "
                    "excluded): TPF, forwards, skips, seconds per image and speed-up vs ar from the same run, and "
                    "for the shipped model class accuracy, domain FID and NLL with AR's seed-to-seed spread. "
                    "Writes results.json, table.md, pareto.png and sample grids. --tune picks the tree and skip "
                    "interval fastest on this machine and stores them as the engine folder's defaults.")
@click.option("--engine", "engine_dir", type=click.Path(), default="engines", show_default=True)
@click.option("--backend", type=click.Choice(["auto", "onnxruntime", "torch", "tensorrt", "tensorrt-rtx"]), default="auto",
              show_default=True)
@click.option("--device", default=None)
@click.option("--modes", default="ar,sd,lantern,vvs-uniform,vvs-dynamic", show_default=True,
              help="Comma-separated: ar, sd, lantern, vvs-uniform, vvs-dynamic.")
@click.option("--num-images", type=click.IntRange(1), default=16, show_default=True, help="Images per setting and seed.")
@click.option("--seeds", type=click.IntRange(1), default=3, show_default=True)
@click.option("--classes", default=None, help="Comma-separated class ids (default: all classes in turn).")
@click.option("--batch-size", type=click.IntRange(1), default=1, show_default=True,
              help="Images decoded together (1 = latency).")
@click.option("--sweep", multiple=True, help="KEY=V1,V2 (skip_interval, sim_threshold, delta, lantern_k, tree_size, "
                                             "depth, draft_top_k); repeatable, one key at a time.")
@with_decoding_options
@click.option("--threads", type=click.IntRange(1), default=None)
@click.option("--tune", is_flag=True, help="Tune tree and skip interval for this machine and save them as defaults.")
@click.option("--out", type=click.Path(file_okay=False), default="bench-results", show_default=True)
def bench_cmd(engine_dir, backend, device, modes, num_images, seeds, classes, batch_size, sweep, threads, tune, out,
              **decoding):
    from vvs.bench import load_instruments, machine, make_settings, parse_sweep, run_benchmark, write_results
    from vvs.engines import load_engines
    from vvs.engines.manifest import read_manifest
    from vvs.output import ensure_writable_dir
    from vvs.runtime.pipeline import Pipeline

    manifest = read_manifest(Path(engine_dir))
    ensure_writable_dir(Path(out))
    settings = make_settings([m.strip() for m in modes.split(",") if m.strip()], parse_sweep(sweep))
    engines = load_engines(engine_dir, backend, device, threads)
    overrides = {k: v for k, v in decoding.items() if v is not None}
    pipe = Pipeline(engines)
    pipe.options = pipe.options.updated(**overrides)
    n_classes = engines.target.num_classes
    ids = [int(c) for c in classes.split(",")] if classes else list(range(n_classes))
    bad = [c for c in ids if not 0 <= c < n_classes]
    if bad:
        raise VVSError(f"option --classes {bad[0]}: out of range, the model has {n_classes} classes (0-{n_classes - 1})")
    labels = [ids[i % len(ids)] for i in range(num_images)]
    instruments = load_instruments(Path(engine_dir), manifest)
    if tune:
        from vvs.export.exporter import write_defaults
        from vvs.tune import tune as run_tune

        best = run_tune(pipe, labels, seeds, instruments, log=click.echo)
        write_defaults(Path(engine_dir), best.to_dict())
        click.echo(f"saved as the defaults of {engine_dir}/manifest.json")
        pipe.options = best
    results, samples = run_benchmark(pipe, settings, labels, seeds, batch_size, instruments)
    results.update({"engine": str(engine_dir), "backend": engines.backend, "machine": machine(),
                    "num_images": num_images, "seeds": seeds, "batch_size": batch_size,
                    "defaults": pipe.options.to_dict()})
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
    from vvs.train.shipped import reproduce

    weights = reproduce(Path(out), seed)
    click.echo(f"wrote {weights} (copy its files to vvs/weights/ to ship them); curves: {Path(out) / 'training_curves.png'}")


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
    from vvs.train.drafter import train_drafter

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
