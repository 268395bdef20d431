"""Janus-Pro's model sets: an official folder (the target and its VQ-16 tokenizer) with an optional drafter, or the
shipped pair; and ``vvs-export --model janus-pro``."""
from __future__ import annotations

from pathlib import Path

from vvs.discrete.bundle import ModelBundle, with_prompt_slots
from vvs.discrete.loading import load_drafter
from vvs.errors import VVSError
from vvs.families.janus_pro.family import SAMPLING
from vvs.families.janus_pro.loading import load_janus, load_official
from vvs.models.hub import folder_name
from vvs.models.loading import load_vq
from vvs.shipped import shipped_info, shipped_path

FAMILY = "janus-pro"
PROMPT_TOKENS = 64  # an official folder's prompt slots unless --prompt-tokens says otherwise


def load_bundle(checkpoint: str | None = None, drafter: str | None = None, prompt_tokens: int | None = None,
                no_drafter: bool = False, grid_size: int = 24) -> ModelBundle:
    """An official folder's generation path with the vvs drafter ``drafter`` (None: a drafter-free bundle), or,
    without ``checkpoint``, the shipped pair (its own drafter unless ``drafter`` or ``no_drafter`` say otherwise;
    its grid is its own, its prompt slots ``prompt_tokens`` or its own)."""
    if no_drafter and drafter:
        raise VVSError("options --drafter and --no-drafter: give one of them")
    if checkpoint is None:
        target = with_prompt_slots(load_janus(shipped_path("janus_target")), prompt_tokens)
        vq, tokenizer = load_vq(shipped_path("vq")), shipped_path("janus_tokenizer")
        if not (drafter or no_drafter):
            drafter = str(shipped_path("janus_drafter"))
    else:
        target, vq = load_official(checkpoint, prompt_tokens or PROMPT_TOKENS, grid_size)
        tokenizer = Path(checkpoint) / "tokenizer.json"
    drafter_model = None if drafter is None else load_drafter(drafter, target.config)
    return ModelBundle(target, drafter_model, vq, FAMILY, tokenizer)


def export_from_options(options: dict, out: Path, force: bool, echo) -> dict:
    """``vvs-export --model janus-pro``: an official folder (``--checkpoint``), or the shipped pair."""
    from vvs.discrete.exporter import export_folder

    o = options
    bundle = load_bundle(o["checkpoint"], o["drafter"], o["prompt_tokens"], o["no_drafter"])
    echo(bundle.summary())
    if o["checkpoint"] is None:
        defaults, extra = shipped_info("shipped_janus.json")["decoding_defaults"], {"source": "the shipped pair"}
    else:
        defaults, extra = SAMPLING, {"source": folder_name(o["checkpoint"])}
    return export_folder(bundle, out, o["precision"], o["max_draft_top_k"], o["lantern_k"], defaults, extra,
                         force=force, weights=o["weights"], drafter_weights=o["drafter_weights"],
                         torch_weights=o["torch_weights"])
