"""Stage 4: the photo classifier behind the quality instruments, and its real-crop feature statistics."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from vvs.quality import ClassifierConfig, PhotoClassifier, feature_stats
from vvs.train.data import balanced_labels, load_photos, random_crops
from vvs.train.loop import Schedule, train

IMAGE_SIZE = 128


def real_crops(num: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Class-balanced real crops in [0, 1] ``[num, 3, 128, 128]`` and their labels."""
    photos = load_photos()
    gen = torch.Generator().manual_seed(seed)
    labels = balanced_labels(num, len(photos), gen)
    images = torch.cat([random_crops(photos, labels[i : i + 64], IMAGE_SIZE, gen) for i in range(0, num, 64)])
    return (images + 1) / 2, labels


def train_classifier(out_dir: Path, seed: int, steps: int = 800, batch: int = 64, reference: int = 2048) -> PhotoClassifier:
    photos = load_photos()
    torch.manual_seed(seed)
    model = PhotoClassifier(ClassifierConfig(num_classes=len(photos)))

    def step_fn(step: int, gen: torch.Generator):
        labels = torch.randint(0, len(photos), (batch,), generator=gen)
        images = (random_crops(photos, labels, IMAGE_SIZE, gen) + 1) / 2
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        return loss, {"accuracy": (logits.argmax(-1) == labels).float().mean().item()}

    train("classifier", model, step_fn, Schedule(steps=steps, lr=2e-3, warmup=50, weight_decay=1e-4), out_dir, seed)
    images, _ = real_crops(reference, seed + 1)
    with torch.no_grad():
        feats = torch.cat([model.embed(images[i : i + 128]) for i in range(0, len(images), 128)])
    mu, cov = feature_stats(feats)
    model.feature_mean.copy_(mu.float())
    model.feature_cov.copy_(cov.float())
    return model.eval()


@torch.no_grad()
def accuracy(model: PhotoClassifier, images: torch.Tensor, labels: torch.Tensor) -> float:
    preds = torch.cat([model(images[i : i + 128]).argmax(-1) for i in range(0, len(images), 128)])
    return float((preds == labels).float().mean())
