"""LlamaGen's conditions: a class id (c2i; the guidance null is the extra class ``null_class``) or a T5 caption
(t2i; left-padded embeddings, the null is the target's learnt ``uncond_embedding``, and prompts are encoded by the
folder's text encoder)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vvs.runtime.conditions import captions, class_ids
from vvs.runtime.options import OptionsError


@dataclass(frozen=True)
class ClassConditioning:
    num_classes: int
    null_class: int
    names: tuple[str, ...] = ()  # the folder's class names, which conditions may give instead of ids
    kind: str = "class"

    def prepare(self, engines, conditions, caption_mask):
        if caption_mask is not None:
            raise OptionsError("caption_mask goes with caption embeddings; this model is class-conditional, give "
                               "class ids or names only")
        return class_ids(conditions, self.num_classes, self.names), None

    def null(self, engines, conditions: torch.Tensor, mask: None) -> tuple[torch.Tensor, None]:
        return torch.full((conditions.shape[0],), self.null_class, dtype=torch.long, device=engines.device), None


@dataclass(frozen=True)
class CaptionConditioning:
    slots: int
    width: int
    uncond_embedding: torch.Tensor  # [slots, width]
    kind: str = "text"

    def prepare(self, engines, conditions, caption_mask):
        if isinstance(conditions, (list, tuple)) and any(isinstance(c, str) for c in conditions):
            if engines.text is None:
                raise OptionsError("this engine folder has no text encoder; re-export it with vvs-export --t2i "
                                   "--text-encoder, or pass caption embeddings with caption_mask")
            if caption_mask is not None:
                raise OptionsError("caption_mask goes with caption embeddings, not with prompts")
            return engines.text.encode(conditions)
        if isinstance(conditions, (list, tuple)) and not conditions:
            raise OptionsError("no conditions given; pass at least one prompt")
        if isinstance(conditions, (list, tuple)) or (isinstance(conditions, torch.Tensor) and conditions.dim() == 1):
            raise OptionsError("this model is text-conditional: give prompts (a list of strings), or caption "
                               f"embeddings [n, {self.slots}, {self.width}] with caption_mask; class ids have no "
                               "meaning here")
        return captions(conditions, caption_mask, self.slots, self.width)

    def null(self, engines, conditions: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The learnt null caption, seen through its prompt's slot mask (as LlamaGen's ``generate`` does)."""
        return self.uncond_embedding.to(engines.device, engines.dtype).expand(conditions.shape[0], -1, -1), mask


def conditioning(target, uncond_embedding: torch.Tensor | None, class_names=()):
    """The conditioning of a GPT config (``uncond_embedding``: a t2i target's, from its weights or the tables;
    ``class_names``: a c2i folder's, from its manifest)."""
    if target.model_type == "c2i":
        return ClassConditioning(target.num_classes, target.null_class, tuple(class_names))
    return CaptionConditioning(target.cls_token_num, target.caption_dim, uncond_embedding)
