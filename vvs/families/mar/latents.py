"""Continuous tokenizers for MAR models: images <-> the (scaled) latents the model generates.

- :class:`KLLatents`: MAR's own KL-16 VAE, latents times its ``scale`` (0.2325).
- :class:`VQLatents`: a VQ tokenizer without its codebook: l2-normalised pre-quantisation latents (what the
  codes approximate), times ``scale``. The shipped MAR pair uses the shipped VQ tokenizer this way.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vvs.families.mar.kl_vae import AutoencoderKL
from vvs.models.vq import VQModel


class VQLatents(nn.Module):
    def __init__(self, vq: VQModel, scale: float):
        super().__init__()
        self.vq, self.scale = vq, float(scale)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images in [-1, 1] -> latents ``[B, e_dim, h, w]``."""
        return F.normalize(self.vq.quant_conv(self.vq.encoder(images)), dim=1) * self.scale

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents -> images in about [-1, 1]."""
        return self.vq.decode(latents / self.scale)


class KLLatents(nn.Module):
    def __init__(self, vae: AutoencoderKL):
        super().__init__()
        self.vae, self.scale = vae, vae.config.scale

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return self.vae.encode_mean(images) * self.scale

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latents / self.scale)
