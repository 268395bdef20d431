"""What a discrete-token family's target architecture gives the shared machinery (graphs, exporter, engine sets,
calibration, ``vvs-bench --scale``), so that one exporter and one loop serve every such family. A family names its
record in its registry entry (``Family.target_arch``); the machinery finds it from a bundle's family or a
manifest's. The target module itself meets :class:`vvs.discrete.target.DiscreteTarget`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from vvs.calib.int8 import Int8Layout
from vvs.discrete.target import DiscreteTarget
from vvs.models.loading import load_vq


@dataclass(frozen=True)
class TargetArch:
    family: str  # the manifest's model.family
    kind: str  # the kind recorded in the target's vvs safetensors file
    config: type  # its config dataclass
    load: Callable[[Path], DiscreteTarget]  # a vvs target file -> the target, in eval mode
    # (config, tables, manifest's "model" entry, the folder's or bundle's text tokenizer) -> its Conditioning;
    # tables holds a t2i target's "null_condition"
    conditioning: Callable[..., object]
    int8: Int8Layout | None = None  # where SmoothQuant finds its block linears (vvs-export --precision int8)
    # (bundle, num, seed) -> (condition rows, token rows, mask or None): teacher-forced calibration data, sampled from
    # the target with guidance, nulls included (vvs.calib.int8)
    calibration: Callable[..., tuple] | None = None
    model: type | None = None  # the target's module class (built from a config)
    # vvs-bench --scale: a module with SIZES and inflated_config / inflate_bundle(small, size, n_layer)
    inflation: str | None = None
    # config -> the tokens it forces into the image stream (vvs.runtime.conditions.TokenLayout); None: none
    token_layout: Callable[..., object] | None = None
    # its image tokenizer: the kind its vvs file records, and the loader of that file. The module offers
    # ``config`` (``downsample``, ``codebook_size``, ``codebook_embed_dim``), ``quantize.codebook()`` (a row per
    # stream id) and ``decode_codes(codes, grid)`` (stream ids -> images in [0, 1])
    vq_kind: str = "vq"
    load_vq: Callable[[Path], nn.Module] = load_vq


# varied scenes for calibrating a prompt-id target (Janus-Pro, Lumina-mGPT): an official checkpoint ships no captions
CALIBRATION_PROMPTS = (
    "a photo of a cat sleeping on a sofa", "a red car parked on a rainy street at night", "a bowl of fruit on a table",
    "a mountain lake at sunrise", "a portrait of an old man with a beard", "a city skyline under a cloudy sky",
    "a cup of coffee on a wooden desk", "a dog running on the beach", "a vase of sunflowers by a window",
    "a plate of pasta with tomato sauce", "a small boat on a calm sea", "a forest path in autumn",
)


def fitting(builder, prompt: str) -> str:
    """``prompt``'s first words that fit the target's prompt slots (all of them at an official folder's 64)."""
    words = prompt.split()
    while len(words) > 1 and len(builder.ids(" ".join(words))) > builder.config.cls_token_num:
        words.pop()
    return " ".join(words)


def prompt_calibration(cfg_scale: float) -> Callable:
    """The calibration of a target that reads prompt ids: :data:`CALIBRATION_PROMPTS` in turn, each decoded by
    ``ar`` with the family's guidance ``cfg_scale``, and their nulls, each row masked as the runtime masks it (its
    conditioning's slots, guidance nulls' own)."""

    @torch.no_grad()
    def calibration(bundle, num: int, seed: int):
        from vvs.discrete.engines import torch_engines
        from vvs.models.layers import caption_causal_mask
        from vvs.runtime.options import DecodeOptions
        from vvs.runtime.pipeline import Pipeline

        conditioning = bundle.arch.conditioning(bundle.target.config, {}, {}, bundle.tokenizer)
        prompts = [fitting(conditioning.prompts, CALIBRATION_PROMPTS[i % len(CALIBRATION_PROMPTS)])
                   for i in range(num)]
        pipe = Pipeline(torch_engines(bundle), DecodeOptions(mode="ar", cfg_scale=cfg_scale, temperature=1.0,
                                                             top_k=0))
        try:
            tokens = pipe.generate(prompts, seed=seed, decode_images=False).tokens[:, :-1]
        finally:
            pipe.close()
        ids, mask = conditioning.prepare(None, prompts, None)
        null, null_mask = conditioning.null(None, ids, mask)
        slots = torch.cat([mask, null_mask])
        seen = torch.cat([slots, torch.ones(len(slots), tokens.shape[1], dtype=torch.bool)], 1)
        return torch.cat([ids, null]), torch.cat([tokens, tokens]), caption_causal_mask(seen, seen.shape[1])

    return calibration
