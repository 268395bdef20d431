"""Prompts to the ids Lumina-mGPT generates from, as Alpha-VLLM/Lumina-mGPT's ``FlexARInferenceSolver`` builds them.

A prompt becomes the user's turn of its conversation template, ``Generate an image of {W}x{H} according to the
following prompt:\\n{prompt}``, closed by the separator ``<reserved08706>``, tokenized with a leading BOS (the
official ``Tokenizer.encode(..., bos=True)``: the tokenizer's own special tokens left out). The official solver
then lets the model sample the image's start tag and its two size tokens (height, then width); vvs writes them
(as LANTERN does): a folder paints one resolution, and those three ids are what a trained model gives them.

Guidance's null is the official one: the start and size tokens alone, a sequence of its own with none of the
prompt (``LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor``). vvs runs prompts of different
lengths in one batch by left-padding them to the target's ``cls_token_num`` slots; padded slots are masked out of
attention, and RoPE sees only relative positions, so the padding changes no logit.
"""
from __future__ import annotations

import torch

from vvs.families.lumina_mgpt.model import ChameleonConfig
from vvs.text import prompts

PATCH = 32  # pixels per size-token unit


def instruction(prompt: str, width: int, height: int) -> str:
    """The user's turn the official solver is given for ``prompt`` at ``width`` x ``height`` pixels."""
    return f"Generate an image of {width}x{height} according to the following prompt:\n{prompt}"


class PromptIds(prompts.PromptIds):
    template = "the instruction template and the image's start and size tokens"

    def ids(self, prompt: str) -> list[int]:
        c = self.config
        text = self.tokenizer.encode(instruction(prompt, c.side_pixels, c.side_pixels), add_special_tokens=False).ids
        size = c.size_token(c.grid_size)
        return [c.bos_id, *text, c.sep_id, c.boi_id, size, size]


def null(ids: torch.Tensor, mask: torch.Tensor, config: ChameleonConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The start and size tokens (each prompt's last three ids) alone, attending only themselves."""
    null_ids = torch.full_like(ids, config.pad_id)
    null_ids[:, -3:] = ids[:, -3:]
    slots = torch.zeros_like(mask)
    slots[:, -3:] = True
    return null_ids, slots
