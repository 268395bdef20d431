"""Randomness per image, so that an image's tokens never depend on the other images of its batch.

Image ``i`` of a call owns one ``torch.Generator`` seeded with ``seeds[i]``. Every decoding step takes a block
of uniforms of one fixed size from each image's stream, whatever happens to the others; the samplers then
consume them by position (see :func:`vvs.runtime.accept.sample_accept`). An image's stream
advances by the same amount per step of its own, so "same request + same seed" gives the same image in any
batch, and a service may merge requests freely.
"""
from __future__ import annotations

import torch

from vvs.runtime.options import OptionsError

MAX_SEED = 2**63 - 1


def image_seeds(seed, num_images: int) -> list[int]:
    """``seed``: an int (image i gets ``seed + i``) or one int per image."""
    if isinstance(seed, (list, tuple)):
        seeds = list(seed)
        if len(seeds) != num_images:
            raise OptionsError(f"seed: got {len(seeds)} seeds for {num_images} images; give one per image, or one int")
    else:
        seeds = [seed + i if _is_int(seed) else seed for i in range(num_images)]
    for s in seeds:
        if not _is_int(s) or not 0 <= s <= MAX_SEED:
            raise OptionsError(f"seed {s!r}: seeds must be integers in [0, {MAX_SEED}]")
    return [int(s) for s in seeds]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ImageRandom:
    def __init__(self, seeds: list[int], device: torch.device):
        self.device = device
        self.gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]

    @classmethod
    def combine(cls, parts: list[tuple["ImageRandom", torch.Tensor]]) -> "ImageRandom":
        """The streams of the chosen images, each continuing where it was."""
        random = cls([], parts[0][0].device)
        random.gens = [p.gens[i] for p, images in parts for i in images.tolist()]
        return random

    def normal(self, *shape: int) -> torch.Tensor:
        """``[n, *shape]`` standard normals, ``shape`` fresh values from every image's stream."""
        return torch.stack([torch.randn(shape, generator=g, device=self.device) for g in self.gens])

    def uniform(self, count: int) -> torch.Tensor:
        """``[n, count]`` uniforms in [0, 1): ``count`` fresh values from every image's stream."""
        return torch.stack([torch.rand(count, generator=g, device=self.device) for g in self.gens])


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One index per row of ``weights [n, V]`` (non-negative, not necessarily normalised), drawn with the uniform
    ``u [n]`` in [0, 1): the first index whose cumulative weight exceeds ``u`` times the total. An index of zero
    weight is never drawn."""
    cdf = weights.double().cumsum(-1)
    threshold = (1.0 - u.double()) * cdf[:, -1]  # in (0, total]
    return (cdf < threshold[:, None]).sum(-1).clamp(max=weights.shape[-1] - 1)
