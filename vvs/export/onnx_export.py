"""Export one graph module to ONNX with torch's dynamo exporter, following its :class:`GraphSpec`.

Every spec axis with a symbolic name is exported dynamic (``Dim.AUTO``, since ``past + new`` cannot be written
as a ``Dim`` expression) and renamed back to the spec's name in the saved model, so that the file documents
itself. Opset 23: ONNX Runtime 1.31 and TensorRT 11's parser both read it; attention becomes one single-output
``Attention`` node whose keys/values are ``past ‖ new`` (no cache update inside, no control flow).
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import onnx
import torch
from torch.export import Dim

from vvs.export.spec import GraphSpec, sample_inputs

OPSET = 23
EXTERNAL_DATA_BYTES = 1 << 30  # larger graphs keep their weights in a side file (protobuf's 2 GiB limit)


def export_graph(module: torch.nn.Module, spec: GraphSpec, path: Path, vocab: int, max_position: int) -> list[Path]:
    """Write ``path`` (and ``path.data`` for large graphs); returns the files written."""
    module.requires_grad_(False)  # inference graphs (and fake-quant ops export as Q/DQ only without autograd)
    args = sample_inputs(spec, vocab, max_position)
    dynamic = tuple({axis: Dim.AUTO for axis, d in enumerate(t.shape) if isinstance(d, str)} or None
                    for t in spec.inputs)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # e.g. "torchvision is not installed" notices
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
