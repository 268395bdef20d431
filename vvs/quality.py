"""Quality instruments of the shipped model: class accuracy, a domain Fréchet distance, target likelihood.

- ``PhotoClassifier``: a small CNN trained on the same photo crops as the generator. Its accuracy on generated
  images says whether they look like their conditioning class.
- Domain FID: the Fréchet distance between Gaussian fits of the classifier's penultimate features of generated
  images and of real crops (statistics stored with the classifier). Like FID, it is biased by sample size:
  compare numbers computed on the same number of images.
- NLL: the target's mean negative log-likelihood (nats/token, conditional, no guidance) of the generated tokens.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from scipy import linalg
from torch import nn

from vvs.shipped import shipped_info
from vvs.train.data import CLASS_NAMES

if TYPE_CHECKING:
    from vvs.discrete.target import DiscreteTarget


@dataclass(frozen=True)
class ClassifierConfig:
    num_classes: int = 16
    width: int = 32
    input_size: int = 64  # images are resized to this before classification

    def to_dict(self) -> dict:
        return asdict(self)


class PhotoClassifier(nn.Module):
    def __init__(self, config: ClassifierConfig):
        super().__init__()
        self.config = config
        w = config.width
        chans = [3, w, 2 * w, 4 * w, 4 * w]
        layers = []
        for c_in, c_out in zip(chans, chans[1:]):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.BatchNorm2d(c_out), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(4 * w, config.num_classes)
        self.register_buffer("feature_mean", torch.zeros(4 * w))  # statistics of real crops, for the domain FID
        self.register_buffer("feature_cov", torch.eye(4 * w))

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """images in [0, 1] ``[B, 3, H, W]`` -> penultimate features ``[B, 4 * width]``."""
        x = F.interpolate(images * 2 - 1, size=self.config.input_size, mode="bilinear", antialias=True,
                          align_corners=False)
        return self.features(x).mean((2, 3))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(images))


def frechet_distance(mu1, cov1, mu2, cov2) -> float:
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    cov1, cov2 = np.asarray(cov1, np.float64), np.asarray(cov2, np.float64)
    covmean = linalg.sqrtm(cov1 @ cov2)
    if not np.isfinite(covmean).all():
        eps = 1e-6 * np.eye(len(cov1))
        covmean = linalg.sqrtm((cov1 + eps) @ (cov2 + eps))
    return float(((mu1 - mu2) ** 2).sum() + np.trace(cov1 + cov2 - 2 * covmean.real))


def feature_stats(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    f = features.double()
    return f.mean(0), torch.cov(f.T)


@torch.no_grad()
def sequence_nll(model: DiscreteTarget, labels: torch.Tensor, tokens: torch.Tensor, batch: int = 32) -> torch.Tensor:
    """Per-sequence mean negative log-likelihood (nats/token) under the target (its ``teacher_forced``),
    conditional, no guidance."""
    out = []
    for i in range(0, len(tokens), batch):
        seq = tokens[i : i + batch]
        logits = model.teacher_forced(labels[i : i + batch], seq[:, :-1]).logits
        nll = F.cross_entropy(logits.flatten(0, 1), seq.flatten(), reduction="none").view(seq.shape)
        out.append(nll.mean(1))
    return torch.cat(out)


class Instruments:
    """All three measures for a batch of generated images (and their tokens)."""

    def __init__(self, classifier: PhotoClassifier, target: DiscreteTarget | None = None):
        """``target``: the discrete-token target whose NLL scores the tokens; None for models without token
        likelihoods (MAR), which then get accuracy and FID only."""
        self.classifier = classifier.eval()
        self.target = target.eval() if target is not None else None

    @torch.no_grad()
    def evaluate(self, images: torch.Tensor, tokens: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        feats, preds = [], []
        for i in range(0, len(images), 64):
            f = self.classifier.embed(images[i : i + 64].float())
            feats.append(f)
            preds.append(self.classifier.head(f).argmax(-1))
        feats, preds = torch.cat(feats), torch.cat(preds)
        mu, cov = feature_stats(feats)
        result = {
            "class_accuracy": float((preds == labels).float().mean()),
            "domain_fid": frechet_distance(mu, cov, self.classifier.feature_mean, self.classifier.feature_cov),
        }
        if self.target is not None:
            result["nll"] = float(sequence_nll(self.target, labels, tokens).mean())
        return result


# Specks: isolated coloured dots a few pixels wide. A pixel's chroma (colour with its brightness removed) against
# the mean chroma of its 5 x 5 neighbourhood finds them; the 99th percentile per 16 px cell keeps a cell's few
# specked pixels from drowning in its smooth ones.
SPECK_CELL_PX = 16
SPECK_CORNER_CELLS = 2  # a corner is 2 x 2 cells, 32 x 32 px


def speck_map(images: torch.Tensor) -> torch.Tensor:
    """Per 16 px cell, the 99th percentile of each pixel's chroma deviation from its 5 x 5 neighbourhood, averaged
    over ``images [N, 3, H, W]`` in [0, 1]: ``[H / 16, W / 16]``."""
    x = images.float()
    chroma = x - x.mean(1, keepdim=True)
    local = F.avg_pool2d(F.pad(chroma, (2, 2, 2, 2), mode="reflect"), 5, stride=1)
    deviation = (chroma - local).norm(dim=1)  # [N, H, W]
    n, h, w = deviation.shape
    c = SPECK_CELL_PX
    cells = deviation.reshape(n, h // c, c, w // c, c).permute(0, 1, 3, 2, 4).reshape(n, h // c, w // c, c * c)
    return cells.quantile(0.99, dim=-1).mean(0)


def top_left_speck_ratio(images: torch.Tensor) -> float:
    """The top-left 32 x 32 px corner's speck score over the largest of the other three corners' (1.0: the top-left
    is no more specked than the worst other corner)."""
    cells = speck_map(images)
    k = SPECK_CORNER_CELLS
    corners = [cells[:k, :k], cells[:k, -k:], cells[-k:, :k], cells[-k:, -k:]]
    scores = [float(c.mean()) for c in corners]
    return scores[0] / max(scores[1:])


# The images a quality measurement decodes per seed set, so that every tool draws the same ones: a class-conditional
# model's classes 0-15 twice (32 images), a text-to-image pair's every photograph under each of its four shipped
# captions (64 prompts, caption-major). Image i of seed set k gets seed k * (the set's size) + i; ``photos`` is the
# photograph (the classifier's class) each image should show.
CLASS_SET_SIZE = 32


@dataclass(frozen=True)
class SeedSets:
    conditions: object  # class ids [n] (a tensor) or prompts (a list of strings)
    photos: torch.Tensor  # [n] the photograph each image should show
    stride: int  # image i of seed set k gets seed k * stride + i

    def __len__(self) -> int:
        return len(self.photos)

    def seed(self, k: int) -> int:
        return k * self.stride

    def first(self, n: int) -> SeedSets:
        """The first ``n`` images of each set (a smoke run), with the seeds they have in the full sets."""
        return SeedSets(self.conditions[:n], self.photos[:n], self.stride)


def class_sets(num_classes: int = 16, size: int = CLASS_SET_SIZE) -> SeedSets:
    labels = torch.arange(size) % num_classes
    return SeedSets(labels, labels, size)


def photo_captions(k: int) -> tuple[list[str], torch.Tensor]:
    """Every photograph's ``k``-th shipped caption (``shipped_t2i.json``, which every shipped text-to-image pair
    learnt) and the photograph each describes."""
    captions = shipped_info("shipped_t2i.json")["captions"]
    return [captions[name][k] for name in CLASS_NAMES], torch.arange(len(CLASS_NAMES))


def caption_sets() -> SeedSets:
    prompts, photos = zip(*(photo_captions(k) for k in range(4)))
    photos = torch.cat(photos)
    return SeedSets([p for group in prompts for p in group], photos, len(photos))


class TargetCallComparison:
    """A reference engine set's target graphs, each call's inputs also run through the same graph of other engine
    sets (floating inputs but ``cfg_mix`` cast to each one's dtype): how far their logits are from the reference's
    on the calls of a real decode. Use as a context manager around the reference's decode; :meth:`summary` then
    gives, per other set:

    - ``top1_agreement``: the share of scored positions whose highest logit is the reference's code (pooled over
      every call); ``top1_agreement_worst_call``;
    - ``max_logit_error``: per call the largest ``|logit - reference logit|`` over its positions and codes, the
      median and the worst over calls; ``relative_logit_error``: per call that over the reference's largest
      ``|logit|``, the median;
    - ``kl``: the mean over positions of KL(softmax(reference) || softmax(other)), nats, at temperature 1 and
      without the sampling filters.

    Ids a graph masks (a logit of -inf, as Lumina-mGPT's layout does) count as equal where both mask them; the
    largest |logit| is over the finite ones.

    The logits are the graphs' outputs, guidance already mixed in: what the decode samples from."""

    def __init__(self, reference, others: dict, graphs=("target_prefill", "target_verify")):
        self.reference, self.others, self.names = reference, others, graphs
        self.calls: dict[str, list[dict]] = {key: [] for key in others}
        self.saved: dict = {}

    def __enter__(self) -> TargetCallComparison:
        for name in self.names:
            self.saved[name] = self.reference.graphs[name]
            self.reference.graphs[name] = _Beside(self, name, self.saved[name])
        return self

    def __exit__(self, *exc) -> None:
        self.reference.graphs.update(self.saved)
        self.saved = {}

    def compare(self, name: str, inputs: dict, logits: torch.Tensor) -> None:
        ref = logits.float()
        top = ref.argmax(-1)
        log_p = F.log_softmax(ref, -1)
        for key, other in self.others.items():
            cast = {k: v.to(other.dtype) if v.is_floating_point() and k != "cfg_mix" else v for k, v in inputs.items()}
            out = other.graphs[name].run(**cast)["logits"].float()
            p, log_q = log_p.exp(), F.log_softmax(out, -1)
            kl = torch.where(p > 0, p * (log_p - log_q), 0.0).sum(-1)
            error = torch.where(out == ref, 0.0, (out - ref).abs())  # ids both graphs mask (-inf) count as equal
            self.calls[key].append({"graph": name, "positions": top.numel(),
                                    "agree": int((out.argmax(-1) == top).sum()), "max_error": float(error.max()),
                                    "max_logit": float(ref.abs()[ref.isfinite()].max()), "kl_sum": float(kl.sum())})

    def summary(self) -> dict[str, dict]:
        result = {}
        for key, calls in self.calls.items():
            positions = sum(c["positions"] for c in calls)
            errors = sorted(c["max_error"] for c in calls)
            result[key] = {
                "calls": len(calls), "positions": positions,
                "top1_agreement": sum(c["agree"] for c in calls) / positions,
                "top1_agreement_worst_call": min(c["agree"] / c["positions"] for c in calls),
                "max_logit_error": {"median": float(np.median(errors)), "worst": errors[-1]},
                "relative_logit_error": float(np.median([c["max_error"] / max(c["max_logit"], 1e-20) for c in calls])),
                "kl": sum(c["kl_sum"] for c in calls) / positions,
            }
        return result


class _Beside:
    def __init__(self, comparison: TargetCallComparison, name: str, engine):
        self.comparison, self.name, self.engine, self.spec = comparison, name, engine, engine.spec

    def run(self, **inputs):
        out = self.engine.run(**inputs)
        self.comparison.compare(self.name, inputs, out["logits"])
        return out
