"""Caches the runtime owns: static-capacity key/value tensors and the token-level feature cache.

Graphs never write caches. They read ``past_kv`` (the whole static buffer, so shapes and addresses stay fixed
for CUDA graphs and TensorRT) and return the keys/values of their new positions; the runtime then copies only
the rows it keeps. That copy *is* the KV compaction of tree verification: accepted nodes land contiguously
after the committed prefix and rejected branches never enter the cache.

Batch layout: image ``i`` owns batch row ``i`` and, with classifier-free guidance, row ``i + n`` (its
unconditional twin), which shares its tokens, positions, masks and tree.
"""
from __future__ import annotations

import torch


class RowLayout:
    """Maps per-image tensors ``[n, ...]`` to batch rows ``[groups * n, ...]``."""

    def __init__(self, num_images: int, guided: bool):
        self.n = num_images
        self.groups = 2 if guided else 1

    @property
    def rows(self) -> int:
        return self.n * self.groups

    def expand(self, per_image: torch.Tensor) -> torch.Tensor:
        return per_image.repeat(self.groups, *([1] * (per_image.dim() - 1)))

    def row_ids(self, images: torch.Tensor) -> torch.Tensor:
        """Batch rows of the given image indices (all groups), ``[groups * len(images)]``."""
        return torch.cat([images + g * self.n for g in range(self.groups)])


