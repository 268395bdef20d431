"""Prompts to captions, as LlamaGen's text-to-image sampler builds them.

Each prompt is cleaned twice (:func:`~vvs.text.clean.preprocess`), tokenized to the target's caption slots
(truncated, end-of-sequence token, right-padded, as T5 does), encoded by the ``text_encode`` graph (the encoder's
last hidden state), then **left-padded**: the ``n`` valid rows move to the end, the padded rows are zeroed and the
mask is flipped. The CFG null condition is not made here; the runtime uses the target's ``uncond_embedding`` with
the prompt's mask.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

import torch
from tokenizers import Tokenizer

from vvs.errors import json_value
from vvs.runtime.options import OptionsError
from vvs.text.clean import preprocess

CACHE_PROMPTS = 4096  # encoded prompts kept per process: services see the same prompts again and again


def left_pad(hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded encoder states ``[n, C, D]`` and mask ``[n, C]`` (1 = token) -> left-padded states (pads zero)
    and a bool mask, valid slots last."""
    slots = hidden.shape[1]
    valid = mask.long().sum(1, keepdim=True)
    source = (torch.arange(slots) + valid) % slots  # slot j takes row (j + n) mod C: pads first, then the tokens
    moved = hidden.gather(1, source[..., None].expand(-1, -1, hidden.shape[2]))
    flipped = mask.flip(1).bool()
    return moved * flipped[..., None], flipped


class TextEncoder:
    """A folder's text encoder. ``encode`` is thread-safe; prompts seen before come from the cache."""

    def __init__(self, tokenizer: Tokenizer, graph, slots: int, device: torch.device, max_rows: int | None = None):
        """``max_rows``: the most prompts one graph call takes (a TensorRT engine's profile), else any number."""
        self.graph, self.slots, self.device, self.max_rows = graph, slots, device, max_rows
        self.tokenizer = tokenizer
        self.tokenizer.enable_truncation(max_length=slots)
        pad = tokenizer.token_to_id("<pad>")
        self.tokenizer.enable_padding(pad_id=0 if pad is None else pad, pad_token="<pad>", length=slots)
        self.cache: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.lock = threading.Lock()

    def tokenize(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask ``[n, C]`` (int64, right-padded) of cleaned prompts."""
        encodings = self.tokenizer.encode_batch([preprocess(p) for p in prompts])
        return (torch.tensor([e.ids for e in encodings], dtype=torch.long),
                torch.tensor([e.attention_mask for e in encodings], dtype=torch.long))

    def encode(self, prompts) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded captions ``[n, C, D]`` (float32) and their bool mask ``[n, C]``."""
        prompts = check_prompts(prompts)
        with self.lock:
            rows = {p: self.cache[p] for p in prompts if p in self.cache}
        missing = [p for p in dict.fromkeys(prompts) if p not in rows]
        step = self.max_rows or max(1, len(missing))
        for start in range(0, len(missing), step):
            chunk = missing[start : start + step]
            ids, mask = self.tokenize(chunk)
            hidden = self.graph.run(input_ids=ids.to(self.device),
                                    attention_mask=mask.to(self.device))["hidden"].float().cpu()
            rows.update(zip(chunk, zip(*left_pad(hidden, mask))))
        with self.lock:
            for p in rows:
                self.cache[p] = rows[p]
                self.cache.move_to_end(p)
            while len(self.cache) > CACHE_PROMPTS:
                self.cache.popitem(last=False)
        return torch.stack([rows[p][0] for p in prompts]), torch.stack([rows[p][1] for p in prompts])


def check_prompts(prompts) -> list[str]:
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)):
        raise OptionsError(f"prompts must be a list of strings, got {type(prompts).__name__}")
    if not prompts:
        raise OptionsError("no prompts given; pass at least one")
    for i, prompt in enumerate(prompts, 1):  # counted from 1, as vvs-run counts them
        if not isinstance(prompt, str):
            raise OptionsError(f"prompt {i} of {len(prompts)} is not a string: {json_value(prompt)} "
                               f"({type(prompt).__name__})")
        if not prompt.strip():
            raise OptionsError(f"prompt {i} of {len(prompts)} is empty; describe the image to generate")
    return list(prompts)


def folder_text_encoder(folder, manifest: dict, backend: str, graph, device: torch.device) -> TextEncoder | None:
    """The text encoder of an engine folder whose ``text_encode`` graph ``backend`` has opened (``graph``), or
    None for a folder without one. TensorRT engines take at most the images they were built for."""
    if graph is None:
        return None
    tokenizer = Tokenizer.from_file(str(Path(folder) / manifest["text"]["tokenizer"]))
    return TextEncoder(tokenizer, graph, manifest["model"]["target"]["cls_token_num"], device,
                       manifest.get(backend, {}).get("max_images"))
