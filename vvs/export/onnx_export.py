"""Export one graph module to ONNX with torch's dynamo exporter, following its :class:`GraphSpec`.

Every spec axis with a symbolic name is exported dynamic (``Dim.AUTO``, since ``past + new`` cannot be written
as a ``Dim`` expression) and renamed back to the spec's name in the saved model, so that the file documents
itself. Opset 23: ONNX Runtime 1.31 and TensorRT 11's parser both read it; attention becomes one single-output
``Attention`` node whose keys/values are ``past ‖ new`` (no cache update inside, no control flow).

The exporter traces a twin of the module whose parameters live on the meta device, and each weight is read from
the module (cast, or quantised for a weight-only graph) only as the file is written, one tensor at a time: an
export holds the module's weights once plus one tensor, where tracing the module itself held about four copies
(a 7B target's export then needs more than 100 GB).
"""
from __future__ import annotations

import copy
import logging
import os
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import torch
from torch.export import Dim

from vvs.export.spec import GraphSpec, sample_inputs
from vvs.export.weight_only import as_matmul_nbits
from vvs.models.layers import cast_floating

OPSET = 23
EXTERNAL_DATA_BYTES = 1 << 30  # larger graphs keep their weights in a side file (protobuf's 2 GiB limit)


def export_graph(module: torch.nn.Module, spec: GraphSpec, path: Path, vocab: int, max_position: int,
                 dtype: torch.dtype | None = None, weights: str | None = None) -> list[Path]:
    """Write ``path`` (and ``path.data`` for large graphs); returns the files written. ``dtype``: the graph's
    floating dtype (default the module's, RoPE tables stay float32); ``weights``: "int8" or "int4" writes every
    constant matrix a MatMul multiplies by as ONNX Runtime's ``MatMulNBits`` (:mod:`vvs.export.weight_only`)."""
    module.requires_grad_(False)  # inference graphs (and fake-quant ops export as Q/DQ only without autograd)
    sources = {**dict(module.named_parameters(remove_duplicate=False)), **dict(module.named_buffers(remove_duplicate=False))}
    twin = meta_twin(module, dtype)
    args = tuple(a.to("meta") for a in sample_inputs(spec, vocab, max_position))  # the twin's device
    dynamic = tuple({axis: Dim.AUTO for axis, d in enumerate(t.shape) if isinstance(d, str)} or None
                    for t in spec.inputs)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # e.g. "torchvision is not installed" notices
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(twin, args, dynamo=True, opset_version=OPSET, dynamic_shapes=dynamic,
                                    input_names=spec.input_names, output_names=spec.output_names, verbose=False,
                                    optimize=False)
    model = program.model
    stored_bytes = sum(p.numel() * p.element_size() for p in twin.parameters())
    if weights is not None:  # before optimising: the matrices' transposes must not be folded into copies
        as_matmul_nbits(model.graph, lambda name: sources[name].detach().float().numpy(), weights)
    for name, value in model.graph.initializers.items():
        if name in sources and getattr(value.const_value, "raw", None) is not None and value.const_value.raw.is_meta:
            value.const_value = lazy_weight(sources[name], value)
    transpose_lazily(model.graph)
    program.optimize()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = path.with_name(path.name + ".data")
    large = stored_bytes > EXTERNAL_DATA_BYTES
    ir.save(program.model, tmp, external_data=data.name if large else None)
    proto = onnx.load(str(tmp), load_external_data=False)
    rename_dims(proto, spec)
    onnx.save_model(proto, tmp)
    os.replace(tmp, path)
    return [path, data] if large else [path]


def meta_twin(module: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
    """``module`` with every parameter and buffer on the meta device, in ``dtype`` when given."""
    memo = {id(p): torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False)
            for _, p in module.named_parameters(remove_duplicate=False)}
    memo.update({id(b): torch.empty_like(b, device="meta") for _, b in module.named_buffers(remove_duplicate=False)})
    twin = copy.deepcopy(module, memo)
    return twin if dtype is None else cast_floating(twin, dtype)


def lazy_weight(source: torch.Tensor, value: ir.Value) -> ir.LazyTensor:
    """``source`` in the dtype the graph stores it in, computed when the file is written."""
    def tensor() -> ir.Tensor:
        array = source.detach()
        if array.is_floating_point():
            return ir.Tensor(np.ascontiguousarray(array.float().numpy().astype(value.dtype.numpy(), copy=False)),
                             name=value.name)
        return ir.Tensor(np.ascontiguousarray(array.numpy()), name=value.name)

    return ir.LazyTensor(tensor, dtype=value.dtype, shape=value.shape, name=value.name)


def transpose_lazily(graph: ir.Graph) -> None:
    """``Transpose`` of a weight (torch's exporter writes a Linear as ``MatMul(x, Transpose(W))``) -> the transposed
    weight, computed as the file is written: the optimiser would fold each into a new constant held in memory."""
    for node in list(graph):
        source = node.inputs[0] if node.op_type == "Transpose" else None
        if source is None or not isinstance(source.const_value, ir.LazyTensor) or len(source.shape) != 2:
            continue
        perm = node.attributes.get_ints("perm", [1, 0])
        if list(perm) != [1, 0]:
            continue
        weight = source.const_value
        lazy = ir.LazyTensor(lambda weight=weight: ir.Tensor(np.ascontiguousarray(weight.numpy().T)),
                             dtype=weight.dtype, shape=ir.Shape(reversed(source.shape)), name=f"{source.name}_t")
        value = ir.Value(name=lazy.name, shape=lazy.shape, type=ir.TensorType(lazy.dtype), const_value=lazy)
        if lazy.name not in graph.initializers:
            graph.register_initializer(value)
        node.outputs[0].replace_all_uses_with(graph.initializers[lazy.name])
        graph.remove(node, safe=True)
    for name in [n for n, v in graph.initializers.items() if not v.uses() and not v.is_graph_output()]:
        graph.initializers.pop(name)


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
