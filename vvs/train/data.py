"""The shipped model's training data: photographs bundled with scikit-image, scikit-learn and matplotlib.

One class per photograph; examples are random crops with scale jitter and horizontal flips. Nothing is
downloaded. Licences (checked in each package's documentation) are listed in docs/shipped_model.md; images
whose licence is unclear (e.g. skimage's stereo_motorcycle, moon) are not used.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Photo:
    name: str
    source: str  # package it ships with
    licence: str


PHOTOS: tuple[Photo, ...] = (
    Photo("astronaut", "skimage", "public domain (NASA)"),
    Photo("chelsea", "skimage", "CC0 (Stefan van der Walt)"),
    Photo("coffee", "skimage", "CC0 (Rachel Michetti)"),
    Photo("rocket", "skimage", "public domain (SpaceX)"),
    Photo("hubble_deep_field", "skimage", "public domain (NASA)"),
    Photo("immunohistochemistry", "skimage", "no known copyright restrictions"),
    Photo("retina", "skimage", "CC0 (Mikael Häggström, Wikimedia)"),
    Photo("brick", "skimage", "CC0 (CC0Textures)"),
    Photo("grass", "skimage", "CC0 (DeviantArt linolafett)"),
    Photo("gravel", "skimage", "CC0 (CC0Textures)"),
    Photo("camera", "skimage", "CC0 (Lav Varshney)"),
    Photo("coins", "skimage", "no known copyright restrictions (Brooklyn Museum)"),
    Photo("cell", "skimage", "CC0"),
    Photo("china", "sklearn", "CC BY 2.0 (danielbuechele, Flickr)"),
    Photo("flower", "sklearn", "CC BY 2.0 (vultilion, Flickr)"),
    Photo("grace_hopper", "matplotlib", "public domain (U.S. Navy)"),
)
CLASS_NAMES = tuple(p.name for p in PHOTOS)


def _load_array(photo: Photo) -> np.ndarray:
    if photo.source == "skimage":
        import skimage.data

        return np.asarray(getattr(skimage.data, photo.name)())
    if photo.source == "sklearn":
        from sklearn.datasets import load_sample_image

        return np.asarray(load_sample_image(f"{photo.name}.jpg"))
    import matplotlib.cbook
    from PIL import Image

    with matplotlib.cbook.get_sample_data(f"{photo.name}.jpg") as f:
        return np.asarray(Image.open(f).convert("RGB"))


def load_photos() -> list[torch.Tensor]:
    """Each photograph as float ``[3, H, W]`` in [-1, 1] (grey images repeated to RGB)."""
    out = []
    for photo in PHOTOS:
        a = _load_array(photo)
        if a.ndim == 2:
            a = np.repeat(a[..., None], 3, axis=2)
        t = torch.from_numpy(a[..., :3].astype(np.float32) / 127.5 - 1.0).permute(2, 0, 1).contiguous()
        out.append(t)
    return out


def random_crops(
    photos: list[torch.Tensor], labels: torch.Tensor, size: int, gen: torch.Generator,
    scale: tuple[float, float] = (0.35, 0.75),
) -> torch.Tensor:
    """One crop per label: a random square of ``scale`` x the short side, flipped at random, resized to ``size``."""
    crops = []
    for label in labels.tolist():
        img = photos[label]
        h, w = img.shape[1:]
        s = float(torch.empty(1).uniform_(*scale, generator=gen))
        side = max(size // 2, int(s * min(h, w)))
        top = int(torch.randint(0, h - side + 1, (1,), generator=gen))
        left = int(torch.randint(0, w - side + 1, (1,), generator=gen))
        crop = img[:, top : top + side, left : left + side][None]
        crop = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        if torch.rand(1, generator=gen) < 0.5:
            crop = crop.flip(-1)
        crops.append(crop[0])
    return torch.stack(crops).clamp(-1, 1)


def balanced_labels(num: int, num_classes: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(num, generator=gen) % num_classes
