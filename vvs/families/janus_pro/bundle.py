"""Janus-Pro's model sets: an official folder (the target and its VQ-16 tokenizer) with an optional drafter, and
``vvs-export --model janus-pro``."""
from __future__ import annotations

from pathlib import Path

from vvs.errors import VVSError
from vvs.families.janus_pro.loading import load_official
from vvs.families.llamagen.bundle import ModelBundle
from vvs.families.llamagen.loading import load_drafter

FAMILY = "janus-pro"
# the official script's sampling: guidance 5, temperature 1, no top-k or top-p (generation_inference.py)
DECODING_DEFAULTS = {"cfg_scale": 5.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


def load_bundle(checkpoint: str | None, drafter: str | None = None, prompt_tokens: int = 64,
                no_drafter: bool = False, grid_size: int = 24) -> ModelBundle:
    """An official folder's generation path, with the vvs drafter ``drafter`` (None: a drafter-free bundle)."""
    if checkpoint is None:
        raise VVSError("--model janus-pro: give --checkpoint, the folder of an official Janus-Pro checkpoint "
                       "(deepseek-ai/Janus-Pro-1B or -7B: config.json, weights, tokenizer.json)")
    if no_drafter and drafter:
        raise VVSError("options --drafter and --no-drafter: give one of them")
    target, vq = load_official(checkpoint, prompt_tokens, grid_size)
    drafter_model = None if drafter is None else load_drafter(drafter, target.config)
    return ModelBundle(target, drafter_model, vq, FAMILY, Path(checkpoint) / "tokenizer.json")


def export_from_options(options: dict, out: Path, force: bool, echo) -> dict:
    """``vvs-export --model janus-pro``."""
    from vvs.families.llamagen.exporter import export_folder

    o = options
    bundle = load_bundle(o["checkpoint"], o["drafter"], o["prompt_tokens"], o["no_drafter"])
    echo(bundle.summary())
    return export_folder(bundle, out, o["precision"], o["max_draft_top_k"], o["lantern_k"], DECODING_DEFAULTS,
                         {"source": str(Path(o["checkpoint"]).resolve().name)}, force=force,
                         drafter_weights=o["drafter_weights"])
