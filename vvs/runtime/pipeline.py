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
from vvs.runtime.options import DecodeOptions, OptionsError
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
        """The pipeline's options with overrides, checked against the model (raises :class:`OptionsError`)."""
        opts = self.options.updated(**({} if mode is None else {"mode": mode}), **options)
        self.engines.check_options(opts)
        return opts

    def check_conditions(self, conditions, caption_mask) -> tuple[torch.Tensor, torch.Tensor | None]:
        cfg = self.engines.target
        prompts = isinstance(conditions, (list, tuple)) and any(isinstance(c, str) for c in conditions)
        if cfg.model_type == "c2i":
            if prompts:
                raise OptionsError("prompts given, but this model is class-conditional; pass class ids")
            return class_ids(conditions, cfg.num_classes), None
        if prompts:
            if self.engines.text is None:
                raise OptionsError("this engine folder has no text encoder; re-export it with vvs-export --t2i "
                                   "--text-encoder, or pass caption embeddings with caption_mask")
            if caption_mask is not None:
                raise OptionsError("caption_mask goes with caption embeddings, not with prompts")
            return self.engines.text.encode(conditions)
        return captions(conditions, caption_mask, cfg.cls_token_num, cfg.caption_dim)

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
        conditions, caption_mask = self.check_conditions(conditions, caption_mask)
        seeds = image_seeds(seed, len(conditions))
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


def class_ids(conditions, num_classes: int) -> torch.Tensor:
    """``[n]`` int64 class ids from a list, tuple or integer tensor/array; anything else is an error. The range is
    checked on Python ints, before any tensor: ids beyond int64 would overflow one."""
    if isinstance(conditions, (torch.Tensor, np.ndarray)):
        values = torch.as_tensor(conditions)
        if values.dtype.is_floating_point or values.dtype in (torch.bool, torch.complex64, torch.complex128):
            raise OptionsError(f"class ids must be integers, got a {values.dtype} tensor")
        if values.dim() != 1:
            raise OptionsError(f"class ids must be a 1-D tensor [n], got shape {list(values.shape)}")
        ids = values.tolist()
    elif isinstance(conditions, (list, tuple)):
        wrong = next((c for c in conditions if not isinstance(c, (int, np.integer)) or isinstance(c, bool)), None)
        if wrong is not None:
            raise OptionsError(f"class id {wrong!r} is not an integer; pass integer class ids")
        ids = [int(c) for c in conditions]
    else:
        raise OptionsError(f"conditions must be a list or tensor of class ids, got {type(conditions).__name__}")
    if not ids:
        raise OptionsError("conditions: no class ids given; pass at least one")
    bad = next((i for i in ids if not 0 <= i < num_classes), None)
    if bad is not None:
        raise OptionsError(f"class id {bad} is out of range: the model has {num_classes} classes "
                           f"(0-{num_classes - 1})")
    return torch.tensor(ids, dtype=torch.long)


def captions(conditions, caption_mask, slots: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded caption embeddings ``[n, slots, dim]`` and their mask ``[n, slots]`` (True = valid)."""
    if not isinstance(conditions, (torch.Tensor, np.ndarray)):
        raise OptionsError(f"captions must be a tensor [n, {slots}, {dim}], got {type(conditions).__name__}")
    conditions = torch.as_tensor(conditions)
    if not conditions.dtype.is_floating_point or conditions.dim() != 3 or conditions.shape[1:] != (slots, dim) \
            or conditions.shape[0] == 0:
        raise OptionsError(f"captions must be float embeddings [n >= 1, {slots}, {dim}], got {conditions.dtype} "
                           f"{list(conditions.shape)}")
    if not torch.isfinite(conditions).all():
        raise OptionsError("captions contain NaN or infinite values")
    if caption_mask is None:
        raise OptionsError(f"text-conditional generation needs caption_mask [n, {slots}] (True for valid slots)")
    mask = torch.as_tensor(caption_mask)
    if mask.dtype != torch.bool or mask.shape != conditions.shape[:2]:
        raise OptionsError(f"caption_mask must be bool {list(conditions.shape[:2])}, got {mask.dtype} {list(mask.shape)}")
    if not mask.any(1).all():
        raise OptionsError("caption_mask: every caption needs at least one valid slot")
    return conditions.float(), mask
