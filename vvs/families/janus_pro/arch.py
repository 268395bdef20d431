"""Janus-Pro's target architecture for the LlamaGen machinery (:class:`vvs.families.llamagen.arch.TargetArch`)."""
from __future__ import annotations

from pathlib import Path

import torch

from vvs.calib.int8 import LLAMA_INT8
from vvs.errors import VVSError
from vvs.families.janus_pro.loading import load_janus
from vvs.families.janus_pro.model import JanusConfig, JanusGen
from vvs.families.janus_pro.prompts import PromptConditioning, PromptIds
from vvs.families.llamagen.arch import TargetArch


def _conditioning(config: JanusConfig, tables: dict, model_info: dict, tokenizer: Path | None):
    if tokenizer is None:
        raise VVSError("a Janus-Pro target reads prompt ids: give its tokenizer.json (the official folder's)")
    return PromptConditioning(PromptIds.from_file(tokenizer, config))


# varied scenes for int8 calibration: an official checkpoint ships no captions
CALIBRATION_PROMPTS = (
    "a photo of a cat sleeping on a sofa", "a red car parked on a rainy street at night", "a bowl of fruit on a table",
    "a mountain lake at sunrise", "a portrait of an old man with a beard", "a city skyline under a cloudy sky",
    "a cup of coffee on a wooden desk", "a dog running on the beach", "a vase of sunflowers by a window",
    "a plate of pasta with tomato sauce", "a small boat on a calm sea", "a forest path in autumn",
)


def fitting(builder: PromptIds, prompt: str) -> str:
    """``prompt``'s first words that fit the target's prompt slots (all of them at an official folder's 64)."""
    words = prompt.split()
    while len(words) > 1 and len(builder.ids(" ".join(words))) > builder.config.cls_token_num:
        words.pop()
    return " ".join(words)


@torch.no_grad()
def _calibration(bundle, num: int, seed: int):
    """:data:`CALIBRATION_PROMPTS` in turn, each decoded by ``ar`` with the official guidance 5, and their nulls,
    padded as the runtime pads them (a null row sees what its prompt's row sees)."""
    from vvs.families.llamagen.engines import torch_engines
    from vvs.models.layers import caption_causal_mask
    from vvs.runtime.options import DecodeOptions
    from vvs.runtime.pipeline import Pipeline

    builder = PromptIds.from_file(bundle.tokenizer, bundle.target.config)
    prompts = [fitting(builder, CALIBRATION_PROMPTS[i % len(CALIBRATION_PROMPTS)]) for i in range(num)]
    pipe = Pipeline(torch_engines(bundle), DecodeOptions(mode="ar", cfg_scale=5.0, temperature=1.0, top_k=0))
    try:
        tokens = pipe.generate(prompts, seed=seed, decode_images=False).tokens[:, :-1]
    finally:
        pipe.close()
    ids, mask = builder.encode(prompts)
    seen = torch.cat([mask, torch.ones_like(tokens, dtype=torch.bool)], 1)
    causal = caption_causal_mask(seen, seen.shape[1])
    return (torch.cat([ids, bundle.target.null_condition(ids)]), torch.cat([tokens, tokens]),
            torch.cat([causal, causal]))


ARCH = TargetArch("janus-pro", "janus", JanusConfig, load_janus, _conditioning, int8=LLAMA_INT8,
                  calibration=_calibration, model=JanusGen, inflation="vvs.families.janus_pro.inflate")
