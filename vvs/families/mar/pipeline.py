"""``MARPipeline``: the :class:`~vvs.runtime.pipeline.Pipeline` of MAR-style models.

``generate(class_ids, mode="cspd", seed=...)`` -> :class:`~vvs.runtime.pipeline.Generation` whose ``tokens`` are
the latents ``[n, L, C]``. Images are decoded in batches of ``max_batch`` (static batches: MAR steps are global
to a batch, so there is no continuous batching here); an image depends only on its class, seed and options.
"""
from __future__ import annotations

import threading
import time

import torch

from vvs.families.mar.decode import MARDecoder
from vvs.families.mar.options import MAROptions
from vvs.runtime.conditions import class_ids
from vvs.runtime.options import check_request
from vvs.runtime.pipeline import Generation
from vvs.runtime.random import image_seeds


class MARPipeline:
    def __init__(self, engines, options: MAROptions | None = None, max_batch: int = 16):
        self.engines = engines
        self.options = options or MAROptions.from_dict(engines.default_options)
        self.max_batch = max_batch
        self.lock = threading.Lock()  # one batch at a time: the engines are not shared between decoders

    def close(self) -> None:
        self.engines.close()

    def options_for(self, mode: str | None = None, **options) -> MAROptions:
        opts, = check_request(self.options, [] if mode is None else [mode], options)
        self.engines.check_options(opts)
        return opts

    def generate(self, conditions, mode: str | None = None, seed: int | list[int] = 0, *,
                 decode_images: bool = True, **options) -> Generation:
        opts = self.options_for(mode, **options)
        labels = class_ids(conditions, self.engines.target.class_num)
        seeds = image_seeds(seed, len(labels))
        latents, stats = [], []
        with self.lock:
            for start in range(0, len(labels), self.max_batch):
                decoder = MARDecoder(self.engines, labels[start : start + self.max_batch],
                                     seeds[start : start + self.max_batch], opts)
                latents.append(decoder.run().cpu())
                stats += decoder.stats
        gen = Generation(torch.cat(latents), None, stats, opts)
        if decode_images:
            gen.images, gen.decode_seconds = self.decode(gen.tokens)
        return gen

    def decode(self, latents: torch.Tensor) -> tuple[torch.Tensor, float]:
        start = time.perf_counter()
        images = self.engines.graphs["latent_decode"].run(latents=latents.to(self.engines.device).float())["image"]
        return images.float().cpu(), time.perf_counter() - start
