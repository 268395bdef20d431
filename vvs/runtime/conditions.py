"""How a discrete-token family turns what a user asks for into its target's prefix: one of the hooks
(:class:`Conditioning`) the shared loop calls instead of knowing the family.

The loop asks a family's conditioning for two things: the condition tensor its ``target_prefill`` graph takes
(:meth:`Conditioning.prepare`, with a mask over left-padded slots where there is one), and the guidance null that
fills the unconditional rows (:meth:`Conditioning.null`). Where the image's tokens sit follows from the target's
config: ``cls_token_num`` condition slots, then ``num_image_tokens`` stream tokens at positions ``C + i``, some of
which a family may force (:class:`TokenLayout`); the graphs take and return ids of the image vocabulary only (a
joint text + image vocabulary maps them to its own ids inside its graphs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from vvs.errors import VVSError, json_value
from vvs.runtime.options import OptionsError


class Conditioning(Protocol):
    kind: str  # "class" or "text": what ``vvs-run`` / the API ask the user for

    def prepare(self, engines, conditions, caption_mask) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Checked conditions ``[n, ...]`` for ``target_prefill`` and their slot mask (None: every slot valid);
        bad input raises :class:`OptionsError`."""

    def null(self, engines, conditions: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The guidance null of the prepared ``conditions [n, ...]`` (one per image; a prompt's null may depend on
        its prompt), in the graphs' dtype on the engines' device, and the slots it attends (None where ``mask`` is
        None: every slot; else ``[n, C]`` bool, which may be ``mask`` itself)."""


def class_of(text: str, names) -> int | None:
    """The class id a text names: an id written as digits or one of the folder's class ``names``; None if
    neither. The one vocabulary of ``vvs-run --class``, the Pipeline and the HTTP APIs."""
    text = text.strip()
    if text.isascii() and text.lstrip("-").isdigit():  # a negative id is an id, out of range
        return int(text)
    return list(names).index(text) if text in names else None


def class_ids(conditions, num_classes: int, names=()) -> torch.Tensor:
    """``[n]`` int64 class ids from a list, tuple or integer tensor/array; a list may name classes as text
    (:func:`class_of`); anything else is an error. The range is checked on Python ints, before any tensor: ids
    beyond int64 would overflow one."""
    if isinstance(conditions, (torch.Tensor, np.ndarray)):
        values = torch.as_tensor(conditions)
        if values.dtype.is_floating_point or values.dtype in (torch.bool, torch.complex64, torch.complex128):
            raise OptionsError(f"class ids must be integers, got a {values.dtype} tensor")
        if values.dim() != 1:
            raise OptionsError(f"class ids must be a 1-D tensor [n], got shape {list(values.shape)}")
        ids = values.tolist()
    elif isinstance(conditions, (list, tuple)):
        ids = [_class_id(c, num_classes, names) for c in conditions]
    else:
        raise OptionsError(f"conditions must be a list or tensor of class ids, got {type(conditions).__name__}")
    if not ids:
        raise OptionsError("conditions: no class ids given; pass at least one")
    bad = next((i for i in ids if not 0 <= i < num_classes), None)
    if bad is not None:
        raise OptionsError(f"class id {bad} is out of range: the model has {num_classes} classes "
                           f"(0-{num_classes - 1})")
    return torch.tensor(ids, dtype=torch.long)


def _class_id(value, num_classes: int, names) -> int:
    if isinstance(value, str):
        found = class_of(value, names)
        if found is None:
            known = f" or a name ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''})" if names else ""
            raise OptionsError(f"{value[:60]!r} is not a class of this class-conditional model; give a class id "
                               f"(0-{num_classes - 1}){known}")
        return found
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise OptionsError(f"class id {json_value(value)} is not an integer; pass integer class ids or class names")
    return int(value)


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


@dataclass(frozen=True)
class TokenLayout:
    """Tokens a family forces into the image stream (a Chameleon-style end-of-line token after every row):
    ``forced[i]`` is the token at stream index ``i``, or -1 where the model chooses. The loop makes a forced token
    the only one with any probability, for the target and in the drafted tree, so it is never a free choice, is
    always accepted, and is left out of the statistics (accepted drafts, tokens per forward). A family without
    forced tokens has no layout (``EngineSet.token_layout`` is None), and the loop does none of this."""

    forced: tuple[int, ...]

    def free_tokens(self, stream: int) -> int:
        """How many of the first ``stream`` tokens are the model's choice."""
        return sum(1 for token in self.forced[:stream] if token < 0)

    def tables(self, length: int, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """``forced [length]`` (-1 past the stream) and ``free_before [length + 1]``: the free tokens before each
        stream index. A layout longer than the stream or forcing an id outside the vocabulary is an error."""
        if len(self.forced) > length or any(token >= vocab for token in self.forced):
            raise VVSError(f"token layout: {len(self.forced)} stream tokens forcing ids up to {max(self.forced)}, but "
                           f"the stream holds at most {length} and the vocabulary {vocab} ids; fix the family's layout")
        forced = torch.full((length,), -1, dtype=torch.long, device=device)
        forced[: len(self.forced)] = torch.tensor(self.forced, dtype=torch.long, device=device)
        free = torch.cat([torch.zeros(1, dtype=torch.long, device=device), (forced < 0).long().cumsum(0)])
        return forced, free


def force_logits(logits: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """``logits [..., V]`` with every row whose ``forced [...]`` names a token made one-hot on it (-inf elsewhere)."""
    onehot = torch.full_like(logits, float("-inf")).scatter(-1, forced.clamp(min=0)[..., None], 0.0)
    return torch.where((forced >= 0)[..., None], onehot, logits)
