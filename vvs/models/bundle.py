"""The set of models one deployment needs: target, drafter, VQ decoder. Defaults to the shipped model."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vvs.errors import VVSError
from vvs.models.drafter import Drafter
from vvs.models.gpt import GPT, gpt_config
from vvs.models.loading import load_drafter, load_gpt, load_vq
from vvs.models.vq import VQModel, vq_config

if TYPE_CHECKING:
    from vvs.models.mar import MAR

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "weights"
SHIPPED = {"target": "target.safetensors", "drafter": "drafter.safetensors", "vq": "vq.safetensors",
           "t2i_target": "t2i_target.safetensors", "t2i_drafter": "t2i_drafter.safetensors",
           "text_encoder": "text_encoder/model.safetensors"}


@dataclass
class ModelBundle:
    target: GPT
    drafter: Drafter
    vq: VQModel

    def summary(self) -> str:
        t, d, v = self.target.config, self.drafter.config, self.vq.config
        count = lambda m: sum(p.numel() for p in m.parameters()) / 1e6  # noqa: E731
        return "\n".join([
            f"target  {t.model_type} GPT: {t.n_layer} layers, dim {t.dim}, {t.n_head} heads, vocab {t.vocab_size}, "
            f"{t.cls_token_num} condition slot(s) + {t.grid_size}x{t.grid_size} tokens, {count(self.target):.2f}M params",
            f"drafter {d.num_hidden_layers} layer(s), dim {d.hidden_size}, {count(self.drafter):.2f}M params "
            "(+ the target's output head)",
            f"vq      codebook {v.codebook_size}x{v.codebook_embed_dim}, downsample {v.downsample}, "
            f"{count(self.vq):.2f}M params",
        ])


def shipped_info(name: str = "shipped.json") -> dict:
    """``shipped.json``: configs, classes, licences, metrics and sha256 of the shipped weights
    (``shipped_t2i.json``: the text-to-image pair's)."""
    import json

    path = SHIPPED_DIR / name
    if not path.is_file():
        raise VVSError(f"{path}: missing; reinstall vvs")
    return json.loads(path.read_text())


def shipped_text_encoder() -> Path:
    """The shipped text-to-image pair's T5 encoder folder (config.json, model.safetensors, tokenizer.json)."""
    return shipped_path("text_encoder").parent


def shipped_path(name: str) -> Path:
    path = SHIPPED_DIR / SHIPPED[name]
    if not path.is_file():
        raise VVSError(f"the shipped {name} weights are missing ({path}); reinstall vvs or pass the file explicitly")
    return path


def load_bundle(
    checkpoint: str | None = None,
    config: str | None = None,
    vq: str | None = None,
    vq_config_name: str | None = None,
    drafter: str | None = None,
    t2i: bool = False,
    ema: bool = False,
    grid_size: int | None = None,
) -> ModelBundle:
    """Load the three models; any argument left out falls back to the shipped model (``t2i``: the shipped
    text-to-image pair). ``config`` names the size of an official checkpoint; ``grid_size`` its token grid (16 for
    256 px, 24 for 384 px, 32 for 512 px)."""
    overrides = {**({"model_type": "t2i"} if t2i else {}), **({"grid_size": grid_size} if grid_size else {})}
    try:
        target_cfg = gpt_config(config, **overrides) if config else None
        vq_cfg = vq_config(vq_config_name) if vq_config_name else None
    except KeyError as err:
        raise VVSError(str(err.args[0])) from None
    pair = "t2i_" if t2i else ""
    target = load_gpt(checkpoint or shipped_path(f"{pair}target"), target_cfg, ema=ema)
    drafter_model = load_drafter(drafter or shipped_path(f"{pair}drafter"), target.config)
    vq_model = load_vq(vq or shipped_path("vq"), vq_cfg, ema=ema)
    if vq_model.config.codebook_size != target.config.vocab_size:
        raise VVSError(
            f"the VQ codebook has {vq_model.config.codebook_size} codes but the target's vocabulary is "
            f"{target.config.vocab_size}: pass the tokenizer the target was trained with (--vq)"
        )
    return ModelBundle(target, drafter_model, vq_model)


# --------------------------------------------------------------------------- MAR (continuous tokens)

SHIPPED_MAR = {"target": "mar_target.safetensors", "draft": "mar_draft.safetensors"}


@dataclass
class MARBundle:
    target: "MAR"
    draft: "MAR"
    tokenizer: object  # vvs.models.latents.VQLatents or KLLatents
    image_size: int
    classes: list[str] | None = None
    decoding_defaults: dict | None = None

    def summary(self) -> str:
        def line(role, m):
            c = m.config
            return (f"{role:7} MAR: {c.encoder_depth}+{c.decoder_depth} layers, dim {c.encoder_embed_dim}, head "
                    f"{c.diffloss_d}x{c.diffloss_w} ({c.num_sampling_steps} sampling steps), {c.seq_len} tokens of "
                    f"{c.token_embed_dim} dims, {sum(p.numel() for p in m.parameters()) / 1e6:.2f}M params")

        kind = type(self.tokenizer).__name__
        return "\n".join([line("target", self.target), line("draft", self.draft),
                          f"tokens  {kind} (latents x {self.tokenizer.scale:.4g}), {self.image_size} px images"])


def shipped_mar_info() -> dict:
    import json

    path = SHIPPED_DIR / "shipped_mar.json"
    if not path.is_file():
        raise VVSError(f"{path}: missing; reinstall vvs")
    return json.loads(path.read_text())


def load_mar_bundle(checkpoint: str | None = None, config: str | None = None, draft: str | None = None,
                    draft_config: str | None = None, vae: str | None = None, ema: bool = False) -> MARBundle:
    """Target and draft MAR and their tokenizer; with no files given, the shipped pair (the shipped VQ
    tokenizer's latents). Official checkpoints need ``config`` / ``draft_config`` (mar_base, mar_large, ...)
    and MAR's KL-16 VAE (``vae``)."""
    from vvs.models.latents import KLLatents, VQLatents
    from vvs.models.loading import load_kl_vae, load_mar
    from vvs.models.mar import mar_config

    if not (checkpoint or draft or vae):
        info = shipped_mar_info()
        target = load_mar(SHIPPED_DIR / SHIPPED_MAR["target"]).float()
        draft_model = load_mar(SHIPPED_DIR / SHIPPED_MAR["draft"]).float()
        tokenizer = VQLatents(load_vq(shipped_path("vq")).float(), info["tokenizer"]["latent_scale"])
        return MARBundle(target, draft_model, tokenizer, target.config.img_size,
                         [c["name"] for c in shipped_info()["classes"]], info["decoding_defaults"])
    if not (checkpoint and draft and vae):
        raise VVSError("a MAR export needs --checkpoint (target), --drafter (draft model) and --vae (KL-16) "
                       "together; give none of them to export the shipped pair")
    try:
        target_cfg = mar_config(config) if config else None
        draft_cfg = mar_config(draft_config) if draft_config else None
    except KeyError as err:
        raise VVSError(str(err.args[0])) from None
    target = load_mar(checkpoint, target_cfg, ema=ema)
    draft_model = load_mar(draft, draft_cfg, ema=ema)
    return MARBundle(target, draft_model, KLLatents(load_kl_vae(vae)), target.config.img_size)