def gather_rows(parts: list[tuple[torch.Tensor, RowLayout, torch.Tensor]], dim: int,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """The rows (axis ``dim``) of the chosen images of several batches ``(tensor, layout, images)``, in the row
    layout of one batch of all of them: every conditional row, then every unconditional one."""
    groups = parts[0][1].groups
    pieces = [t.index_select(dim, images + g * layout.n) for g in range(groups) for t, layout, images in parts]
    return torch.cat(pieces, dim, out=out)


class KVCache:
    """``kv [layers, 2, rows, heads, capacity + 1, head_dim]`` (a zeroed buffer the caller provides, sized by
    :meth:`slots`) plus the committed length of each image. The last slot is never visible: writes that do not
    count go there, so that a commit needs no data-dependent indexing (and no device-to-host read)."""

    def __init__(self, layout: RowLayout, kv: torch.Tensor):
        self.layout = layout
        self.kv = kv
        self.capacity = kv.shape[4] - 1
        self.length = torch.zeros(layout.n, dtype=torch.long, device=kv.device)
        # padded condition slots, by batch row: a guidance null may attend fewer slots than its prompt
        self.blocked = torch.zeros(layout.rows, kv.shape[4], dtype=torch.bool, device=kv.device)

    @staticmethod
    def slots(capacity: int) -> int:
        """Buffer slots for ``capacity`` usable ones."""
        return capacity + 1

    @classmethod
    def combine(cls, layout: RowLayout, kv: torch.Tensor, parts: list[tuple["KVCache", torch.Tensor]]) -> "KVCache":
        """The chosen images of several caches, copied into the buffer ``kv`` (rows for ``layout``)."""
        gather_rows([(p.kv, p.layout, images) for p, images in parts], 2, out=kv)
        cache = cls(layout, kv)
        cache.length = torch.cat([p.length[images] for p, images in parts])
        cache.blocked = gather_rows([(p.blocked, p.layout, images) for p, images in parts], 0)
        return cache

    def write(self, new_kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, valid: torch.Tensor) -> None:
        """Copy ``new_kv[..., row, :, src[i, j], :]`` to slot ``dst[i, j]`` of image i's rows where ``valid[i, j]``."""
        n, m = src.shape
        rows = self.layout.row_ids(torch.arange(n, device=src.device).repeat_interleave(m))
        s = self.layout.expand(src.reshape(-1))
        d = self.layout.expand(torch.where(valid, dst, self.capacity).reshape(-1))
        self.kv[:, :, rows, :, d] = new_kv[:, :, rows, :, s].to(self.kv.dtype)

    def commit(self, new_kv: torch.Tensor, src: torch.Tensor, count: torch.Tensor) -> None:
        """Append ``count[i]`` rows of ``new_kv`` (indices ``src[i, :count[i]]``) after each image's prefix."""
        j = torch.arange(src.shape[1], device=src.device)
        valid = j < count[:, None]
        self.write(new_kv, src, self.length[:, None] + j, valid & (self.length[:, None] + j < self.capacity))
        self.length.copy_((self.length + count).clamp(max=self.capacity))

    def prefix_visible(self, queries: int) -> torch.Tensor:
        """Bool ``[rows, queries, capacity]``: the committed slots of each batch row."""
        slots = torch.arange(self.kv.shape[4], device=self.length.device)
        committed = self.layout.expand(slots < self.length[:, None])
        return (committed & ~self.blocked).unsqueeze(1).expand(-1, queries, -1)


def attention_mask(layout: RowLayout, past: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Combine per-row ``past [rows, T, S]`` and per-image ``new [n, T, T]`` visibility into
    ``[rows, 1, T, S + T]``."""
    return torch.cat([past, layout.expand(new)], dim=-1).unsqueeze(1)


def causal_within(count: torch.Tensor, length: int) -> torch.Tensor:
    """``[n, length, length]`` causal visibility among the first ``count[i]`` new positions; padded positions
    see only themselves (a fully masked row would give NaN)."""
    idx = torch.arange(length, device=count.device)
    causal = idx[None, :, None] >= idx[None, None, :]
    valid = idx[None, :] < count[:, None]
    return (causal & valid[:, None, :] & valid[:, :, None]) | torch.eye(length, dtype=torch.bool, device=count.device)


class FeatureCache:
    """Target features (post-norm hidden states) by position ``[rows, capacity + 1, dim]``; ``length[i]`` positions
    of image i are known. VVS reuses the most recent ones when a verification is skipped. The last position takes
    writes that do not count (as in :class:`KVCache`)."""

    def __init__(self, layout: RowLayout, capacity: int, dim: int, dtype, device):
        self.layout = layout
        self.features = torch.zeros(layout.rows, KVCache.slots(capacity), dim, dtype=dtype, device=device)
        self.length = torch.zeros(layout.n, dtype=torch.long, device=device)

    @classmethod
    def combine(cls, layout: RowLayout, parts: list[tuple["FeatureCache", torch.Tensor]]) -> "FeatureCache":
        cache = cls.__new__(cls)
        cache.layout = layout
        cache.features = gather_rows([(p.features, p.layout, images) for p, images in parts], 0)
        cache.length = torch.cat([p.length[images] for p, images in parts])
        return cache

    def append(self, hidden: torch.Tensor, src: torch.Tensor, count: torch.Tensor) -> None:
        """Append ``hidden[row, src[i, j]]`` for ``j < count[i]``."""
        n, m = src.shape
        spare = self.features.shape[1] - 1
        j = torch.arange(m, device=src.device)
        dst = self.length[:, None] + j
        dst = torch.where((j < count[:, None]) & (dst < spare), dst, spare)
        rows = self.layout.row_ids(torch.arange(n, device=src.device).repeat_interleave(m))
        self.features[rows, self.layout.expand(dst.reshape(-1))] = hidden[rows, self.layout.expand(src.reshape(-1))].to(
            self.features.dtype)
        self.length.add_(count)

    def most_recent(self, count: torch.Tensor, width: int) -> torch.Tensor:
        """``[rows, width, dim]``: for image i the last ``count[i]`` known features in order (earliest first),
        padded after; positions before 0 repeat position 0."""
        j = torch.arange(width, device=count.device)
        pos = (self.length[:, None] - count[:, None] + j).clamp(min=0, max=self.features.shape[1] - 2)
        rows = torch.arange(self.layout.rows, device=count.device)
        return self.features[rows[:, None], self.layout.expand(pos)]
