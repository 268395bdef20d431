"""The I/O contract of every graph, declared once.

The exporter takes input/output names, dtypes and dynamic axes from here; the manifest stores these specs;
every backend checks the tensors it is given against them; the TensorRT builder derives its optimisation
profiles from the symbolic dimensions.

Symbolic dimensions: ``batch`` (rows: images, or images x 2 with guidance), ``images``, ``new`` (positions
this call adds), ``past`` (static KV capacity). All other dimensions are fixed by the model config.

KV layout: ``past_kv [layers, 2 (key, value), batch, heads, past, head_dim]`` is read-only input, the whole
static buffer; ``new_kv [layers, 2, batch, heads, new, head_dim]`` are the keys/values of the new positions. The
mask is bool ``[batch, 1, new, past + new]`` over ``past ‖ new`` (True = may attend). The runtime commits the
rows it keeps into the buffer, so shapes stay fixed per bucket of ``new`` and no graph mutates state.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "int64": torch.int64, "bool": torch.bool}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict) -> "TensorSpec":
        return cls(d["name"], d["dtype"], tuple(d["shape"]))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def check(self, graph: str, value: torch.Tensor, dims: dict[str, int]) -> None:
        """Raise ValueError unless ``value`` matches this spec; bind symbolic dims consistently in ``dims``."""
        if value.dtype != self.torch_dtype:
            raise ValueError(f"{graph}.{self.name}: dtype {value.dtype} but the graph takes {self.dtype}")
        if value.dim() != len(self.shape):
            raise ValueError(f"{graph}.{self.name}: {value.dim()} dims but the graph takes {list(self.shape)}")
        for axis, (want, got) in enumerate(zip(self.shape, value.shape)):
            if isinstance(want, int):
                if want != got:
                    raise ValueError(f"{graph}.{self.name}: axis {axis} is {got}, expected {want}")
            elif dims.setdefault(want, got) != got:
                raise ValueError(f"{graph}.{self.name}: axis {axis} ({want}) is {got}, elsewhere {dims[want]}")


@dataclass(frozen=True)
class GraphSpec:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def check_inputs(self, inputs: dict[str, torch.Tensor]) -> dict[str, int]:
        missing = set(self.input_names) - inputs.keys()
        extra = inputs.keys() - set(self.input_names)
        if missing or extra:
            raise ValueError(f"{self.name}: missing inputs {sorted(missing)}, unexpected {sorted(extra)}")
        dims: dict[str, int] = {}
        for spec in self.inputs:
            spec.check(self.name, inputs[spec.name], dims)
        return dims

    def to_dict(self) -> dict:
        return {"name": self.name, "inputs": [t.to_dict() for t in self.inputs],
                "outputs": [t.to_dict() for t in self.outputs]}

    @classmethod
    def from_dict(cls, d: dict) -> "GraphSpec":
        return cls(d["name"], tuple(TensorSpec.from_dict(t) for t in d["inputs"]),
                   tuple(TensorSpec.from_dict(t) for t in d["outputs"]))


def graph_specs(target, drafter, vq, tree, act: str = "float32") -> dict[str, GraphSpec]:
    """Specs of the four graphs for a target ``GPTConfig``, ``DrafterConfig``, ``VQConfig`` and the ``TreeShape``
    of the ``draft_tree`` graph.

    ``act`` is the dtype of activations, features and caches ("float32" or "float16"); logits are float32.
    """
    t = target
    kv = ("batch", t.n_head, "past", t.head_dim)
    cond = (TensorSpec("condition", "int64", ("batch",)) if t.model_type == "c2i"
            else TensorSpec("condition", act, ("batch", t.cls_token_num, t.caption_dim)))
    image = vq.downsample * t.grid_size
    return {
        "target_prefill": GraphSpec("target_prefill", (
            cond,
            TensorSpec("attn_mask", "bool", ("batch", 1, t.cls_token_num, t.cls_token_num)),
            TensorSpec("cfg_mix", "float32", ("images", "batch")),
        ), (
            TensorSpec("logits", "float32", ("images", t.vocab_size)),
            TensorSpec("hidden", act, ("batch", t.cls_token_num, t.dim)),
            TensorSpec("new_kv", act, (t.n_layer, 2, "batch", t.n_head, t.cls_token_num, t.head_dim)),
        )),
        "target_verify": GraphSpec("target_verify", (
            TensorSpec("input_ids", "int64", ("batch", "new")),
            TensorSpec("position_ids", "int64", ("batch", "new")),
            TensorSpec("attn_mask", "bool", ("batch", 1, "new", "past_plus_new")),
            TensorSpec("past_kv", act, (t.n_layer, 2, *kv)),
            TensorSpec("cfg_mix", "float32", ("images", "batch")),
        ), (
            TensorSpec("logits", "float32", ("images", "new", t.vocab_size)),
            TensorSpec("hidden", act, ("batch", "new", t.dim)),
            TensorSpec("new_kv", act, (t.n_layer, 2, "batch", t.n_head, "new", t.head_dim)),
        )),
        "draft_tree": draft_tree_spec(target, drafter, tree, act),
        "vq_decode": GraphSpec("vq_decode", (
            TensorSpec("codes", "int64", ("images", t.num_image_tokens)),
        ), (
            TensorSpec("image", "float32", ("images", 3, image, image)),
        )),
    }


def draft_tree_spec(target, drafter, tree, act: str = "float32") -> GraphSpec:
    """The drafter's new stable slots in, one draft tree per image out (:class:`vvs.families.llamagen.graphs.DraftTreeGraph`):
    ``tokens`` are the ``tree_size - 1`` drafted nodes; ``parent``, ``depth`` and ``ancestors`` describe the tree
    with its root as node 0. ``past_len``: committed drafter slots per image; ``new_count``: valid new slots."""
    t, size = target, tree.tree_size
    kv = (drafter.num_hidden_layers, 2, "batch", t.n_head)
    return GraphSpec("draft_tree", (
        TensorSpec("features", act, ("batch", "new", t.dim)),
        TensorSpec("input_ids", "int64", ("batch", "new")),
        TensorSpec("position_ids", "int64", ("batch", "new")),
        TensorSpec("past_kv", act, (*kv, "past", t.head_dim)),
        TensorSpec("past_len", "int64", ("images",)),
        TensorSpec("new_count", "int64", ("images",)),
        TensorSpec("root_position", "int64", ("images",)),
        TensorSpec("cfg_mix", "float32", ("images", "batch")),
        TensorSpec("temperature", "float32", (1,)),  # the logits processor
        TensorSpec("top_k", "int64", (1,)),
        TensorSpec("top_p", "float32", (1,)),
    ), (
        TensorSpec("stable_kv", act, (*kv, "new", t.head_dim)),
        TensorSpec("tokens", "int64", ("images", size - 1)),
        TensorSpec("parent", "int64", ("images", size)),
        TensorSpec("depth", "int64", ("images", size)),
        TensorSpec("ancestors", "bool", ("images", size, size)),
    ))


def text_encode_spec(slots: int, width: int) -> GraphSpec:
    """The text encoder (:mod:`vvs.text`): T5 token ids and attention mask (1 = token, right-padded as T5 pads) of
    one prompt per image -> the encoder's last hidden state; left padding happens after it."""
    return GraphSpec("text_encode", (
        TensorSpec("input_ids", "int64", ("images", slots)),
        TensorSpec("attention_mask", "int64", ("images", slots)),
    ), (
        TensorSpec("hidden", "float32", ("images", slots, width)),
    ))


