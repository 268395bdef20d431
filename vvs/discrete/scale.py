"""``vvs-bench --scale SIZE[:LAYERS]``: the decoding modes at an official size's compute cost, with a trained pair's
acceptance, for every discrete-token family (its ``TargetArch.inflation`` module names the sizes and
inflates a pair).

The engine folder's target and drafter are inflated to ``SIZE`` (the same function at the official widths and
depth, so the same tokens and the same acceptance; :mod:`vvs.models.inflation`) and exported once into a sibling
folder, ``<engine>-scale/<SIZE>``, reused while the source weights are the same. The benchmark then runs there like
on any engine folder.

A weight-only folder (``vvs-export --weights int8|int4``) is inflated with its target stored in float16 and
quantised matrix by matrix as its graphs are written, so a 7B target runs whole on 24 GiB (Janus-Pro-7B's 30 layers
are 26 GB in float32, 3.5 GB at int4). A size whose run does not fit in memory (:data:`PEAK_BYTES`) is exported at
its width with fewer layers — the deepest that fits, at least the source's depth, or ``LAYERS`` — and the target's
share of each image's time is extrapolated linearly in depth to the full size: a target call multiplies every
weight of every layer and of the head once per position, so its time is ``a + b·layers`` with ``a : b`` the head's
parameters to one layer's.
"""
from __future__ import annotations

import os
from dataclasses import replace
from importlib import import_module
from pathlib import Path

import torch
from torch import nn

from vvs.engines.manifest import KERNEL, MANIFEST, REWRITTEN, TORCH_WEIGHTS, graph_weights, read_manifest
from vvs.errors import VVSError

# Bytes per target parameter a scale run holds at its peak, by the target's weights. ONNX Runtime's two target
# sessions hold 2.3 copies of the weights (measured at Janus-Pro-1B:23 in float32, each with its prepacked form);
# the export holds the inflated target once (float32, or float16 for a weight-only folder, whose matrices are
# quantised from it) plus one matrix. int8 and int4 store a float32 scale per block of 32 weights.
SESSION_COPIES = 2.3
PEAK_BYTES = {"fp32": SESSION_COPIES * 4, "int8": max(2, SESSION_COPIES * (1 + 4 / 32)),
              "int4": max(2, SESSION_COPIES * (0.5 + 4 / 32))}
PEAK_BYTES["int4-head8"] = PEAK_BYTES["int4"]  # the export's float16 copy bounds both (2 bytes a parameter)
PEAK_BYTES["w8a8"] = PEAK_BYTES["int8"]  # the same int8 matrices, with a scale per channel instead of per block
MEMORY_SHARE = 0.8  # of physical memory, the rest for the runtime, the drafter and the operating system


def parse_size(text: str, sizes: tuple[str, ...]) -> tuple[str, int | None]:
    size, _, layers = text.partition(":")
    if size not in sizes or (layers and not (layers.isdigit() and int(layers) > 0)):
        raise VVSError(f"option --scale {text!r}: choose one of {', '.join(sizes)}, optionally with :LAYERS (its "
                       "width with fewer layers, the target's time extrapolated to the full depth)")
    return size, int(layers) if layers else None


def call_parameters(model_class: type, config) -> tuple[int, int]:
    """(parameters per layer, parameters outside the layers) that a target call multiplies by, for ``config`` —
    counted on the meta device, so a 7B size costs no memory. Embedding tables are left out: a call gathers rows."""
    def count(n_layer: int) -> int:
        with torch.device("meta"):
            model = model_class(replace(config, n_layer=n_layer))
        tables = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding))
        return sum(p.numel() for p in model.parameters()) - tables

    per_layer = count(2) - count(1)
    return per_layer, count(1) - per_layer


def total_parameters(model_class: type, config) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in model_class(config).parameters())


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fitting_depth(model_class: type, config, least: int, memory: int, weights: str = "fp32") -> int | None:
    """The most layers (up to ``config.n_layer``, at least ``least``) whose scale run of a target with ``weights``
    fits ``memory`` bytes."""
    budget = MEMORY_SHARE * memory / PEAK_BYTES[weights]
    for n_layer in range(config.n_layer, least - 1, -1):
        if total_parameters(model_class, replace(config, n_layer=n_layer)) <= budget:
            return n_layer
    return None


