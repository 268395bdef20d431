"""Per-image decoding statistics, counted exactly.

- ``target_forwards`` counts every target forward the image took part in, the prefill included, so vanilla AR
  has exactly one per token and ``tokens_per_target_forward`` (TPF) is 1.0 for it. ``prefill_forwards`` is
  reported separately: the paper's convention (verifications only) is ``verify_forwards``.
- ``accept_lengths``: per verification, the tree nodes committed (root + accepted drafts); ``skip_lengths``:
  per skipped verification, the tokens committed without one.
- ``trace``: one entry per decoding cycle, ``[kind, image tokens before the cycle, tokens committed]`` with
  kind ``"verify"`` or ``"skip"`` (``"ar"`` steps for AR).
- ``seconds`` and its ``draft/verify/other`` split: each stretch of a batch's wall time shared equally by the
  images in the batch then (images may join and leave a running batch); verify time is all target time (prefill
  included), draft time all drafter time (tree building included).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch


@dataclass
class ImageStats:
    tokens: int = 0
    target_forwards: int = 0
    prefill_forwards: int = 0
    drafter_forwards: int = 0
    skipped_verifications: int = 0
    accept_lengths: list[int] = field(default_factory=list)
    skip_lengths: list[int] = field(default_factory=list)
    trace: list[list] = field(default_factory=list)
    seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    other_seconds: float = 0.0

    @property
    def verify_forwards(self) -> int:
        return self.target_forwards - self.prefill_forwards

    @property
    def tokens_per_target_forward(self) -> float:
        return self.tokens / max(1, self.target_forwards)

    @property
    def mean_accept_length(self) -> float:
        return statistics.fmean(self.accept_lengths) if self.accept_lengths else 1.0

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "target_forwards": self.target_forwards,
            "prefill_forwards": self.prefill_forwards,
            "verify_forwards": self.verify_forwards,
            "drafter_forwards": self.drafter_forwards,
            "skipped_verifications": self.skipped_verifications,
            "tokens_per_target_forward": self.tokens_per_target_forward,
            "mean_accept_length": self.mean_accept_length,
            "accept_lengths": self.accept_lengths,
            "skip_lengths": self.skip_lengths,
            "seconds": self.seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "other_seconds": self.other_seconds,
            "trace": self.trace,
        }


def aggregate(stats: list[ImageStats]) -> dict:
    """Totals and means over images; TPF is total tokens over total target forwards."""
    tokens = sum(s.tokens for s in stats)
    forwards = sum(s.target_forwards for s in stats)
    accepts = [a for s in stats for a in s.accept_lengths]
    return {
        "images": len(stats),
        "tokens": tokens,
        "target_forwards": forwards,
        "prefill_forwards": sum(s.prefill_forwards for s in stats),
        "verify_forwards": sum(s.verify_forwards for s in stats),
        "drafter_forwards": sum(s.drafter_forwards for s in stats),
        "skipped_verifications": sum(s.skipped_verifications for s in stats),
        "tokens_per_target_forward": tokens / max(1, forwards),
        "mean_accept_length": statistics.fmean(accepts) if accepts else 1.0,
        "seconds": sum(s.seconds for s in stats),
        "seconds_per_image": statistics.fmean(s.seconds for s in stats) if stats else 0.0,
        "draft_seconds": sum(s.draft_seconds for s in stats),
        "verify_seconds": sum(s.verify_seconds for s in stats),
        "other_seconds": sum(s.other_seconds for s in stats),
    }


class Stopwatch:
    """Accumulates wall time per section; synchronises CUDA at section boundaries so GPU time is attributed."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.total = {"draft": 0.0, "verify": 0.0, "other": 0.0}
        self._section, self._start = "other", time.perf_counter()

    def section(self, name: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.total[self._section] += now - self._start
        self._section, self._start = name, now

    def take(self) -> dict[str, float]:
        """The time per section since the last ``take``."""
        self.section("other")
        total, self.total = self.total, dict.fromkeys(self.total, 0.0)
        return total
