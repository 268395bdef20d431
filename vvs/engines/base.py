"""The interface between the decoding runtime and a backend.

A backend provides one :class:`Engine` per graph; each is called with tensors by the input names of its
:class:`~vvs.export.spec.GraphSpec` and returns a dict by output name. Tensors cross the interface as torch tensors
on the engine set's device, so the runtime's control logic is the same code for every backend.

:class:`EngineSet` is what the shared speculative loop of discrete-token families runs on: the graphs
``target_prefill``, ``target_verify``, ``draft_tree`` and ``vq_decode`` (and ``text_encode`` where prompts are
encoded), the target's config, and the family's :class:`~vvs.runtime.conditions.Conditioning`. A family's engine
loader builds it (``vvs.families.<name>.engines``).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

import torch

from vvs.export.spec import GraphSpec
from vvs.runtime.neighbours import nearest_codes
from vvs.runtime.options import OptionsError, TreeShape

if TYPE_CHECKING:
    from vvs.runtime.conditions import Conditioning, TokenLayout
    from vvs.text.encoder import TextEncoder

TOPK_LIMIT = 3840  # the largest k TensorRT's TopK selects
GRAPHS = ("target_prefill", "target_verify", "draft_tree", "vq_decode")
TEXT_GRAPH = "text_encode"  # t2i folders exported with their text encoder (vvs.text)


def folder_graphs(manifest: dict) -> tuple[str, ...]:
    """The graphs a backend opens for a folder: the four (three without a drafter), and the text encoder where the
    folder has one."""
    graphs = GRAPHS if "drafter" in manifest["model"] else tuple(g for g in GRAPHS if g != "draft_tree")
    return graphs + ((TEXT_GRAPH,) if TEXT_GRAPH in manifest["graphs"] else ())


class Engine(Protocol):
    spec: GraphSpec

    def run(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]: ...


def check_fit(opts, target, has_drafter: bool, max_draft_top_k: int, backend: str, neighbours: int | None) -> None:
    """Options that fit a model and its folder's graphs on ``backend`` (:meth:`DecodeOptions.check_model`), and a
    LANTERN k within the ``neighbours`` per code the folder stores (None: no bound). An engine set checks its own;
    the commands check a folder's, as its manifest states them, before loading it."""
    if opts.uses_drafter and not has_drafter:
        raise OptionsError.bad("mode", opts.mode, "this engine folder has no drafter; it runs ar, sjd, sjd-pac "
                                                  "and gsd (export it with a drafter for sd, lantern and vvs)")
    opts.check_model(target.vocab_size, target.num_image_tokens, max_draft_top_k)
    if backend.startswith("tensorrt") and opts.top_p < 1.0 and TOPK_LIMIT < opts.top_k < target.vocab_size:
        raise OptionsError.bad("top_k", opts.top_k, f"with top_p below 1 the drafter selects the top-k survivors, "
                                                    f"and TensorRT selects at most {TOPK_LIMIT}; lower top_k or "
                                                    "run on --backend onnxruntime")
    if opts.relaxed and neighbours is not None and opts.lantern_k > neighbours:
        raise OptionsError.bad("lantern_k", opts.lantern_k, f"the engine folder stores {neighbours} neighbours per "
                                                            "code; re-export with a larger --lantern-k")


@dataclass
class EngineSet:
    backend: str
    # the target's config; the loop reads cls_token_num (condition slots), num_image_tokens, vocab_size (the head's
    # ids), sampled_ids (the range of them an image position takes), max_positions, n_layer, n_head, head_dim, dim
    target: object
    drafter_layers: int
    graphs: dict[str, Engine]
    codebook: torch.Tensor  # [vocab, e_dim] code vectors the decoder sees
    device: torch.device
    dtype: torch.dtype  # activations and caches
    max_draft_top_k: int
    conditioning: Conditioning  # conditions -> the prefill's input, and the guidance null
    token_layout: TokenLayout | None = None  # tokens the family forces into the image stream; None: none
    neighbour_table: torch.Tensor | None = None  # [vocab, K] nearest codes, precomputed by the exporter
    default_options: dict = field(default_factory=dict)
    buffers: dict = field(default_factory=dict, repr=False)  # (name, shape) -> free cache buffers
    buffer_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    on_close: list = field(default_factory=list, repr=False)  # callables that persist state (TensorRT-RTX's cache)
    # draft_tree graphs by tree shape (graphs["draft_tree"] is the folder's own); ``tree_loader`` makes one for
    # another shape where the backend can, else it is None
    trees: dict = field(default_factory=dict, repr=False)
    tree_loader: Callable[[TreeShape], Engine] | None = field(default=None, repr=False)
    tree_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    capture_cycles: bool = False  # replay whole speculative cycles as CUDA graphs (vvs.runtime.captured)
    neighbour_sets: dict = field(default_factory=dict, repr=False)  # k -> [vocab, k] int64, made once per k
    text: TextEncoder | None = None  # prompts -> captions, for a t2i folder exported with its text encoder

    def close(self) -> None:
        """Persist what the backend learnt while running (also done when the process exits)."""
        for fn in self.on_close:
            fn()

    def cache_buffer(self, name: str, shape: tuple[int, ...], owner: list) -> torch.Tensor:
        """A zeroed cache buffer for one generation, appended to ``owner`` until :meth:`release`. Released buffers
        are reused, so addresses stay the same from one generation to the next (CUDA graphs and TensorRT bind
        them), and concurrent generations never share one."""
        key = (name, tuple(shape))
        with self.buffer_lock:
            free = self.buffers.setdefault(key, [])
            buf = free.pop() if free else None
        if buf is None:
            buf = torch.zeros(shape, dtype=self.dtype, device=self.device)
        else:
            buf.zero_()
        owner.append((key, buf))
        return buf

    def release(self, owner: list) -> None:
        """Return a generation's buffers to the pool."""
        with self.buffer_lock:
            for key, buf in owner:
                self.buffers.setdefault(key, []).append(buf)
        owner.clear()

    @property
    def has_drafter(self) -> bool:
        """Whether the folder has a drafter (the drafter-free modes and ar run without one)."""
        return "draft_tree" in self.graphs

    def check_options(self, opts) -> None:
        stored = None if self.neighbour_table is None or self.backend == "torch" else self.neighbour_table.shape[1]
        check_fit(opts, self.target, self.has_drafter, self.max_draft_top_k, self.backend, stored)

    def draft_tree(self, tree: TreeShape) -> Engine:
        """The ``draft_tree`` engine that grows trees of this shape."""
        with self.tree_lock:
            engine = self.trees.get(tree)
            if engine is None:
                if self.tree_loader is None:
                    built = ", ".join(t.name for t in self.trees) or "none"
                    raise OptionsError(f"options tree_size={tree.tree_size}, depth={tree.depth}, draft_top_k="
                                       f"{tree.draft_top_k}: the {self.backend} engines are built for trees {built} "
                                       "(size x depth x top-k); rebuild them with these as the decoding defaults")
                engine = self.trees[tree] = self.tree_loader(tree)
            return engine

    def neighbours(self, k: int) -> torch.Tensor:
        """``[vocab, k]`` nearest codes of every code (LANTERN's proximity sets). Kept per k: at 16,384 codes and
        k = 1000 the int64 table is 131 MB, too much to rebuild for every batch that joins."""
        sets = self.neighbour_sets.get(k)
        if sets is None:
            if self.neighbour_table is None or self.neighbour_table.shape[1] < k:
                self.neighbour_table = nearest_codes(self.codebook, k).to(self.device)
            sets = self.neighbour_sets[k] = self.neighbour_table[:, :k].long()
        return sets
