"""Every decoding knob in one place, with the published defaults (VVS ``run_vvs.sh``, EAGLE-2, LANTERN).

Engine folders store their own defaults (e.g. tuned by ``vvs-bench --tune``); ``DecodeOptions.from_dict``
validates them the same way as user input.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from vvs.errors import VVSError

MODES = ("ar", "sd", "lantern", "vvs")
SKIP_POLICIES = ("uniform", "dynamic")


class OptionsError(VVSError):
    pass


@dataclass(frozen=True)
class DecodeOptions:
    mode: str = "vvs"
    # sampling (target and drafter share one logits processor: temperature -> top-k -> top-p)
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 1000  # 0 = no top-k filter
    top_p: float = 1.0
    cfg_scale: float = 7.5  # guidance only above 1 (as LlamaGen): <= 1 runs without the unconditional half
    # EAGLE-2 dynamic draft tree
    tree_size: int = 59  # nodes verified per step, root included
    depth: int = 4  # expansion rounds after the first top-k; drafted paths hold up to depth + 1 tokens
    draft_top_k: int = 10  # children proposed per expanded node, and frontier width
    # LANTERN relaxed acceptance (mode "lantern", and "vvs" when vvs_relaxed)
    lantern_k: int = 1000  # latent neighbours considered per drafted token
    lantern_delta: float = 0.2  # total-variation budget; > 1 means LANTERN++'s lambda form
    # VVS partial verification skipping
    vvs_relaxed: bool = True  # VVS on top of LANTERN (as published); False = on top of plain SD
    skip_policy: str = "uniform"
    skip_interval: int = 5  # uniform: skip the verification of cycles 1, 1 + I, 1 + 2I, ...
    sim_threshold: float = 0.70  # dynamic: skip when drafted paths are this similar in codebook latent space
    sim_decay: float = 0.9  # dynamic: weight of depth l is decay**l
    skip_warmup_tokens: int = 5  # never skip before more than this many image tokens exist

    def __post_init__(self):
        def bad(name, why):
            raise OptionsError(f"option {name}={getattr(self, name)!r}: {why}")

        if self.mode not in MODES:
            bad("mode", f"unknown mode; choose one of {', '.join(MODES)}")
        if self.skip_policy not in SKIP_POLICIES:
            bad("skip_policy", f"unknown policy; choose one of {', '.join(SKIP_POLICIES)}")
        if self.temperature < 0:
            bad("temperature", "must be >= 0 (0 means greedy)")
        if self.top_k < 0:
            bad("top_k", "must be >= 0 (0 disables the top-k filter)")
        if not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if self.cfg_scale < 0:
            bad("cfg_scale", "must be >= 0 (1 or less disables classifier-free guidance)")
        if self.tree_size < 2:
            bad("tree_size", "must be >= 2 (the root plus at least one drafted token)")
        if self.depth < 0:
            bad("depth", "must be >= 0")
        if self.draft_top_k < 1:
            bad("draft_top_k", "must be >= 1")
        if self.tree_size - 1 > self.draft_top_k * (1 + self.depth * self.draft_top_k):
            bad("tree_size", f"exceeds the {self.draft_top_k * (1 + self.depth * self.draft_top_k)} drafted "
                             f"candidates that depth={self.depth}, draft_top_k={self.draft_top_k} produce")
        if self.lantern_k < 1:
            bad("lantern_k", "must be >= 1")
        if self.lantern_delta < 0:
            bad("lantern_delta", "must be >= 0")
        if self.skip_interval < 1:
            bad("skip_interval", "must be >= 1 (1 never skips)")
        if not -1 <= self.sim_threshold <= 1:
            bad("sim_threshold", "must be a cosine similarity in [-1, 1]")
        if not 0 < self.sim_decay <= 1:
            bad("sim_decay", "must be in (0, 1]")
        if self.skip_warmup_tokens < 0:
            bad("skip_warmup_tokens", "must be >= 0")

    @property
    def guided(self) -> bool:
        return self.cfg_scale > 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_drafter(self) -> bool:
        return self.mode != "ar"

    @property
    def relaxed(self) -> bool:
        return self.mode == "lantern" or (self.mode == "vvs" and self.vvs_relaxed)

    @property
    def skips(self) -> bool:
        return self.mode == "vvs"

    @property
    def max_path_tokens(self) -> int:
        """Root plus the deepest drafted token."""
        return self.depth + 2

    def updated(self, **changes) -> "DecodeOptions":
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise OptionsError(f"unknown option(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict) -> "DecodeOptions":
        return cls().updated(**data)

    def to_dict(self) -> dict:
        return asdict(self)
