"""LlamaGen's model sets: the shipped model (class-conditional, or the text-to-image pair) or official
checkpoints, with the shipped VQ tokenizer by default; and ``vvs-export --model llamagen``."""
from __future__ import annotations

from pathlib import Path

from vvs.discrete.bundle import ModelBundle
from vvs.discrete.loading import load_drafter
from vvs.errors import VVSError
from vvs.families.llamagen.gpt import gpt_config
from vvs.families.llamagen.loading import load_gpt
from vvs.models.loading import load_vq
from vvs.models.vq import vq_config
from vvs.shipped import shipped_info, shipped_path, shipped_text_encoder


def load_bundle(
    checkpoint: str | None = None,
    config: str | None = None,
    vq: str | None = None,
    vq_config_name: str | None = None,
    drafter: str | None = None,
    t2i: bool = False,
    ema: bool = False,
    grid_size: int | None = None,
    no_drafter: bool = False,
) -> ModelBundle:
    """Load the three models; any argument left out falls back to the shipped model (``t2i``: the shipped
    text-to-image pair), except the drafter of another ``checkpoint``: without ``drafter`` that bundle has none
    (``no_drafter``: none either way). ``config`` names the size of an official checkpoint; ``grid_size`` its token
    grid (16 for 256 px, 24 for 384 px, 32 for 512 px)."""
    overrides = {**({"model_type": "t2i"} if t2i else {}), **({"grid_size": grid_size} if grid_size else {})}
    try:
        target_cfg = gpt_config(config, **overrides) if config else None
        vq_cfg = vq_config(vq_config_name) if vq_config_name else None
    except KeyError as err:
        raise VVSError(str(err.args[0])) from None
    pair = "t2i_" if t2i else ""
    target = load_gpt(checkpoint or shipped_path(f"{pair}target"), target_cfg, ema=ema)
    if no_drafter and drafter:
        raise VVSError("options --drafter and --no-drafter: give one of them")
    drafter_model = None
    if drafter or not (checkpoint or no_drafter):
        drafter_model = load_drafter(drafter or shipped_path(f"{pair}drafter"), target.config)
    vq_model = load_vq(vq or shipped_path("vq"), vq_cfg, ema=ema)
    if vq_model.config.codebook_size != len(target.config.sampled_ids):
        raise VVSError(
            f"the VQ codebook has {vq_model.config.codebook_size} codes but the target samples "
            f"{len(target.config.sampled_ids)}: pass the tokenizer the target was trained with (--vq)"
        )
    return ModelBundle(target, drafter_model, vq_model, "llamagen")


def export_from_options(options: dict, out: Path, force: bool, echo) -> dict:
    """``vvs-export --model llamagen``: the bundle the options name (the shipped model set where they name no
    file), exported into ``out``."""
    from vvs.discrete.exporter import export_folder

    o = options
    if o["text_encoder"] and not o["t2i"]:
        raise VVSError("option --text-encoder: needs --t2i (class-conditional targets take class ids, not text)")
    bundle = load_bundle(o["checkpoint"], o["config"], o["vq"], o["vq_config"], o["drafter"], t2i=o["t2i"],
                         ema=o["ema"], grid_size=o["grid_size"], no_drafter=o["no_drafter"])
    echo(bundle.summary())
    shipped = shipped_info() if not (o["checkpoint"] or o["drafter"] or o["vq"]) else None
    extra, defaults, text_encoder = {}, {}, o["text_encoder"]
    if shipped and o["t2i"]:  # the shipped text-to-image pair, with its own encoder unless another is given
        defaults = shipped_info("shipped_t2i.json")["decoding_defaults"]
        text_encoder = text_encoder or str(shipped_text_encoder())
    elif shipped:
        extra = {"classes": [c["name"] for c in shipped["classes"]]}
        defaults = shipped["decoding_defaults"]
    encoder = None
    if text_encoder:
        from vvs.text.export import load_text_encoder

        encoder = load_text_encoder(text_encoder, bundle.target.config.caption_dim)
    return export_folder(bundle, out, o["precision"], o["max_draft_top_k"], o["lantern_k"], defaults, extra,
                         force=force, text_encoder=encoder, weights=o["weights"], drafter_weights=o["drafter_weights"],
                         torch_weights=o["torch_weights"])
