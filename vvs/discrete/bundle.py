"""The set of models one deployment needs: target, drafter, VQ decoder. Defaults to the shipped model."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from vvs.errors import VVSError
from vvs.families.llamagen.drafter import Drafter
from vvs.families.llamagen.gpt import GPT, gpt_config
from vvs.families.llamagen.loading import load_drafter, load_gpt
from vvs.models.loading import load_vq
from vvs.models.vq import VQModel, vq_config
from vvs.shipped import shipped_path


def with_prompt_slots(target, slots: int | None):
    """A prompt-conditioned target with ``slots`` prompt slots. No weight depends on their count: positions are
    rotary (relative), and a prompt is left-padded with the padding masked, so a shipped pair trained with 48 slots
    takes longer prompts and computes the same function on the ones it took before."""
    if slots is None or slots == target.config.cls_token_num:
        return target
    resized = type(target)(replace(target.config, cls_token_num=slots))
    resized.load_state_dict(target.state_dict())
    return resized.eval()


@dataclass
class ModelBundle:
    target: GPT  # or another discrete-token family's target (vvs.families.llamagen.arch)
    drafter: Drafter | None  # None: a drafter-free folder (ar and the speculative Jacobi modes)
    vq: VQModel
    family: str = "llamagen"  # the registry entry whose target architecture ``target`` is
    tokenizer: Path | None = None  # the target's own text tokenizer.json, where prompts are its input (Janus-Pro)

    @property
    def arch(self):
        from vvs.families.registry import family

        return family(self.family).entry("target_arch")

    def summary(self) -> str:
        t, d, v = self.target.config, self.drafter and self.drafter.config, self.vq.config
        count = lambda m: sum(p.numel() for p in m.parameters()) / 1e6  # noqa: E731
        drafter = ("drafter none: ar, sjd, sjd-pac and gsd only" if d is None else
                   f"drafter {d.num_hidden_layers} layer(s), dim {d.hidden_size}, {count(self.drafter):.2f}M params "
                   "(+ the target's output head)")
        from vvs.families.registry import family

        kind = " ".join(filter(None, (family(self.family).label, getattr(t, "model_type", None))))
        return "\n".join([
            f"target  {kind}: {t.n_layer} layers, dim {t.dim}, {t.n_head} heads, vocab {t.vocab_size}, "
            f"{t.cls_token_num} condition slot(s) + {t.grid_size}x{t.grid_size} tokens, {count(self.target):.2f}M params",
            drafter,
            f"vq      codebook {v.codebook_size}x{v.codebook_embed_dim}, downsample {v.downsample}, "
            f"{count(self.vq):.2f}M params",
        ])


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
    return ModelBundle(target, drafter_model, vq_model)
