"""Per-image decoding statistics, counted exactly.

- ``target_forwards`` counts every target forward the image took part in, the prefill included, so vanilla AR
  has exactly one per token and ``tokens_per_target_forward`` (TPF) is 1.0 for it. ``prefill_forwards`` is
  reported separately: the paper's convention (verifications only) is ``verify_forwards``.
- ``accept_lengths``: per verification, the tree nodes committed (root + accepted drafts); ``skip_lengths``:
  per skipped verification, the tokens committed without one.
- ``trace``: one entry per decoding cycle, ``[kind, image tokens before the cycle, tokens committed]`` with
  kind ``"verify"`` or ``"skip"`` (``"ar"`` steps for AR), or ``"withdraw"``: a verification after a skip that
  found a committed token outside the target's filtered support, ``[kind, image tokens left, tokens withdrawn]``
  (the new root then comes from the target). ``withdrawn_lengths`` lists those counts. Where a family forces tokens
  (:class:`~vvs.runtime.conditions.TokenLayout`), every count here, ``tokens`` included, counts only the model's
  own choices.
- MAR models (``vvs.families.mar.decode``): one token is one continuous latent; ``target_forwards`` counts the
  target's transformer forwards (each with its diffusion head), ``drafter_forwards`` the draft model's;
  ``verified_lengths`` are the drafted tokens each verification checked and ``accept_lengths`` those it kept
  (``acceptance_rate`` = kept / checked); ``residual_fallbacks`` counts rejected tokens whose residual sampler
  ran out of tries (see ``vvs.families.mar.cspd``).
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
    withdrawn_lengths: list[int] = field(default_factory=list)
    verified_lengths: list[int] = field(default_factory=list)
    residual_fallbacks: int = 0
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

    @property
    def acceptance_rate(self) -> float | None:
        return sum(self.accept_lengths) / sum(self.verified_lengths) if sum(self.verified_lengths) else None

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
            "withdrawn_lengths": self.withdrawn_lengths,
            "verified_lengths": self.verified_lengths,
            "acceptance_rate": self.acceptance_rate,
            "residual_fallbacks": self.residual_fallbacks,
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
    verified = sum(v for s in stats for v in s.verified_lengths)
    return {
        "images": len(stats),
        "tokens": tokens,
        "target_forwards": forwards,
        "prefill_forwards": sum(s.prefill_forwards for s in stats),
        "verify_forwards": sum(s.verify_forwards for s in stats),
        "drafter_forwards": sum(s.drafter_forwards for s in stats),
        "skipped_verifications": sum(s.skipped_verifications for s in stats),
        "withdrawals": sum(len(s.withdrawn_lengths) for s in stats),
        "withdrawn_tokens": sum(sum(s.withdrawn_lengths) for s in stats),
        "tokens_per_target_forward": tokens / max(1, forwards),
        "mean_accept_length": statistics.fmean(accepts) if accepts else 1.0,
        "acceptance_rate": sum(accepts) / verified if verified else None,
        "residual_fallbacks": sum(s.residual_fallbacks for s in stats),
        "seconds": sum(s.seconds for s in stats),
        "seconds_per_image": statistics.fmean(s.seconds for s in stats) if stats else 0.0,
        "draft_seconds": sum(s.draft_seconds for s in stats),
        "verify_seconds": sum(s.verify_seconds for s in stats),
        "other_seconds": sum(s.other_seconds for s in stats),
    }


class Counters:
    """Per-image statistics kept on the device while decoding, so that counting never waits for the device; read
    once, when images finish. ``trace`` rows hold ``(kind, tokens before, tokens committed)`` per cycle, at most
    ``max_cycles``; a spare last row takes the writes of images that record nothing."""

    KINDS = ("ar", "verify", "skip", "withdraw")
    FIELDS = ("target_forwards", "drafter_forwards", "skipped_verifications")

    def __init__(self, n: int, max_cycles: int, device):
        self.counts = torch.zeros(n, len(self.FIELDS), dtype=torch.long, device=device)
        self.cycles = torch.zeros(n, dtype=torch.long, device=device)
        self.trace = torch.zeros(n, max_cycles + 1, 3, dtype=torch.long, device=device)

    @classmethod
    def combine(cls, parts: list[tuple["Counters", torch.Tensor]]) -> "Counters":
        c = cls.__new__(cls)
        for name in ("counts", "cycles", "trace"):
            setattr(c, name, torch.cat([getattr(p, name)[images] for p, images in parts]))
        return c

    def add(self, field: str, which: torch.Tensor) -> None:
        self.counts[:, self.FIELDS.index(field)] += which.long()

    def record(self, which: torch.Tensor, kind: str, before: torch.Tensor, length: torch.Tensor) -> None:
        row = torch.where(which, self.cycles, self.trace.shape[1] - 1)
        entry = torch.stack([torch.full_like(before, self.KINDS.index(kind)), before, length], -1)
        self.trace.scatter_(1, row[:, None, None].expand(-1, 1, 3), entry[:, None])
        self.cycles.add_(which.long())

    def fill(self, images: torch.Tensor, stats: list["ImageStats"]) -> None:
        """Add the counts and traces of ``images`` to their statistics (one device-to-host read)."""
        n, f, width = len(stats), len(self.FIELDS), self.trace.shape[1]
        values = torch.cat([self.counts[images].flatten(), self.cycles[images], self.trace[images].flatten()]).tolist()
        for i, s in enumerate(stats):
            for name, value in zip(self.FIELDS, values[i * f : (i + 1) * f]):
                setattr(s, name, getattr(s, name) + value)
            start = n * (f + 1) + i * width * 3
            rows = values[start : start + values[n * f + i] * 3]
            for kind, before, length in zip(rows[0::3], rows[1::3], rows[2::3]):
                s.trace.append([self.KINDS[kind], before, length])
                if kind == 1:
                    s.accept_lengths.append(length)
                elif kind == 2:
                    s.skip_lengths.append(length)
                elif kind == 3:
                    s.withdrawn_lengths.append(length)


class Stopwatch:
    """Accumulates wall time per section. On CUDA it records events instead of waiting for the device and
    resolves them in ``take``, so timing adds no synchronisation inside a cycle."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.total = {"draft": 0.0, "verify": 0.0, "other": 0.0}
        self.spans: list = []  # CUDA: (section, start event, end event) not yet resolved
        self._section, self._start = "other", self._now()
        self.paused = False  # while a cycle is captured into a CUDA graph (no events can be recorded there)

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def section(self, name: str) -> None:
        if self.paused:
            return
        now = self._now()
        if self.cuda:
            self.spans.append((self._section, self._start, now))
        else:
            self.total[self._section] += now - self._start
        self._section, self._start = name, now

    def take(self) -> dict[str, float]:
        """The time per section since the last ``take``."""
        self.section("other")
        if self.spans:
            self.spans[-1][2].synchronize()
            for name, start, end in self.spans:
                self.total[name] += start.elapsed_time(end) / 1000
            self.spans.clear()
        total, self.total = self.total, dict.fromkeys(self.total, 0.0)
        return total
