"""``Pipeline``: the object a service holds. ``generate(conditions, mode=..., seed=...)`` -> images + statistics."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vvs.engines.base import EngineSet
from vvs.runtime.decode import generate_tokens
from vvs.runtime.options import DecodeOptions, OptionsError
from vvs.runtime.random import image_seeds
from vvs.runtime.stats import ImageStats, aggregate


@dataclass
class Generation:
    tokens: torch.Tensor  # [n, N] token ids, raster order
    images: torch.Tensor | None  # [n, 3, H, W] in [0, 1], or None when not decoded
    stats: list[ImageStats]
    options: DecodeOptions
    decode_seconds: float = 0.0

    def aggregate(self) -> dict:
        return aggregate(self.stats)

    def pil_images(self):
        from PIL import Image

        arr = (self.images.clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy()
        return [Image.fromarray(np.ascontiguousarray(a)) for a in arr]


class Pipeline:
    def __init__(self, engines: EngineSet, options: DecodeOptions | None = None):
        self.engines = engines
        self.options = options or DecodeOptions.from_dict(engines.default_options)

    def check_conditions(self, conditions: torch.Tensor, caption_mask: torch.Tensor | None) -> torch.Tensor:
        cfg = self.engines.target
        if cfg.model_type == "c2i":
            conditions = torch.as_tensor(conditions, dtype=torch.long).reshape(-1)
            if conditions.numel() == 0:
                raise OptionsError("conditions: no class ids given; pass at least one")
            bad = conditions[(conditions < 0) | (conditions >= cfg.num_classes)]
            if bad.numel():
                raise OptionsError(f"class id {int(bad[0])} is out of range: the model has {cfg.num_classes} "
                                   f"classes (0-{cfg.num_classes - 1})")
            return conditions
        conditions = torch.as_tensor(conditions, dtype=torch.float32)
        if conditions.dim() != 3 or conditions.shape[1:] != (cfg.cls_token_num, cfg.caption_dim):
            raise OptionsError(f"captions must be [n, {cfg.cls_token_num}, {cfg.caption_dim}] embeddings, got "
                               f"{list(conditions.shape)}")
        if caption_mask is None:
            raise OptionsError("text-conditional generation needs caption_mask [n, C] (True for valid slots)")
        return conditions

    def generate(self, conditions, mode: str | None = None, seed: int | list[int] = 0, *, caption_mask=None,
                 decode_images: bool = True, **options) -> Generation:
        """Generate one image per condition (class ids ``[n]``, or left-padded caption embeddings
        ``[n, C, caption_dim]`` with ``caption_mask``). Options override the pipeline's defaults.

        ``seed``: an int (image i gets ``seed + i``) or one per image. An image depends only on its condition, its
        seed and the options, never on the other images of the call: ``generate([a, b], seed=7)`` gives image
        ``b`` exactly as ``generate([b], seed=8)`` does."""
        opts = self.options.updated(**({"mode": mode} if mode else {}), **options)
        conditions = self.check_conditions(conditions, caption_mask)
        seeds = image_seeds(seed, len(conditions))
        tokens, stats = generate_tokens(self.engines, conditions, opts, seeds, caption_mask)
        images, seconds = None, 0.0
        if decode_images:
            images, seconds = self.decode(tokens)
        return Generation(tokens, images, stats, opts, seconds)

    def decode(self, tokens: torch.Tensor) -> tuple[torch.Tensor, float]:
        import time

        start = time.perf_counter()
        images = self.engines.graphs["vq_decode"].run(codes=tokens.to(self.engines.device))["image"]
        return images.float().cpu(), time.perf_counter() - start
