"""The graphs of a MAR engine folder, their I/O specs, and the torch modules they are exported from.

- ``target_forward`` / ``draft_forward``: the transformer, ``tokens [batch, L, C]``, ``mask [batch, L]`` (True =
  unknown) and ``labels [batch]`` (``class_num`` = no class) -> ``z [batch, L, D]``. Masks are inputs, so one graph
  serves every step, every order, and rows at different steps.
- ``target_head`` / ``draft_head``: the diffusion head's whole sampler for ``tokens`` tokens, unrolled (its step
  count is fixed by the model): conditions, guidance per token, temperature, and every noise it uses in; the last
  step's Gaussian, the sample and the whole denoising chain out. ``bench/mar_head.py`` measures this against one
  graph call per step.
- ``target_head_steps`` / ``draft_head_steps``: the head's Gaussian of every step along a given chain, all steps in
  one batch (CSpD's trajectory test needs each model's density of the other's chain).
- ``latent_decode``: latents ``[images, L, C]`` -> images in [0, 1].
"""
from __future__ import annotations

from torch import nn

from vvs.export.spec import GraphSpec, TensorSpec
from vvs.families.mar.diffusion import Schedule
from vvs.families.mar.model import MAR, MARConfig, unpatchify


def mar_graph_specs(target: MARConfig, draft: MARConfig, image_size: int) -> dict[str, GraphSpec]:
    L, C = target.seq_len, target.token_embed_dim
    specs = {}
    for role, cfg in (("target", target), ("draft", draft)):
        D = cfg.decoder_embed_dim
        steps = sampling_steps(cfg)
        specs[f"{role}_forward"] = GraphSpec(f"{role}_forward", (
            TensorSpec("tokens", "float32", ("batch", L, C)),
            TensorSpec("mask", "bool", ("batch", L)),
            TensorSpec("labels", "int64", ("batch",)),
        ), (TensorSpec("z", "float32", ("batch", L, D)),))
        specs[f"{role}_head"] = GraphSpec(f"{role}_head", (
            TensorSpec("z_cond", "float32", ("tokens", D)),
            TensorSpec("z_uncond", "float32", ("tokens", D)),
            TensorSpec("cfg", "float32", ("tokens",)),
            TensorSpec("temperature", "float32", ("tokens",)),
            TensorSpec("noise", "float32", ("tokens", C)),
            TensorSpec("step_noise", "float32", ("tokens", steps, C)),
        ), (*(TensorSpec(name, "float32", ("tokens", C)) for name in ("mean", "std", "sample")),
             TensorSpec("chain", "float32", ("tokens", steps + 1, C))))
        specs[f"{role}_head_steps"] = GraphSpec(f"{role}_head_steps", (
            TensorSpec("z_cond", "float32", ("tokens", D)),
            TensorSpec("z_uncond", "float32", ("tokens", D)),
            TensorSpec("cfg", "float32", ("tokens",)),
            TensorSpec("temperature", "float32", ("tokens",)),
            TensorSpec("chain", "float32", ("tokens", steps + 1, C)),
        ), tuple(TensorSpec(name, "float32", ("tokens", steps, C)) for name in ("mean", "std")))
    specs["latent_decode"] = GraphSpec("latent_decode", (
        TensorSpec("latents", "float32", ("images", L, C)),
    ), (TensorSpec("image", "float32", ("images", 3, image_size, image_size)),))
    return specs


def sampling_steps(cfg: MARConfig) -> int:
    return Schedule.sampling(cfg.num_sampling_steps).num_steps


class ForwardGraph(nn.Module):
    def __init__(self, model: MAR):
        super().__init__()
        self.model = model

    def forward(self, tokens, mask, labels):
        return self.model(tokens, mask, labels)


class HeadGraph(nn.Module):
    def __init__(self, model: MAR):
        super().__init__()
        self.diffloss = model.diffloss

    def forward(self, z_cond, z_uncond, cfg, temperature, noise, step_noise):
        return self.diffloss.sample(noise, step_noise, temperature, z_cond, z_uncond, cfg)


class HeadStepsGraph(nn.Module):
    def __init__(self, model: MAR):
        super().__init__()
        self.diffloss = model.diffloss

    def forward(self, z_cond, z_uncond, cfg, temperature, chain):
        return self.diffloss.steps(chain, temperature, z_cond, z_uncond, cfg)


class LatentDecodeGraph(nn.Module):
    """``tokenizer.decode`` takes the model's (scaled) latents ``[B, C, h, w]``."""

    def __init__(self, tokenizer: nn.Module, channels: int, patch: int):
        super().__init__()
        self.tokenizer, self.channels, self.patch = tokenizer, channels, patch

    def forward(self, latents):
        images = self.tokenizer.decode(unpatchify(latents, self.channels, self.patch))
        return (images.clamp(-1, 1) + 1) / 2


def build_mar_graphs(target: MAR, draft: MAR, tokenizer: nn.Module) -> dict[str, nn.Module]:
    c = target.config
    graphs = {}
    for role, model in (("target", target), ("draft", draft)):
        graphs.update({f"{role}_forward": ForwardGraph(model).eval(), f"{role}_head": HeadGraph(model).eval(),
                       f"{role}_head_steps": HeadStepsGraph(model).eval()})
    graphs["latent_decode"] = LatentDecodeGraph(tokenizer, c.vae_embed_dim, c.patch_size).eval()
    return graphs