SAMPLE_DIMS = {"batch": 4, "images": 2, "new": 3, "past": 7, "tokens": 5}  # distinct, so no dynamic axis gets specialised


def sample_tensor(spec: TensorSpec, dims: dict[str, int], vocab: int, max_position: int) -> torch.Tensor:
    shape = [d if isinstance(d, int) else (dims["past"] + dims["new"] if d == "past_plus_new" else dims[d])
             for d in spec.shape]
    dtype = spec.torch_dtype
    if spec.name == "attn_mask":
        mask = torch.rand(shape) > 0.3
        mask[..., -shape[2]:] |= torch.eye(shape[2], dtype=torch.bool)  # every row sees itself
        return mask
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if spec.name == "attention_mask":  # right-padded token masks of different lengths
        return (torch.arange(shape[1]) < torch.randint(1, shape[1] + 1, (shape[0], 1))).long()
    if spec.name in ("input_ids", "codes"):
        return torch.randint(0, vocab, shape)
    if spec.name == "position_ids":
        return torch.randint(0, max_position + 1, shape)
    if spec.name == "labels" or (spec.name == "condition" and dtype == torch.int64):
        return torch.randint(0, 2, shape)
    if spec.name == "past_len":
        return torch.randint(0, max(1, dims["past"] - dims["new"] + 1), shape)
    if spec.name == "new_count":
        return torch.randint(1, dims["new"] + 1, shape)
    if spec.name == "root_position":
        return torch.randint(0, max_position + 1, shape)
    if spec.name == "temperature":
        return torch.ones(shape)
    if spec.name == "top_k":
        return torch.zeros(shape, dtype=torch.long)
    if spec.name == "top_p":
        return torch.ones(shape)
    return torch.randn(shape, dtype=dtype)


def sample_inputs(spec: GraphSpec, vocab: int, max_position: int, dims: dict[str, int] | None = None):
    dims = dims or SAMPLE_DIMS
    gen_state = torch.get_rng_state()
    torch.manual_seed(0)
    try:
        return tuple(sample_tensor(t, dims, vocab, max_position) for t in spec.inputs)
    finally:
        torch.set_rng_state(gen_state)
