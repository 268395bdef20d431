"""The shipped MAR pair (target and draft on the shipped VQ tokenizer's latents), or official checkpoints."""
from __future__ import annotations

from dataclasses import dataclass

from vvs.errors import VVSError
from vvs.families.mar.model import MAR
from vvs.models.loading import load_vq
from vvs.shipped import SHIPPED_DIR, shipped_info, shipped_path


SHIPPED_MAR = {"target": "mar_target.safetensors", "draft": "mar_draft.safetensors"}


@dataclass
class MARBundle:
    target: "MAR"
    draft: "MAR"
    tokenizer: object  # vvs.families.mar.latents.VQLatents or KLLatents
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


def load_mar_bundle(checkpoint: str | None = None, config: str | None = None, draft: str | None = None,
                    draft_config: str | None = None, vae: str | None = None, ema: bool = False) -> MARBundle:
    """Target and draft MAR and their tokenizer; with no files given, the shipped pair (the shipped VQ
    tokenizer's latents). Official checkpoints need ``config`` / ``draft_config`` (mar_base, mar_large, ...)
    and MAR's KL-16 VAE (``vae``)."""
    from vvs.families.mar.latents import KLLatents, VQLatents
    from vvs.families.mar.loading import load_kl_vae, load_mar
    from vvs.families.mar.model import mar_config

    if not (checkpoint or draft or vae):
        info = shipped_info("shipped_mar.json")
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

