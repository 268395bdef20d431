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

from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from vvs.families.janus_pro.model import JanusConfig, guidance_null
from vvs.runtime.options import OptionsError
from vvs.text.encoder import check_prompts

USER, ASSISTANT = "<|User|>", "<|Assistant|>"
IMAGE_START = "<begin_of_image>"


def conversation(prompt: str) -> str:
    """The text the official script tokenizes for ``prompt`` (its BOS comes from the tokenizer, not from here)."""
    return f"{USER}: {prompt}\n\n{ASSISTANT}:{IMAGE_START}"


class PromptIds:
    """A folder's prompt builder: the model's own ``tokenizer.json`` and its special ids."""

    def __init__(self, tokenizer: Tokenizer, config: JanusConfig):
        self.tokenizer, self.config = tokenizer, config

    @classmethod
    def from_file(cls, path: Path | str, config: JanusConfig) -> "PromptIds":
        return cls(Tokenizer.from_file(str(path)), config)

    def ids(self, prompt: str) -> list[int]:
        return [self.config.bos_id] + self.tokenizer.encode(conversation(prompt), add_special_tokens=False).ids

    def encode(self, prompts) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids ``[n, C]`` (pad id in the padded slots) and their bool mask ``[n, C]``."""
        prompts = check_prompts(prompts)
        c, pad = self.config.cls_token_num, self.config.pad_id
        rows = [self.ids(p) for p in prompts]
        too_long = next(((p, r) for p, r in zip(prompts, rows) if len(r) > c), None)
        if too_long is not None:
            prompt, row = too_long
            raise OptionsError(f"prompt {prompt[:40]!r}{'...' if len(prompt) > 40 else ''} is {len(row)} tokens with "
                               f"the chat template; this folder takes at most {c}: shorten it, or re-export with "
                               f"--prompt-tokens {len(row)} or more")
        ids = torch.full((len(rows), c), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), c, dtype=torch.bool)
        for i, row in enumerate(rows):
            ids[i, c - len(row):] = torch.tensor(row)
            mask[i, c - len(row):] = True
        return ids, mask


class PromptConditioning:
    """The loop's conditioning hook (:class:`vvs.runtime.conditions.Conditioning`) for Janus-Pro: prompts in,
    left-padded ids and their mask out; guidance's null built from each prompt's ids."""

    kind = "text"

    def __init__(self, prompts: PromptIds):
        self.prompts = prompts

    def prepare(self, engines, conditions, caption_mask):
        if caption_mask is not None:
            raise OptionsError("caption_mask goes with LlamaGen's caption embeddings; Janus-Pro takes prompts only")
        if isinstance(conditions, (torch.Tensor, np.ndarray)):
            raise OptionsError("this model takes prompts (a list of strings), not a tensor")
        return self.prompts.encode(conditions)

    def null(self, engines, conditions: torch.Tensor) -> torch.Tensor:
        return guidance_null(conditions, self.prompts.config.pad_id)