def scale_folder(engine_dir: Path, size: str, progress: bool = True, tree: dict | None = None) -> Path:
    """The inflated engine folder of ``engine_dir`` at ``size`` (``SIZE[:LAYERS]``), exported on first use; without
    ``LAYERS``, as deep as fits this machine's memory. ``tree``: the draft tree's options of the run
    (``tree_size``, ``depth``, ``draft_top_k``), exported as the folder's own, since a weight-only target is stored
    in float16 for its export and its folder holds no torch weights to export another tree from."""
    from vvs.discrete.bundle import ModelBundle
    from vvs.discrete.folder_models import folder_drafter, folder_target
    from vvs.discrete.exporter import export_folder, source_files
    from vvs.families.registry import family_of

    engine_dir = Path(engine_dir)
    manifest = read_manifest(engine_dir)
    family = family_of(manifest)
    arch = family.entry("target_arch")
    inflation = import_module(arch.inflation)
    size, layers = parse_size(size, inflation.SIZES)
    target = folder_target(engine_dir, manifest)
    full = inflation.inflated_config(target.config, size)
    target_bits = graph_weights(manifest, "target_verify")
    target_bits = target_bits if target_bits in REWRITTEN else "fp32"
    if layers is None:
        layers = fitting_depth(arch.model, full, target.config.n_layer, physical_memory(), target_bits)
        if layers is None:
            need = PEAK_BYTES[target_bits] * total_parameters(arch.model, replace(full, n_layer=target.config.n_layer))
            raise VVSError(f"option --scale {size}: even at the source's {target.config.n_layer} layers its export "
                           f"needs about {need / MEMORY_SHARE / 2**30:.0f} GiB and this machine has "
                           f"{physical_memory() / 2**30:.0f} GiB; measure it on a machine with more memory")
    elif not target.config.n_layer <= layers <= full.n_layer:
        raise VVSError(f"option --scale {size}:{layers}: take {target.config.n_layer} (the source's depth) to "
                       f"{full.n_layer} layers")
    has_drafter = "drafter" in manifest["model"]
    source = {name: manifest["files"][name]["sha256"] for name in (*source_files(manifest), TORCH_WEIGHTS["vq"])}
    if has_drafter:
        bits = graph_weights(manifest, "draft_tree")
        source["drafter_weights"] = bits if bits in REWRITTEN else "fp32"
    half = target_bits in REWRITTEN
    defaults = manifest["decoding_defaults"]
    if half:  # only then, so earlier scale folders still match
        source["weights"] = target_bits
        defaults = {**defaults, **(tree or {})}
        source["tree"] = {k: defaults[k] for k in ("tree_size", "depth", "draft_top_k") if k in defaults}
    per_layer, rest = call_parameters(arch.model, full)
    inflated = {"size": size, "layers": layers, "official_layers": full.n_layer,
                "target_time_scale": (rest + full.n_layer * per_layer) / (rest + layers * per_layer),
                "source": source, "source_folder": engine_dir.resolve().name}
    out = engine_dir.parent / f"{engine_dir.name}-scale" / (size if layers == full.n_layer else f"{size}-{layers}")
    if (out / MANIFEST).is_file():
        try:
            if read_manifest(out)["model"].get("inflated") == inflated:
                return out
        except VVSError:  # exported by another version of vvs: export it again
            pass
    tokenizer = engine_dir / manifest["prompts"]["tokenizer"] if manifest.get("prompts") else None
    drafter = folder_drafter(engine_dir, manifest, target.config)
    bundle = ModelBundle(target, drafter, arch.load_vq(engine_dir / TORCH_WEIGHTS["vq"]), arch.family, tokenizer)
    try:
        bundle = inflation.inflate_bundle(bundle, size, layers, dtype=torch.float16 if half else torch.float32)
    except ValueError as err:
        raise VVSError(f"option --scale {size}: {err}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    info = {k: v for k, v in manifest["model"].items() if k not in ("family", "target", "drafter", "vq")}
    info["inflated"] = inflated
    export_folder(bundle, out, precision=manifest["precision"], weights=target_bits,
                  drafter_weights=None if half else source.get("drafter_weights"), decoding_defaults=defaults,
                  neighbours=manifest["tables"]["neighbours_per_code"], extra_model_info=info, progress=progress,
                  force=True)
    return out


def describe(manifest: dict) -> str | None:
    """One line saying what a scale folder's numbers are, or None for an ordinary folder."""
    from vvs.families.registry import family_of

    inflated = manifest["model"].get("inflated")
    if inflated is None:
        return None
    target_bits = inflated["source"].get("weights", "fp32")
    bits = inflated["source"].get("drafter_weights", "fp32")
    t = family_of(manifest).entry("target_arch").config(**manifest["model"]["target"])
    depth = ("" if inflated.get("layers", t.n_layer) == inflated.get("official_layers", t.n_layer) else
             f"; the target's time extrapolated linearly in depth from {t.n_layer} to its {inflated['official_layers']} "
             f"layers (x{inflated['target_time_scale']:.3f})")
    return (f"measured at {inflated['size']} compute cost (a target of {t.n_layer} layers x {t.n_head} heads x {t.dim} "
            f"wide with the {t.vocab_size}-row head vvs runs at that size, a one-layer drafter of its width) with the "
            f"acceptance of {inflated['source_folder']}'s pair, whose {len(t.sampled_ids)} codes are the only ones "
            "sampled"
            + (f"; the target's and the drafter's weights {target_bits} (ONNX Runtime's {KERNEL[target_bits]})"
               if target_bits != "fp32" else
               f"; the drafter's weights {bits} (ONNX Runtime's {KERNEL[bits]})" if bits != "fp32" else "") + depth)
