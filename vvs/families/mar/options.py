"""Decoding knobs of MAR-style continuous-token models, with MAR's and CSpD's published defaults."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vvs.runtime.options import CFG_RANGE, MAX_CFG_SCALE, OptionsBase, OptionsError, check_types

MAR_MODES = ("ar", "cspd")
ACCEPT_RULES = ("exact", "trajectory", "official")  # vvs.families.mar.cspd describes them
MAR_MODE_NAMES = {mode: {"mode": mode} for mode in MAR_MODES}
CFG_SCHEDULES = ("linear", "constant")


@dataclass(frozen=True)
class MAROptions(OptionsBase):
    """Decoding knobs of MAR-style continuous-token models (MAR's ``sample_tokens`` and CSpD's runner)."""

    NAMED_MODES: ClassVar[dict[str, dict]] = MAR_MODE_NAMES
    mode: str = "cspd"
    num_iter: int = 64  # generation steps (cosine schedule of tokens still masked)
    cfg_scale: float = 1.0  # guidance above 1, on the diffusion head's epsilon
    cfg_schedule: str = "linear"  # linear: guidance grows with the tokens known (as MAR, after Muse)
    temperature: float = 1.0  # scales the diffusion sampler's noise
    # CSpD
    prefill_ratio: float = 0.15  # the first steps (num_iter * ratio, and the step after) are the target's
    draft_steps: int = 8  # draft steps per verification (one target forward checks them all)
    max_residual_tries: int = 100  # acceptance-rejection tries for a rejected token before the defined fallback
    accept_rule: str = "exact"  # exact | trajectory (both lossless) | official (the released rule, lossy)
    official_windows: bool = False  # verify at multiples of draft_steps, guided by the window's last step (release)

    @property
    def exact(self) -> bool:
        """Whether the images follow the target's own distribution (the released acceptance rule does not)."""
        return self.mode == "ar" or self.accept_rule != "official"

    def __post_init__(self):
        def bad(name, why):
            raise OptionsError.bad(name, getattr(self, name), why)

        check_types(self)
        if self.mode not in MAR_MODES:
            bad("mode", f"unknown mode for a MAR model; choose one of {', '.join(MAR_MODES)}")
        if self.cfg_schedule not in CFG_SCHEDULES:
            bad("cfg_schedule", f"choose one of {', '.join(CFG_SCHEDULES)}")
        if self.num_iter < 1:
            bad("num_iter", "must be >= 1")
        if not 0 <= self.cfg_scale <= MAX_CFG_SCALE:
            bad("cfg_scale", CFG_RANGE)
        if self.temperature <= 0:
            bad("temperature", "must be > 0 (the diffusion sampler has no greedy mode)")
        if not 0 <= self.prefill_ratio < 1:
            bad("prefill_ratio", "must be in [0, 1)")
        if self.draft_steps < 1:
            bad("draft_steps", "must be >= 1")
        if self.max_residual_tries < 1:
            bad("max_residual_tries", "must be >= 1")
        if self.accept_rule not in ACCEPT_RULES:
            bad("accept_rule", f"choose one of {', '.join(ACCEPT_RULES)}")

    def check_model(self, seq_len: int) -> None:
        if self.num_iter > seq_len:
            raise OptionsError.bad("num_iter", self.num_iter, f"exceeds the image's {seq_len} tokens (each step "
                                                              "generates at least one)")

    @property
    def guided(self) -> bool:
        return self.cfg_scale > 1.0

    @property
    def prefill_steps(self) -> int:
        """Steps the target runs before drafting starts (CSpD's ``step <= num_iter * ratio``)."""
        return min(self.num_iter, int(self.num_iter * self.prefill_ratio) + 1)

