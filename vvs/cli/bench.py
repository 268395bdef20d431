"""``vvs-bench``: decoding modes side by side, with quality instruments, sweeps, tuning and scale runs."""
from __future__ import annotations

import os
from pathlib import Path

import click

from vvs.cli.common import (FamilyCommand, backend_notice, check_before_loading, check_folder_request, class_option,
                            decoding_headings, engine_options, family_overrides, mode_option, num_images_option,
                            prompt_options, resolve_conditions, resolve_modes, run_command, split_values,
                            with_decoding_options)
from vvs.errors import VVSError
from vvs.families.registry import FAMILIES, pipeline_of
from vvs.runtime.options import OptionsError


@click.command(cls=FamilyCommand, family_options=decoding_headings(),
               help="Run decoding modes side by side on the same classes and seeds (interleaved, warm-up "
                    "excluded): TPF, forwards, skips, seconds per image and speed-up vs ar from the same run, and "
                    "for the shipped model class accuracy, domain FID and NLL with AR's seed-to-seed spread. "
                    "The default run decodes 384 images (8 modes x 16 images x 3 seed sets): about 15 minutes on 2 "
                    "CPU cores with the shipped model; --num-images 4 --num-seeds 1 for a quick look. "
                    "Writes results.json, table.md, pareto.png and sample grids. --tune picks the tree, skip "
                    "interval and drafter-free windows fastest on this machine, races the modes, and stores them "
                    "and the fastest exact mode as the engine folder's defaults.")
@engine_options
@mode_option("each family's own list: " + "; ".join(f"{f.label} {','.join(f.bench_modes)}"
                                                   for f in FAMILIES.values()))
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
                                             "depth, draft_top_k, window, pac_tree_width, pac_tree_depth; MAR: "
                                             "num_iter, draft_steps, accept_rule); "
                                             "repeatable, one key at a time.")
@with_decoding_options
@click.option("--threads", type=click.IntRange(1, 1024), default=None, help="CPU threads for the backend.")
@click.option("--tune", is_flag=True, help="Tune tree, skip interval and windows for this machine and save "
                                               "them, with the fastest exact mode, as defaults.")
@click.option("--scale", default=None, metavar="SIZE[:LAYERS]",
              help="Measure at an official size's compute cost (" + "; ".join(
                  f"{f.label}: {', '.join(f.scale_sizes)}" for f in FAMILIES.values() if f.scale_sizes) + "): the "
                   "folder's target and drafter are inflated to SIZE, computing the same tokens, and exported once "
                   "to <engine>-scale/SIZE; acceptance stays the folder's pair's (its codes are the only ones "
                   "sampled from the official head). A size that does not fit in memory, or :LAYERS, runs at its "
                   "width with fewer layers and extrapolates the target's time to the full depth.")
@click.option("--out", type=click.Path(file_okay=False), default="bench-results", show_default=True,
              help="Folder for results.json, table.md, pareto.png and sample grids.")
