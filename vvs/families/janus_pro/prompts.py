"""Prompts to the ids Janus-Pro generates from, as deepseek-ai/Janus ``generation_inference.py`` builds them.

A prompt becomes the "deepseek" conversation with an empty system prompt, a user turn and an open assistant turn,
followed by the image-start tag: ``<|User|>: {prompt}\\n\\n<|Assistant|>:<begin_of_image>``, tokenized with a
leading BOS (the official tokenizer's ``encode``). Guidance's null is the same sequence with every id except the
first (BOS) and the last (``<begin_of_image>``) replaced by the pad token, all of it attended, as the official
script builds it. vvs runs prompts of different lengths in one batch by left-padding them to the target's
``cls_token_num`` slots; padded slots are masked out of attention and positions count from the first slot,
which is what transformers' ``generate`` does with a left-padded batch.
"""
from __future__ import annotations

import torch

from vvs.families.janus_pro.model import JanusConfig, guidance_null
from vvs.text import prompts

USER, ASSISTANT = "<|User|>", "<|Assistant|>"
IMAGE_START = "<begin_of_image>"


def conversation(prompt: str) -> str:
    """The text the official script tokenizes for ``prompt`` (its BOS comes from the tokenizer, not from here)."""
    return f"{USER}: {prompt}\n\n{ASSISTANT}:{IMAGE_START}"


class PromptIds(prompts.PromptIds):
    """Janus-Pro's prompt builder (the official tokenizer's leading BOS, then the conversation)."""

    template = "the chat template"

    def ids(self, prompt: str) -> list[int]:
        return [self.config.bos_id] + self.tokenizer.encode(conversation(prompt), add_special_tokens=False).ids


def null(ids: torch.Tensor, mask: torch.Tensor, config: JanusConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The official null, over its prompt's slots (padding included, as the official script attends it)."""
    return guidance_null(ids, config.pad_id), mask
