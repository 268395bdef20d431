"""``Pipeline``: the object a service holds. ``generate(conditions, mode=..., seed=...)`` -> images + statistics.

Any number of threads may call one ``Pipeline`` at once: their images are decoded together by its
:class:`~vvs.runtime.scheduler.Scheduler` (continuous batching), and each call gets the tokens it gets alone.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from vvs.engines.base import EngineSet
from vvs.runtime.options import DecodeOptions, OptionsError, about, check_request
from vvs.runtime.random import image_seeds
from vvs.runtime.scheduler import Scheduler
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


@dataclass
class Job:
    """A submitted request: its tokens and statistics arrive in ``future``; ``cancel()`` frees its batch slots at
    the next cycle boundary."""
    future: Future  # -> (tokens [n, N], [ImageStats] * n)
    options: DecodeOptions

    def cancel(self) -> bool:
        return self.future.cancel()

    def result(self, timeout: float | None = None) -> Generation:
        tokens, stats = self.future.result(timeout)
        return Generation(tokens, None, stats, self.options)


class Pipeline:
    def __init__(self, engines: EngineSet, options: DecodeOptions | None = None, max_batch: int = 16,
                 max_queue: int = 256):
        """``max_batch``: images decoded together at most; ``max_queue``: images waiting at most (more is
        :class:`~vvs.runtime.scheduler.Busy`). The engine set's pool keeps the cache buffers of every batch size it
        has decoded (so that addresses recur for CUDA graphs and TensorRT): size ``max_batch`` for that memory."""
        self.engines = engines
        self.options = options or DecodeOptions.from_dict(engines.default_options)
        self.scheduler = Scheduler(engines, max_batch, max_queue)

    def close(self) -> None:
        """Stop decoding (waiting and running requests fail) and persist the backend's state."""
        self.scheduler.close()
        self.engines.close()

    def options_for(self, mode: str | None = None, **options) -> DecodeOptions:
        """The pipeline's options with overrides, checked as every request is (:func:`check_request`) and against
        the model (raises :class:`OptionsError`)."""
        opts, = check_request(self.options, [] if mode is None else [mode], options)
        self.engines.check_options(opts)
        return opts

    def generate(self, conditions, mode: str | None = None, seed: int | list[int] = 0, *, caption_mask=None,
                 decode_images: bool = True, timeout: float | None = None, **options) -> Generation:
        """Generate one image per condition: class ids ``[n]``; or, for a text-conditional model, prompts (a list
        of strings; the folder's text encoder makes the captions) or left-padded caption embeddings
        ``[n, C, caption_dim]`` with ``caption_mask``. Options override the pipeline's defaults.

        ``seed``: an int (image i gets ``seed + i``) or one per image. An image depends only on its condition, its
        seed and the options, never on the other images of the call or of other calls running at the same time:
        ``generate([a, b], seed=7)`` gives image ``b`` exactly as ``generate([b], seed=8)`` does.
        ``timeout``: seconds until the call fails with :class:`~vvs.runtime.scheduler.RequestTimeout`."""
        job = self.submit(conditions, mode, seed, caption_mask=caption_mask, timeout=timeout, **options)
        gen = job.result()
        if decode_images:
            gen.images, gen.decode_seconds = self.decode(gen.tokens)
        return gen

    def submit(self, conditions, mode: str | None = None, seed: int | list[int] = 0, *, caption_mask=None,
               timeout: float | None = None, **options) -> Job:
        """Queue a request and return at once (arguments as :meth:`generate`; nothing is decoded to pixels).
        Bad arguments raise :class:`OptionsError` here; a full queue raises
        :class:`~vvs.runtime.scheduler.Busy`."""
        opts = self.options_for(mode, **options)
        with about("conditions"):
            conditions, caption_mask = self.engines.conditioning.prepare(self.engines, conditions, caption_mask)
        with about("seed"):
            seeds = image_seeds(seed, len(conditions))
        with about("timeout"):
            check_timeout(timeout)
        return Job(self.scheduler.submit(conditions, opts, seeds, caption_mask, timeout), opts)

    def decode(self, tokens: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Images ``[n, 3, H, W]`` in [0, 1] of code ids ``[n, N]``."""
        cfg = self.engines.target
        tokens = torch.as_tensor(tokens)
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.dim() != 2 \
                or tokens.shape[1] != cfg.num_image_tokens:
            raise OptionsError(f"codes must be integers [n, {cfg.num_image_tokens}], got {tokens.dtype} "
                               f"{list(tokens.shape)}")
        low, high = (int(tokens.min()), int(tokens.max())) if tokens.numel() else (0, 0)
        if not 0 <= low <= high < cfg.vocab_size:
            raise OptionsError(f"codes must lie in [0, {cfg.vocab_size}) (the codebook's size), got {low}..{high}")
        start = time.perf_counter()
        images = self.engines.graphs["vq_decode"].run(codes=tokens.long().to(self.engines.device))["image"]
        return images.float().cpu(), time.perf_counter() - start


def as_conditions(values: list):
    """What :meth:`Pipeline.generate` takes for a list of class ids (a tensor) or prompts (the list itself)."""
    return list(values) if values and isinstance(values[0], str) else torch.tensor(values, dtype=torch.long)


def check_timeout(timeout) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise OptionsError(f"timeout {timeout!r}: give the seconds a request may take (a number > 0), or None")
