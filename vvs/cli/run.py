"""``vvs-run``: images from an engine folder, with per-image decoding statistics."""
from __future__ import annotations

from pathlib import Path

import click

from vvs.cli.common import (FamilyCommand, backend_notice, check_before_loading, class_option, decoding_headings,
                            engine_options, family_overrides, mode_option, num_images_option, prompt_options,
                            resolve_conditions, resolve_modes, resolve_seeds, run_command, split_values,
                            with_decoding_options)
from vvs.families.registry import pipeline_of


@click.command(cls=FamilyCommand, family_options=decoding_headings(),
               help="Generate images from an engine folder and report decoding statistics (--mode lists each "
                    "family's modes). Defaults come from the folder's manifest.")
@engine_options
@mode_option("the folder's default mode (after vvs-bench --tune: its fastest exact mode on the host it was "
             "tuned on)")
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
    from vvs.engines.manifest import read_manifest
    from vvs.families.registry import family_of
    from vvs.memory import folder_weight_bytes
    from vvs.output import RunWriter
    from vvs.runtime.pipeline import as_conditions
    from vvs.tune import tuned_mode_note

    manifest = read_manifest(Path(engine_dir))
    family = family_of(manifest)
    modes = resolve_modes(modes, [], family.mode_names)
    overrides = family_overrides(decoding, family)
    check_before_loading(manifest, modes, overrides, backend, device)
    backend_notice(manifest, backend)
    names = manifest["model"].get("classes")
    labels = resolve_conditions(engine_dir, manifest, classes, prompts, prompts_file, num_images,
                                len(split_values(classes)) or 4)
    seeds = resolve_seeds(seed, len(labels))
    engines = load_engines(engine_dir, backend, device, threads)
    pipe = pipeline_of(engines, manifest, max_batch=batch_size)
    pipe.options = pipe.options.updated(**overrides)  # for every mode: each reads its own (checked above)
    note = None if modes else tuned_mode_note(manifest)  # the default mode vvs-bench --tune measured fastest
    if note:
        click.echo(note, err=True)
    modes = modes or [pipe.options.name]
    for mode in modes:  # against the model too, before the first image
        pipe.options_for(mode)
    writer = RunWriter(Path(out), stats_json, save_tokens, overwrite,  # checks every output path before any work
                       folder_weight_bytes(Path(engine_dir)))
    try:
        with tqdm(total=len(modes) * len(labels), desc="generate", unit="img", dynamic_ncols=True) as bar:
            for mode in modes:
                for start in range(0, len(labels), batch_size):
                    chunk = labels[start : start + batch_size]
                    bar.set_postfix_str(mode)
                    result = pipe.generate(as_conditions(chunk), seed=seeds[start : start + batch_size],
                                           mode=mode)
                    writer.add(mode, start, chunk, result, names)
                    bar.update(len(chunk))
                writer.grid(mode)
        writer.finish(engines.backend)
    except KeyboardInterrupt:
        writer.keep_finished(engines.backend)
        raise
    finally:
        writer.close()


def main():
    run_command(run_cmd, "vvs-run")
