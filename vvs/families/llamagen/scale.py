"""``vvs-bench --scale SIZE``: the decoding modes at an official size's compute cost, with a trained pair's
acceptance.

The engine folder's target and drafter are inflated to ``SIZE`` (:mod:`vvs.families.llamagen.inflate`: the same function at
the official widths and depth, so the same tokens and the same acceptance) and exported once into a sibling folder,
``<engine>-scale/<SIZE>``, reused while the source weights are the same. The benchmark then runs there like on any
engine folder. What the numbers are, said wherever they are printed: seconds at that size's per-call costs, with
the source pair's acceptance, with the official vocabulary's LM head (16,384 codes, of which only the source's
codes are ever sampled).
"""
from __future__ import annotations

from pathlib import Path

from vvs.engines.manifest import MANIFEST, TORCH_WEIGHTS, read_manifest
from vvs.errors import VVSError
from vvs.families.llamagen.family import SCALE_SIZES as OFFICIAL_SIZES
from vvs.families.llamagen.gpt import GPTConfig


def scale_folder(engine_dir: Path, size: str, progress: bool = True) -> Path:
    """The inflated engine folder of ``engine_dir`` at ``size``, exported on first use."""
    from vvs.families.llamagen.exporter import export_folder
    from vvs.families.llamagen.bundle import ModelBundle
    from vvs.families.llamagen.inflate import inflate_bundle
    from vvs.families.llamagen.loading import load_drafter, load_gpt
    from vvs.models.loading import load_vq

    if size not in OFFICIAL_SIZES:
        raise VVSError(f"option --scale {size!r}: choose one of {', '.join(OFFICIAL_SIZES)}")
    engine_dir = Path(engine_dir)
    manifest = read_manifest(engine_dir)
    source = {name: manifest["files"][TORCH_WEIGHTS[name]]["sha256"] for name in ("target", "drafter", "vq")}
    source["drafter_weights"] = manifest["graphs"]["draft_tree"].get("weights", "fp32")
    out = engine_dir.parent / f"{engine_dir.name}-scale" / size
    if (out / MANIFEST).is_file():
        try:
            if read_manifest(out)["model"].get("inflated", {}).get("source") == source:
                return out
        except VVSError:  # exported by another version of vvs: export it again
            pass
    target = load_gpt(engine_dir / TORCH_WEIGHTS["target"])
    try:
        bundle = inflate_bundle(ModelBundle(target, load_drafter(engine_dir / TORCH_WEIGHTS["drafter"], target.config),
                                            load_vq(engine_dir / TORCH_WEIGHTS["vq"])), size)
    except ValueError as err:
        raise VVSError(f"option --scale {size}: {err}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    info = {k: v for k, v in manifest["model"].items() if k not in ("family", "target", "drafter", "vq")}
    info["inflated"] = {"size": size, "source": source, "source_folder": str(engine_dir.resolve())}
    export_folder(bundle, out, precision=manifest["precision"], drafter_weights=source["drafter_weights"],
                  decoding_defaults=manifest["decoding_defaults"],
                  neighbours=manifest["tables"]["neighbours_per_code"], extra_model_info=info, progress=progress,
                  force=True)
    return out


def describe(manifest: dict) -> str | None:
    """One line saying what a scale folder's numbers are, or None for an ordinary folder."""
    inflated = manifest["model"].get("inflated")
    if inflated is None:
        return None
    t = GPTConfig(**manifest["model"]["target"])
    return (f"measured at {inflated['size']} compute cost (a target of {t.n_layer} layers x {t.n_head} heads x {t.dim} "
            f"wide with the official {t.vocab_size}-code head, a one-layer drafter of its width) with the acceptance "
            f"of {inflated['source_folder']}'s pair, whose {len(t.sampled_ids)} codes are the only ones sampled"
            + ("; the drafter's weights int8 (ONNX Runtime's MatMulNBits)"
               if inflated["source"].get("drafter_weights") == "int8" else ""))

