"""Prompts through a model's own tokenizer into left-padded prompt ids: what every family that reads prompt ids
with its target (Janus-Pro, Lumina-mGPT) shares. A family says how one prompt becomes ids (its template, special
tokens and, where it has them, image start and size tokens) and what guidance's null is."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tokenizers import Tokenizer

from vvs.runtime.options import MAX_PROMPT_TOKENS, OptionsError
from vvs.text.encoder import check_prompts


class PromptIds:
    """A folder's prompt builder: the model's own ``tokenizer.json`` and the target's config (``cls_token_num``,
    ``pad_id`` and the ids its template needs). A family's subclass writes :meth:`ids`."""

    template = "its template"  # how the too-long message names what was added to the prompt

    def __init__(self, tokenizer: Tokenizer, config):
        self.tokenizer, self.config = tokenizer, config

    @classmethod
    def from_file(cls, path: Path | str, config) -> "PromptIds":
        return cls(Tokenizer.from_file(str(path)), config)

    def ids(self, prompt: str) -> list[int]:
        raise NotImplementedError

    def encode(self, prompts) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids ``[n, C]`` (pad id in the padded slots) and their bool mask ``[n, C]``."""
        prompts = check_prompts(prompts)
        c, pad = self.config.cls_token_num, self.config.pad_id
        rows = [self.ids(p) for p in prompts]
        too_long = next(((p, r) for p, r in zip(prompts, rows) if len(r) > c), None)
        if too_long is not None:
            prompt, row = too_long
            instead = (f", or re-export with --prompt-tokens {len(row)} or more" if len(row) <= MAX_PROMPT_TOKENS
                       else f" (no folder takes more than {MAX_PROMPT_TOKENS})")
            raise OptionsError(f"prompt {prompt[:40]!r}{'...' if len(prompt) > 40 else ''} is {len(row)} tokens with "
                               f"{self.template}; this folder takes at most {c}: shorten it{instead}")
        ids = torch.full((len(rows), c), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), c, dtype=torch.bool)
        for i, row in enumerate(rows):
            ids[i, c - len(row):] = torch.tensor(row)
            mask[i, c - len(row):] = True
        return ids, mask


class PromptConditioning:
    """The loop's conditioning hook (:class:`vvs.runtime.conditions.Conditioning`) for prompt ids: prompts in,
    left-padded ids and their mask out; guidance's null built by the family from each prompt's ids and mask."""

    kind = "text"

    def __init__(self, prompts: PromptIds, null: Callable[..., tuple[torch.Tensor, torch.Tensor]]):
        self.prompts, self._null = prompts, null  # null(ids, mask, config) -> (null ids, the slots they attend)

    def prepare(self, engines, conditions, caption_mask):
        if caption_mask is not None:
            raise OptionsError("caption_mask goes with LlamaGen's caption embeddings; this model takes prompts only")
        if isinstance(conditions, (torch.Tensor, np.ndarray)):
            raise OptionsError("this model takes prompts (a list of strings), not a tensor")
        return self.prompts.encode(conditions)

    def null(self, engines, conditions: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._null(conditions, mask, self.prompts.config)
