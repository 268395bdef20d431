"""LANTERN's latent proximity sets: for every code, its nearest codes in the VQ latent space.

Distances are Euclidean between the l2-normalised code vectors the decoder actually sees (the official table
uses the raw rows; for an l2-normalised codebook the normalised rows are the latents). Computed in chunks and
only the ``k`` nearest kept: ``[V, k]`` int32 (16384 x 1000 is 64 MiB, against the official 512 MiB table).
"""
from __future__ import annotations

import torch


@torch.no_grad()
def nearest_codes(codebook: torch.Tensor, k: int, chunk: int = 1024) -> torch.Tensor:
    """``[V, k]`` int32: the ``k`` nearest other codes of every code, nearest first (ties by index)."""
    book = torch.nn.functional.normalize(codebook.float(), dim=-1)
    out = []
    for start in range(0, len(book), chunk):
        part = book[start : start + chunk]
        dist = torch.cdist(part, book)
        dist[torch.arange(len(part)), torch.arange(start, start + len(part))] = float("inf")
        out.append(dist.topk(k, dim=1, largest=False, sorted=True).indices.int())
    return torch.cat(out)
