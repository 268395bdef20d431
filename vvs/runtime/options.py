"""Every knob of the shared speculative loop in one place, with the published defaults (VVS ``run_vvs.sh``,
EAGLE-2, LANTERN), and what every family's options share (:class:`OptionsBase`, :func:`check_types`,
:class:`OptionsError`; MAR's knobs are :mod:`vvs.families.mar.options`).

Engine folders store their own defaults (e.g. tuned by ``vvs-bench --tune``); ``DecodeOptions.from_dict``
validates them the same way as user input.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from typing import ClassVar, NamedTuple

from vvs.errors import VVSError, json_value

MODES = ("ar", "sd", "lantern", "vvs", "sjd", "sjd-pac", "gsd")
# drafter-free modes: a window of drafts refined by the target alone (vvs.runtime.jacobi), and the window length
# their papers publish (SJD and GSD: 16 tokens per forward; SJD-PAC: 64)
WINDOW_MODES = {"sjd": 16, "sjd-pac": 64, "gsd": 16}
EXACT_MODES = ("ar", "sd", "sjd", "sjd-pac")  # they sample the target's distribution; the others change it
PAC_RULES = ("exact", "official")  # SJD-PAC's tree walk: vvs.runtime.jacobi describes both
MAX_CFG_SCALE = 1000.0
CFG_RANGE = (f"must be in [0, {MAX_CFG_SCALE:g}] (1 or less disables classifier-free guidance; larger scales drive the "
             "mixed logits out of floating-point range)")
SKIP_POLICIES = ("uniform", "dynamic")
# Size caps that hold for any folder. A draft_tree graph unrolls one expansion per level and is exported on first
# use, so a deep tree costs minutes of export before it decodes anything; the published trees are 59-60 nodes of
# depth 4-6. A window or tree is also bounded by the image it paints (check_model).
MAX_TREE_DEPTH = 16
MAX_TREE_SIZE = 512
# the longest prompt a folder's prompt slots take (vvs-export --prompt-tokens), in tokens with the model's template
MAX_PROMPT_TOKENS = 4096
# the names vvs-run and vvs-bench accept: a mode, or VVS with a chosen skip schedule
MODE_NAMES = {
    "ar": {"mode": "ar"},
    "sd": {"mode": "sd"},
    "lantern": {"mode": "lantern"},
    "vvs": {"mode": "vvs"},
    "vvs-uniform": {"mode": "vvs", "skip_policy": "uniform"},
    "vvs-dynamic": {"mode": "vvs", "skip_policy": "dynamic"},
    "sjd": {"mode": "sjd"},
    "sjd-pac": {"mode": "sjd-pac"},
    "sjd-pac-official": {"mode": "sjd-pac", "pac_rule": "official"},
    "gsd": {"mode": "gsd"},
}


# the mode names that read each mode-specific option: a flag given for none of a request's modes is refused, not
# ignored (a skip schedule's knob is read by VVS on that schedule only)
FIELD_MODES = {
    **dict.fromkeys(("tree_size", "depth", "draft_top_k"), ("sd", "lantern", "vvs")),
    **dict.fromkeys(("lantern_k", "lantern_delta"), ("lantern", "vvs")),
    **dict.fromkeys(("vvs_relaxed", "skip_policy", "skip_warmup_tokens"), ("vvs",)),
    "skip_interval": ("vvs-uniform",),
    **dict.fromkeys(("sim_threshold", "sim_decay"), ("vvs-dynamic",)),
    "window": tuple(WINDOW_MODES),
    **dict.fromkeys(("pac_tree_width", "pac_tree_depth"), ("sjd-pac",)),
    **dict.fromkeys(("gsd_group_size", "gsd_prob_gap", "gsd_distance"), ("gsd",)),
}


class OptionsError(VVSError):
    """A bad option value. ``option`` names the field (None for arguments that are not decoding options), so the
    CLI can name the flag the user typed instead."""

    def __init__(self, message: str, option: str | None = None, value=None, why: str | None = None):
        super().__init__(message)
        self.option, self.value, self.why = option, value, why

    @classmethod
    def bad(cls, option: str, value, why: str) -> "OptionsError":
        return cls(f"option {option}={json_value(value)}: {why}", option, value, why)


@contextmanager
def about(field: str):
    """An :class:`OptionsError` raised inside that names no option is about the request's ``field`` (what an HTTP
    refusal names as its ``param``)."""
    try:
        yield
    except OptionsError as err:
        err.option = err.option or field
        raise


class TreeShape(NamedTuple):
    """What a ``draft_tree`` graph is built for."""

    tree_size: int
    depth: int
    draft_top_k: int

    @property
    def name(self) -> str:
        return f"{self.tree_size}x{self.depth}x{self.draft_top_k}"


def check_types(options) -> None:
    """Every field of an options dataclass has its declared type (ints given as floats become floats)."""
    for f in fields(options):
        value = getattr(options, f.name)
        why = None
        if f.type == "int" and not (isinstance(value, int) and not isinstance(value, bool)):
            why = "must be an integer"
        if f.type == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                why = "must be a number"
            elif not math.isfinite(value):
                why = "must be a finite number"
            else:
                object.__setattr__(options, f.name, float(value))
        if f.type == "bool" and not isinstance(value, bool):
            why = "must be true or false"
        if f.type == "str" and not isinstance(value, str):
            why = "must be a string"
        if why:
            raise OptionsError.bad(f.name, value, why)


class OptionsBase:
    """A family's decoding options. ``NAMED_MODES``: the mode names users type (``--mode``, the HTTP APIs, the
    page) -> the options each stands for; ``updated(mode=name)`` takes them. ``FIELD_MODES``: a mode-specific option
    -> the mode names that read it (:func:`check_request`)."""
    NAMED_MODES: ClassVar[dict[str, dict]] = {}
    FIELD_MODES: ClassVar[dict[str, tuple[str, ...]]] = {}

    def updated(self, **changes):
        named = changes.get("mode")
        if isinstance(named, str) and named in self.NAMED_MODES:
            fixed = self.NAMED_MODES[named]
            clash = next((k for k in fixed if k != "mode" and k in changes and changes[k] != fixed[k]), None)
            if clash is not None:
                raise OptionsError.bad(clash, changes[clash], f"mode {named} sets {clash}={fixed[clash]!r}; give "
                                                              f"mode {fixed['mode']} to choose {clash} yourself")
            changes = {**changes, **fixed}
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise OptionsError(f"unknown option(s): {', '.join(sorted(unknown))}; known: "
                               f"{', '.join(f.name for f in fields(self))}")
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict):
        return cls().updated(**data)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def name(self) -> str:
        """The mode name users type for these options."""
        return self.mode

    @property
    def full_name(self) -> str:
        """The most specific mode name these options run as (VVS's names its skip schedule)."""
        return self.name


def check_request(defaults: OptionsBase, modes: list[str], given: dict) -> list:
    """Each requested mode's options (no modes: the defaults' own) from a folder's or a service's defaults and the
    options given. The one check of a request that vvs-run, vvs-bench (--scale included), the Pipeline and the
    servers make before anything is loaded or queued: every value in range, and an option that none of the modes
    reads refused, since accepting it would change no token."""
    chosen = [defaults.updated(mode=m, **given) for m in modes] if modes else [defaults.updated(**given)]
    for field in given:
        readers = type(defaults).FIELD_MODES.get(field)
        if readers is not None and not any({o.mode, o.name, o.full_name} & set(readers) for o in chosen):
            modes_of = (f"mode {readers[0]}" if len(readers) == 1 else
                        f"modes {', '.join(readers[:-1])} or {readers[-1]}")
            why = f"applies to {modes_of} only, not {', '.join(dict.fromkeys(o.full_name for o in chosen))}"
            raise OptionsError(f"option {field} {why}", field, None, why)
    return chosen


@dataclass(frozen=True)
class DecodeOptions(OptionsBase):
    NAMED_MODES: ClassVar[dict[str, dict]] = MODE_NAMES
    FIELD_MODES: ClassVar[dict[str, tuple[str, ...]]] = FIELD_MODES
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
    # drafter-free speculative Jacobi decoding (modes "sjd", "sjd-pac", "gsd")
    window: int = 0  # tokens per window forward, the committed root included; 0 = the mode's published length
    pac_tree_width: int = 3  # SJD-PAC proactive drafting: candidates per position in the window's leading tree
    pac_tree_depth: int = 3  # SJD-PAC: that tree's depth, root included, as the paper counts (1: a plain chain)
    pac_rule: str = "exact"  # SJD-PAC: "official" reproduces the released code's tree walk, which is lossy
    gsd_group_size: int = 14  # GSD: codes ranked around the draft (-g/2 .. g/2 - 1) that may join its group
    gsd_prob_gap: float = 0.15  # GSD: a group member's probability is within this of the draft's
    gsd_distance: float = 0.5  # GSD: squared distance of unit latent vectors below which codes are equivalent

    def __post_init__(self):
        def bad(name, why):
            raise OptionsError.bad(name, getattr(self, name), why)

        check_types(self)
        if self.mode not in MODES:
            bad("mode", f"unknown mode; choose one of {', '.join(MODE_NAMES)}")
        if self.skip_policy not in SKIP_POLICIES:
            bad("skip_policy", f"unknown policy; choose one of {', '.join(SKIP_POLICIES)}")
        if self.temperature < 0:
            bad("temperature", "must be >= 0 (0 means greedy)")
        if self.top_k < 0:
            bad("top_k", "must be >= 0 (0 disables the top-k filter)")
        if not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if not 0 <= self.cfg_scale <= MAX_CFG_SCALE:
            bad("cfg_scale", CFG_RANGE)
        if not 2 <= self.tree_size <= MAX_TREE_SIZE:
            bad("tree_size", f"must be in [2, {MAX_TREE_SIZE}] (the root plus at least one drafted token; the "
                             "published trees verify 59-60)")
        if not 0 <= self.depth <= MAX_TREE_DEPTH:
            bad("depth", f"must be in [0, {MAX_TREE_DEPTH}] (each level is unrolled in the draft_tree graph; the "
                         "published trees use 4-6)")
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
        if self.window == 1 or self.window < 0:
            bad("window", "must be >= 2 (the root plus at least one draft), or 0 for the mode's published length")
        if self.pac_tree_width < 1:
            bad("pac_tree_width", "must be >= 1")
        if self.pac_rule not in PAC_RULES:
            bad("pac_rule", f"choose one of {', '.join(PAC_RULES)}")
        if self.pac_tree_depth < 1:
            bad("pac_tree_depth", "must be >= 1 (the root counts; 1 drafts no tree)")
        if self.mode == "sjd-pac" and self.pac_tree_width > 1 and self.pac_tree_nodes > MAX_TREE_SIZE:
            bad(self._grown_pac_option(), f"{self._pac_tree()} has more than {MAX_TREE_SIZE} nodes (the published "
                                          "tree has 13); shrink it")
        if self.gsd_group_size < 1:
            bad("gsd_group_size", "must be >= 1 (1: the draft alone, as SJD)")
        if not 0 <= self.gsd_prob_gap <= 1:
            bad("gsd_prob_gap", "must be a probability difference in [0, 1]")
        if not 0 <= self.gsd_distance <= 4:
            bad("gsd_distance", "must be in [0, 4] (squared distance of unit vectors)")

    def check_model(self, vocab_size: int, image_tokens: int, max_draft_top_k: int) -> None:
        """Bounds that come from the model and the exported graphs."""
        def bad(name, why):
            raise OptionsError.bad(name, getattr(self, name), why)

        if self.top_k > vocab_size:
            bad("top_k", f"exceeds the vocabulary of {vocab_size} codes (0 keeps them all)")
        if self.jacobi and self.window > image_tokens:  # (a published length beyond a small image is cut to it)
            bad("window", f"must be at most the image's {image_tokens} tokens (a window drafts tokens of the image)")
        if self.mode == "sjd-pac":
            self._check_pac_window(image_tokens)
        if not self.uses_drafter:
            return
        if self.draft_top_k > max_draft_top_k:
            bad("draft_top_k", f"the engine folder accepts draft trees with at most {max_draft_top_k} children per "
                               "node (export with a larger --max-draft-top-k)")
        if self.depth >= image_tokens:
            bad("depth", f"must be below the image's {image_tokens} tokens (a deeper tree drafts past the image)")
        if self.relaxed and self.lantern_k >= vocab_size:
            bad("lantern_k", f"must be below the vocabulary size {vocab_size}")

    def _check_pac_window(self, image_tokens: int) -> None:
        """SJD-PAC's tree fits in its window, which holds at most the image's tokens: the advice names only a
        window the image allows."""
        window = min(self.window_length, image_tokens)  # a published length beyond a small image is cut to it
        nodes = self.pac_tree_nodes
        if self.pac_tree_width == 1 or nodes < window:
            return
        tree = f"the {nodes} nodes of {self._pac_tree()}"
        room = (f"; {'raise it' if self.window else f'give a window above {nodes}'} or shrink the tree"
                if nodes < image_tokens else f"; shrink the tree (a window holds at most the image's "
                                                   f"{image_tokens} tokens)")
        if self.window:
            raise OptionsError.bad("window", self.window, f"must exceed {tree}{room}")
        raise OptionsError.bad(self._grown_pac_option(), getattr(self, self._grown_pac_option()),
                               f"{tree} must be fewer than sjd-pac's window of {window} tokens{room}")

    def _pac_tree(self) -> str:
        return f"SJD-PAC's tree (pac_tree_width={self.pac_tree_width}, pac_tree_depth={self.pac_tree_depth})"

    def _grown_pac_option(self) -> str:
        """The tree option the user changed, where the tree is what is too large."""
        grown = [f for f in ("pac_tree_depth", "pac_tree_width") if getattr(self, f) != getattr(type(self), f)]
        return (grown or ["pac_tree_depth"])[0]

    @property
    def name(self) -> str:
        """The mode name users type for these options: the lossy SJD-PAC walk never wears the exact mode's name."""
        return "sjd-pac-official" if self.mode == "sjd-pac" and self.pac_rule == "official" else self.mode

    @property
    def full_name(self) -> str:
        return f"vvs-{self.skip_policy}" if self.mode == "vvs" else self.name

    def to_dict(self) -> dict:
        return {**super().to_dict(), "mode": self.name}

    @property
    def guided(self) -> bool:
        return self.cfg_scale > 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_drafter(self) -> bool:
        return self.mode not in ("ar", *WINDOW_MODES)

    @property
    def exact(self) -> bool:
        """Whether the images follow the target's own distribution (the released SJD-PAC rule does not)."""
        return self.name in EXACT_MODES

    @property
    def jacobi(self) -> bool:
        """A drafter-free window mode (:mod:`vvs.runtime.jacobi`)."""
        return self.mode in WINDOW_MODES

    @property
    def pac_tree_nodes(self) -> int:
        """Nodes of SJD-PAC's tree, root included: 1 + K + ... + K^(D-1), counted only until it passes
        ``MAX_TREE_SIZE`` (a refused tree's count could have hundreds of digits, and a deep chain take long)."""
        nodes, level = 0, 1
        for _ in range(self.pac_tree_depth):
            nodes += level
            if nodes > MAX_TREE_SIZE:
                break
            level *= self.pac_tree_width
        return nodes

    @property
    def window_length(self) -> int:
        """Tokens per window forward: ``window``, or the mode's published length."""
        return self.window or WINDOW_MODES.get(self.mode, 0)

    @property
    def relaxed(self) -> bool:
        return self.mode == "lantern" or (self.mode == "vvs" and self.vvs_relaxed)

    @property
    def skips(self) -> bool:
        return self.mode == "vvs"

    @property
    def tree(self) -> TreeShape:
        return TreeShape(self.tree_size, self.depth, self.draft_top_k)

    @property
    def max_path_tokens(self) -> int:
        """Root plus the deepest drafted token."""
        return self.depth + 2
