"""Shape buckets for static-shape backends (TensorRT profiles, CUDA graphs).

The decoding loop asks for whatever ``new`` length a step needs; :class:`BucketedEngine` pads it to the
smallest bucket (extra rows see only themselves, real rows never see them) and slices the outputs back, so the
loop itself never knows about buckets. The buckets follow from the decoding options: AR steps (1), the
drafter's first call (C condition slots), its stable updates (depth + 2), a tree (tree_size), a skipped chain
plus a tree (tree_size + depth + 2), and the drafter-free modes' windows (their published lengths, and the folder's
own ``window``).
"""
from __future__ import annotations

import torch

from vvs.errors import VVSError
from vvs.runtime.options import WINDOW_MODES, DecodeOptions

PAST_SLACK = 16  # KV slots beyond condition + image tokens that profiles admit (2 x (depth + 2) + 1 for depth <= 5)


def buckets(graph: str, cls_token_num: int, opts: DecodeOptions) -> list[int]:
    width = opts.max_path_tokens
    if graph == "target_verify":
        return sorted({1, opts.tree_size, opts.tree_size + width, *WINDOW_MODES.values(), opts.window_length} - {0})
    if graph == "draft_tree":
        return sorted({cls_token_num, width})
    return []


def pad_new_axis(name: str, value: torch.Tensor, extra: int) -> torch.Tensor:
    """Pad one input along its ``new`` axis by ``extra`` positions."""
    if extra == 0:
        return value
    if name == "attn_mask":  # [B, 1, T, S + T]: pad rows and the new-part columns; pad rows see only themselves
        b, _, t, st = value.shape
        s = st - t
        out = torch.zeros(b, 1, t + extra, s + t + extra, dtype=torch.bool, device=value.device)
        out[:, :, :t, : s + t] = value
        idx = torch.arange(t, t + extra, device=value.device)
        out[:, :, idx, s + idx] = True
        return out
    pad = torch.zeros(value.shape[0], extra, *value.shape[2:], dtype=value.dtype, device=value.device)
    if name == "position_ids":
        pad = pad + value[:, -1:]  # a valid position
    return torch.cat([value, pad], dim=1)


class BucketedEngine:
    """Presents a static-shape engine with the dynamic ``new`` axis the runtime expects."""

    NEW_AXIS = {"input_ids": 1, "position_ids": 1, "features": 1, "attn_mask": 2}

    def __init__(self, inner, sizes: list[int]):
        self.inner, self.spec, self.sizes = inner, inner.spec, sorted(sizes)

    def bucket(self, new: int) -> int:
        for size in self.sizes:
            if size >= new:
                return size
        raise VVSError(f"{self.spec.name}: a step of {new} new positions exceeds the built buckets {self.sizes}; "
                       "rebuild the engines for these decoding options")

    def run(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        new = inputs["input_ids"].shape[1]
        extra = self.bucket(new) - new
        padded = {k: pad_new_axis(k, v, extra) if k in self.NEW_AXIS else v for k, v in inputs.items()}
        out = self.inner.run(**padded)
        if extra == 0:
            return out
        return {spec.name: _slice_new(out[spec.name], spec.shape, new) for spec in self.spec.outputs}


def _slice_new(value: torch.Tensor, shape, new: int) -> torch.Tensor:
    if "new" not in shape:
        return value
    return value.narrow(shape.index("new"), 0, new)
