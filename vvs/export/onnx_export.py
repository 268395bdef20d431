"""Export one graph module to ONNX with torch's dynamo exporter, following its :class:`GraphSpec`.

Every spec axis with a symbolic name is exported dynamic (``Dim.AUTO``, since ``past + new`` cannot be written
as a ``Dim`` expression) and renamed back to the spec's name in the saved model, so that the file documents
itself. Opset 23: ONNX Runtime 1.31 and TensorRT 11's parser both read it; attention becomes one single-output
``Attention`` node whose keys/values are ``past ‖ new`` (no cache update inside, no control flow).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import onnx
import torch
from torch.export import Dim

from vvs.export.spec import GraphSpec, TensorSpec

OPSET = 23
SAMPLE_DIMS = {"batch": 4, "images": 2, "new": 3, "past": 7}
EXTERNAL_DATA_BYTES = 1 << 30  # larger graphs keep their weights in a side file (protobuf's 2 GiB limit)


def sample_tensor(spec: TensorSpec, dims: dict[str, int], vocab: int, max_position: int) -> torch.Tensor:
    shape = [d if isinstance(d, int) else (dims["past"] + dims["new"] if d == "past_plus_new" else dims[d])
             for d in spec.shape]
    dtype = spec.torch_dtype
    if spec.name == "attn_mask":
        mask = torch.rand(shape) > 0.3
        mask[..., -shape[2]:] |= torch.eye(shape[2], dtype=torch.bool)  # every row sees itself
        return mask
    if spec.name in ("input_ids", "codes"):
        return torch.randint(0, vocab, shape)
    if spec.name == "position_ids":
        return torch.randint(0, max_position + 1, shape)
    if spec.name == "condition" and dtype == torch.int64:
        return torch.randint(0, 2, shape)
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


def export_graph(module: torch.nn.Module, spec: GraphSpec, path: Path, vocab: int, max_position: int) -> list[Path]:
    """Write ``path`` (and ``path.data`` for large graphs); returns the files written."""
    module.requires_grad_(False)  # inference graphs (and fake-quant ops export as Q/DQ only without autograd)
    args = sample_inputs(spec, vocab, max_position)
    dynamic = tuple({axis: Dim.AUTO for axis, d in enumerate(t.shape) if isinstance(d, str)} or None
                    for t in spec.inputs)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, args, dynamo=True, opset_version=OPSET, dynamic_shapes=dynamic,
                                    input_names=spec.input_names, output_names=spec.output_names, verbose=False)
    model = program.model_proto
    rename_dims(model, spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    large = sum(p.numel() * p.element_size() for p in module.parameters()) > EXTERNAL_DATA_BYTES
    tmp = path.with_name(path.name + ".tmp")
    data = path.with_name(path.name + ".data")
    if large:
        onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=1024)
    else:
        onnx.save_model(model, tmp)
    os.replace(tmp, path)
    return [path, data] if large else [path]


def rename_dims(model: onnx.ModelProto, spec: GraphSpec) -> None:
    """Give the exporter's symbols (``s11``...) the spec's names, everywhere in the graph."""
    names: dict[str, str] = {}
    for value, tspec in zip(list(model.graph.input) + list(model.graph.output), spec.inputs + spec.outputs):
        for dim, want in zip(value.type.tensor_type.shape.dim, tspec.shape):
            if isinstance(want, str) and dim.dim_param:
                names.setdefault(dim.dim_param, want)
    for value in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in names:
                dim.dim_param = names[dim.dim_param]