def bench_cmd(engine_dir, backend, device, modes, classes, prompts, prompts_file, num_images, seed, num_seeds,
              batch_size, sweep, threads, tune, scale, out, **decoding):
    from vvs.bench import (load_instruments, machine, make_settings, markdown_table, parse_sweep, run_benchmark,
                           write_results)
    from vvs.engines import load_engines
    from vvs.engines.manifest import MANIFEST, read_manifest
    from vvs.families.registry import family_of
    from vvs.memory import folder_weight_bytes, peak_resident_bytes
    from vvs.output import ensure_writable_dir

    manifest = read_manifest(Path(engine_dir))
    family = family_of(manifest)
    check_scale_and_tune(family, scale, tune)
    ensure_writable_dir(Path(out))
    if tune and not os.access(Path(engine_dir) / MANIFEST, os.W_OK):
        raise VVSError(f"option --tune: {Path(engine_dir) / MANIFEST} is not writable, so the tuned defaults could "
                       "not be saved; copy the folder somewhere writable")
    labels = resolve_conditions(engine_dir, manifest, classes, prompts, prompts_file, num_images,
                                max(16, len(split_values(classes))))
    num_images = len(labels)
    swept = parse_sweep(sweep)
    modes = resolve_modes(modes, list(family.bench_modes), family.mode_names)
    settings = make_settings(modes, swept, family.mode_names)
    overrides = family_overrides(decoding, family)
    base = check_before_loading(manifest, modes, overrides, backend, device).updated(**overrides)
    check_settings(lambda given: check_folder_request(manifest, backend, base, [], given), settings, swept)
    backend_notice(manifest, backend)
    instruments = load_instruments(Path(engine_dir), manifest)  # an inflated pair's quality is its source's
    if instruments is not None and num_images < 2:
        raise VVSError("option --num-images: the quality statistics (FID) need at least 2 images per seed set")
    if scale is not None:
        ensure_writable_dir(Path(engine_dir).parent)
        tree = {k: v for k, v in overrides.items() if k in ("tree_size", "depth", "draft_top_k")}
        engine_dir = family.call("scale", Path(engine_dir), scale, tree=tree)
        click.echo(family.call("describe_scale", read_manifest(engine_dir)))
    engines = load_engines(engine_dir, backend, device, threads)
    pipe = pipeline_of(engines, manifest, max_batch=batch_size)
    pipe.options = pipe.options.updated(**overrides)
    check_settings(lambda given: pipe.options_for(**given), settings, swept)  # against the model's bounds too
    labels = labels[:num_images]
    if tune:
        best, record = family.call("tune", pipe, labels, num_seeds, instruments, log=click.echo)
        family.call("write_defaults", Path(engine_dir), best.to_dict(), record)
        click.echo(f"saved as the defaults of {engine_dir}/manifest.json")
        pipe.options = best
    inflated = read_manifest(Path(engine_dir))["model"].get("inflated", {})
    results, samples = run_benchmark(pipe, settings, labels, num_seeds, batch_size, instruments, base_seed=seed,
                                     target_time_scale=inflated.get("target_time_scale", 1.0))
    described = family.call("describe_scale", read_manifest(Path(engine_dir))) if family.describe_scale else None
    results.update({"engine": str(engine_dir), "backend": engines.backend, "machine": machine(),
                    "num_images": num_images, "seed": seed, "num_seeds": num_seeds, "batch_size": batch_size,
                    "defaults": pipe.options.to_dict(), "scale": described,
                    "peak_resident_bytes": peak_resident_bytes(), "weight_bytes": folder_weight_bytes(engine_dir)})
    write_results(results, Path(out), samples)
    click.echo(markdown_table(results))
    click.echo(f"wrote {out}/results.json, table.md, pareto.png and sample grids")


def check_scale_and_tune(family, scale: str | None, tune: bool) -> None:
    if scale is not None and (tune or family.scale is None or scale.partition(":")[0] not in family.scale_sizes):
        raise VVSError(f"option --scale {scale!r}: " + (
            "tune on the folder itself (--tune), then measure the tuned defaults with --scale" if tune else
            family.instead.get("scale", f"{family.label} folders have no scale runs") if family.scale is None else
            f"choose one of {', '.join(family.scale_sizes)}, optionally with :LAYERS"))
    if tune and family.tune is None:
        raise VVSError(f"option --tune: {family.instead.get('tune', f'{family.label} folders have no tuner')}")


def check_settings(check, settings, swept: dict) -> None:
    """Every setting through ``check`` (its overrides -> options) before any long work (inflation, tuning, the
    runs), an error in a swept value named as the user gave it."""
    from vvs.bench import OPTION_OF

    for s in settings:
        try:
            check(s.overrides)
        except OptionsError as err:
            key = next((k for k in swept if OPTION_OF.get(k, k) == err.option), None)
            if key is None:
                raise
            raise VVSError(f"option --sweep {key}={err.value}: {err.why}") from None


def main():
    run_command(bench_cmd, "vvs-bench")
