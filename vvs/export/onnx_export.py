"""Export one graph module to ONNX with torch's dynamo exporter, following its :class:`GraphSpec`.

Every spec axis with a symbolic name is exported dynamic (``Dim.AUTO``, since ``past + new`` cannot be written
as a ``Dim`` expression) and renamed back to the spec's name in the saved model, so that the file documents
itself. Opset 23: ONNX Runtime 1.31 and TensorRT 11's parser both read it; attention becomes one single-output
``Attention`` node whose keys/values are ``past ‖ new`` (no cache update inside, no control flow).

The exporter traces a twin of the module whose parameters and buffers live on the meta device, and each weight is
read from the module (cast, transposed, or quantised for a weight-only graph) only as the file is written, one
tensor at a time: an export holds the module's weights once plus one tensor. Tracing the module itself held a
second copy, and a folder's export with the quantiser's pass about four (Janus-Pro-1B: 4.1 float32 copies), more
than 24 GiB for any 7B target.
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
from vvs.export.row_int8 import as_matmul_integer
from vvs.export.weight_only import as_matmul_nbits
from vvs.models.layers import cast_floating

OPSET = 23
FOLDED = ("Transpose", "QuantizeLinear")  # ops of a weight alone, which the file stores folded
EXTERNAL_DATA_BYTES = 1 << 30  # larger graphs keep their weights in a side file (protobuf's 2 GiB limit)


def export_graph(module: torch.nn.Module, spec: GraphSpec, path: Path, vocab: int, max_position: int,
                 dtype: torch.dtype | None = None, weights: str | None = None, on_meta: bool = True) -> list[Path]:
    """Write ``path`` (and ``path.data`` for large graphs); returns the files written. ``dtype``: the graph's
    floating dtype (default the module's, RoPE tables stay float32); ``weights``: "int8", "int4" or "int4-head8"
    writes every constant matrix a MatMul multiplies by as ONNX Runtime's ``MatMulNBits``
    (:mod:`vvs.export.weight_only`), "w8a8" as int8 codes that ``MatMulInteger`` multiplies by activations quantised
    per row (:mod:`vvs.export.row_int8`).
    ``on_meta=False`` traces a copy of the module with its weights: fake-quantised (W8A8) linears export as
    ``QuantizeLinear`` / ``DequantizeLinear`` only from real tensors."""
    module.requires_grad_(False)  # inference graphs (and fake-quant ops export as Q/DQ only without autograd)
    sources = {**dict(module.named_parameters(remove_duplicate=False)),
               **dict(module.named_buffers(remove_duplicate=False))}
    if on_meta:
        twin = meta_twin(module, dtype)
        device = "meta"  # the twin's
    else:
        twin = copy.deepcopy(module) if dtype is None else cast_floating(copy.deepcopy(module), dtype)
        device = "cpu"
    args, dynamic = module_arguments(spec, sample_inputs(spec, vocab, max_position), device)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # e.g. "torchvision is not installed" notices
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(twin, args, dynamo=True, opset_version=OPSET, dynamic_shapes=dynamic,
                                    input_names=[t.name for t in spec.graph_inputs], output_names=spec.output_names,
                                    verbose=False, optimize=False)
    model = program.model
    stored_bytes = sum(p.numel() * p.element_size() for p in twin.parameters())
    if weights is not None:  # before optimising: the matrices' transposes must not be folded into copies
        read = lambda name: sources[name].detach().float().numpy()  # noqa: E731
        if weights == "w8a8":
            as_matmul_integer(model.graph, read, dict(module.named_parameters(remove_duplicate=False)))
        else:
            as_matmul_nbits(model.graph, read, weights)
    for name, value in model.graph.initializers.items():
        if name in sources and getattr(value.const_value, "raw", None) is not None and value.const_value.raw.is_meta:
            value.const_value = lazy_weight(sources[name], value)
    fold_lazily(model.graph)
    stored = {name: value for name, value in model.graph.initializers.items() if name in sources}
    program.optimize()
    keep_names(program.model.graph, stored)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = path.with_name(path.name + ".data")
    large = stored_bytes > EXTERNAL_DATA_BYTES
    ir.save(program.model, tmp, external_data=data.name if large else None)
    proto = onnx.load(str(tmp), load_external_data=False)
    rename_dims(proto, spec)
    for node in proto.graph.node:  # torch's trace of each node (stack, scopes): 90 % of a graph file's bytes
        del node.metadata_props[:]
    onnx.save_model(proto, tmp)
    os.replace(tmp, path)
    return [path, data] if large else [path]


def keep_names(graph: ir.Graph, stored: dict[str, ir.Value]) -> None:
    """Give back to ``graph`` each parameter the optimiser merged into an equal one (two norms of ones), unused: a
    folder's torch backend reads every parameter back from the graphs by its name, and the folder's weights file
    stores equal tensors once, so the name costs no bytes there."""
    for name, value in stored.items():
        if name not in graph.initializers:
            graph.register_initializer(ir.Value(name=name, shape=value.shape, type=value.type,
                                                const_value=value.const_value))


def module_arguments(spec: GraphSpec, values: tuple[torch.Tensor, ...], device: str) -> tuple[tuple, tuple]:
    """The module's arguments for tracing, and their dynamic axes: an input the graph takes in pieces
    (:attr:`TensorSpec.pieces`) passes as a tuple of its pieces, which the exporter makes the graph's inputs one by
    one, and which the module reads as it reads the whole tensor."""
    args, dynamic = [], []
    for t, value in zip(spec.inputs, values):
        pieces = tuple(v.to(device) for v in t.graph_values(value))
        axes = tuple({axis: Dim.AUTO for axis, d in enumerate(p.shape) if isinstance(d, str)} or None
                     for p in t.graph_tensors())
        args.append(pieces if t.pieces else pieces[0])
        dynamic.append(axes if t.pieces else axes[0])
    return tuple(args), tuple(dynamic)


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


def fold_lazily(graph: ir.Graph) -> None:
    """Fold each :data:`FOLDED` node of a weight -- torch's exporter writes a Linear as ``MatMul(x, Transpose(W))``,
    a W8A8 linear quantises its weight with ``QuantizeLinear`` -- into a constant computed as the file is written:
    the optimiser would fold each into a new constant held in memory."""
    for node in list(graph):  # in graph order: a folded output may feed the next node
        if node.op_type not in FOLDED or node.domain not in ("", "ai.onnx"):
            continue
        data, *rest = node.inputs
        if (data is None
                or not isinstance(data.const_value, ir.LazyTensor)
                or any(v is not None and v.const_value is None for v in rest)):
            continue
        out = node.outputs[0]
        if node.op_type == "Transpose":
            perm = node.attributes.get_ints("perm", list(reversed(range(len(data.shape)))))
            shape = ir.Shape([data.shape[p] for p in perm])
        else:
            shape = data.shape
        if node.op_type == "Transpose":
            dtype = data.dtype
        else:  # QuantizeLinear: its zero point's type, uint8 without one
            dtype = rest[1].dtype if len(rest) > 1 and rest[1] is not None else ir.DataType.UINT8
        inputs = [None if v is None else v.const_value for v in node.inputs]
        name = f"{data.name}_{node.op_type.lower()}"
        if name not in graph.initializers:  # a weight two nodes fold alike (a tied head) is stored once
            lazy = ir.LazyTensor(lambda node=node, inputs=inputs: _evaluate(node, inputs), dtype=dtype, shape=shape,
                                 name=name)
            graph.register_initializer(ir.Value(name=name, shape=shape, type=ir.TensorType(dtype), const_value=lazy))
        out.replace_all_uses_with(graph.initializers[name])
        graph.remove(node, safe=True)
    for name in [n for n, v in graph.initializers.items() if not v.uses() and not v.is_graph_output()]:
        graph.initializers.pop(name)


def _evaluate(node: ir.Node, inputs: list) -> ir.Tensor:
    """``node`` on constant ``inputs``, by ONNX's reference implementation (what the optimiser folds with)."""
    from onnx.reference import ReferenceEvaluator

    proto = ir.serde.serialize_node(node)
    names = ["" if t is None else f"in{i}" for i, t in enumerate(inputs)]
    proto.input[:], proto.output[:] = names, ["out"]
    arrays = {name: t.numpy() for name, t in zip(names, inputs) if t is not None}
    graph = onnx.helper.make_graph(
        [proto], "fold", [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                          for n, a in arrays.items()], [onnx.helper.make_empty_tensor_value_info("out")])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    (result,) = ReferenceEvaluator(model).run(None, arrays)
    return ir.Tensor(np.ascontiguousarray(result))


def rename_dims(model: onnx.ModelProto, spec: GraphSpec) -> None:
    """Give the exporter's symbols (``s11``...) the spec's names, everywhere in the graph."""
    names: dict[str, str] = {}
    for value, tspec in zip(list(model.graph.input) + list(model.graph.output), spec.graph_inputs + spec.outputs):
        for dim, want in zip(value.type.tensor_type.shape.dim, tspec.shape):
            if isinstance(want, str) and dim.dim_param:
                names.setdefault(dim.dim_param, want)
    for value in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in names:
                dim.dim_param = names[dim.dim_param]
