"""How a graph's I/O contract is declared (:class:`TensorSpec`, :class:`GraphSpec`): each family declares its graphs'
specs once, beside the graphs (``vvs.families.<name>.graphs``); the text encoder's is here.

The exporter takes input/output names, dtypes and dynamic axes from here; the manifest stores these specs;
every backend checks the tensors it is given against them; the TensorRT builder derives its optimisation
profiles from the symbolic dimensions.

Symbolic dimensions: ``batch`` (rows: images, or images x 2 with guidance), ``images``, ``new`` (positions
this call adds), ``past`` (static KV capacity). All other dimensions are fixed by the model config.

KV layout: ``past_kv [layers, 2 (key, value), batch, heads, past, head_dim]`` is read-only input, the whole
static buffer; ``new_kv [layers, 2, batch, heads, new, head_dim]`` are the keys/values of the new positions. The
mask is bool ``[batch, 1, new, past + new]`` over ``past ‖ new`` (True = may attend). The runtime commits the
rows it keeps into the buffer, so shapes stay fixed per bucket of ``new`` and no graph mutates state.

A target graph takes ``past_kv`` in pieces (:attr:`TensorSpec.pieces`): one input per layer's keys and per layer's
values (``past_kv.3.1``: layer 3's values), each bound to its place in the one buffer. Runtimes and specs speak of
the whole tensor; only the graph and the backends' binding see the pieces (:meth:`GraphSpec.graph_feeds`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import torch

# float64: the torch backend's host-independent reference (CPU kernels round float32 differently per instruction set)
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "int64": torch.int64,
          "bool": torch.bool}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int | str, ...]
    # its value sizes a tensor inside the graph: TensorRT reads it on the host (a shape tensor), and its
    # optimisation profiles bound the value rather than the shape
    host: bool = False
    # the graph takes one input per index of the first ``pieces`` axes, each bound to its place in the tensor: a graph
    # that split one cache input itself copied all of it on every call (ONNX Runtime's Split copies; at Janus-Pro-1B's
    # width that copy was 45-69 % of an int4 AR step's profile)
    pieces: int = 0

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                **({"host": True} if self.host else {}), **({"pieces": self.pieces} if self.pieces else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "TensorSpec":
        return cls(d["name"], d["dtype"], tuple(d["shape"]), d.get("host", False), d.get("pieces", 0))

    def graph_tensors(self) -> list["TensorSpec"]:
        """The graph's own inputs for this tensor: itself, or its pieces, named by their index."""
        if not self.pieces:
            return [self]
        return [TensorSpec(".".join(map(str, (self.name, *index))), self.dtype, self.shape[self.pieces:])
                for index in itertools.product(*map(range, self.shape[:self.pieces]))]

    def graph_values(self, value: torch.Tensor) -> list[torch.Tensor]:
        """``value`` as the graph's inputs take it: views of its pieces, in :meth:`graph_tensors` order."""
        return list(value.flatten(0, self.pieces - 1).unbind(0)) if self.pieces else [value]

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

    @cached_property  # read on every call of a graph: its pieces' names are built once
    def _graph_names(self) -> tuple[tuple[TensorSpec, tuple[str, ...]], ...]:
        return tuple((t, tuple(piece.name for piece in t.graph_tensors())) for t in self.inputs)

    @cached_property
    def graph_inputs(self) -> tuple[TensorSpec, ...]:
        """The ONNX graph's inputs, in order: each input, or its pieces."""
        return tuple(piece for t in self.inputs for piece in t.graph_tensors())

    def graph_feeds(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``inputs`` (one tensor per spec input) as the graph's inputs, in :attr:`graph_inputs` order."""
        feeds = {}
        for t, names in self._graph_names:
            feeds.update(zip(names, t.graph_values(inputs[t.name])))
        return feeds

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


def text_encode_spec(slots: int, width: int, act: str = "float32") -> GraphSpec:
    """The text encoder (:mod:`vvs.text`): T5 token ids and attention mask (1 = token, right-padded as T5 pads) of
    one prompt per image -> the encoder's last hidden state; left padding happens after it."""
    return GraphSpec("text_encode", (
        TensorSpec("input_ids", "int64", ("images", slots)),
        TensorSpec("attention_mask", "int64", ("images", slots)),
    ), (
        TensorSpec("hidden", act, ("images", slots, width)),
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
    if spec.name == "survivors_k":
        return torch.full(shape, 3, dtype=torch.long)
    return torch.randn(shape, dtype=dtype)


def sample_inputs(spec: GraphSpec, vocab: int, max_position: int, dims: dict[str, int] | None = None):
    dims = dims or SAMPLE_DIMS
    gen_state = torch.get_rng_state()
    torch.manual_seed(0)
    try:
        return tuple(sample_tensor(t, dims, vocab, max_position) for t in spec.inputs)
    finally:
        torch.set_rng_state(gen_state)
