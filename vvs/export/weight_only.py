"""Weight-only int8 or int4 for ONNX Runtime on CPU: a graph's constant matrices as block-wise ``MatMulNBits``.

Why: a drafter call at official sizes streams its weights (the decoder layer and the 16,384-code head) once per tree
level for a handful of rows, so on a CPU it is bound by memory traffic, the more so in a decoding loop, where the
target's forward has evicted the drafter's weights from the caches; int8 weights stream a quarter of the bytes, int4
an eighth. Accuracy level 4 makes ONNX Runtime multiply int8 activations (quantised per block on the fly) with the
weights, which is where the time goes away; level 0 dequantises and is slower than float32 here. The drafter only
proposes, so what this changes is which drafts are proposed, never what an exact mode samples.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import onnx
from onnx import numpy_helper

BITS = {"int8": 8, "int4": 4}  # by the name an engine folder records
BLOCK = 32
ACCURACY_LEVEL = 4  # int8 activations times int8 weights


def fold_weight_transposes(model: onnx.ModelProto) -> None:
    """``MatMul(x, Transpose(W))`` as torch's exporter writes a Linear -> ``MatMul(x, W^T)`` with ``W^T`` stored:
    the quantiser only takes matrices that are initialisers."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    for node in list(graph.node):
        source = inits.get(node.input[0]) if node.op_type == "Transpose" else None
        if source is not None and len(source.dims) == 2:
            graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(source).T.copy(), node.output[0]))
            graph.node.remove(node)
    used = {name for node in graph.node for name in node.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)


def quantize_weights(path: Path, weights: str) -> list[Path]:
    """Rewrite the ONNX file ``path`` with ``MatMulNBits`` of ``weights`` (a :data:`BITS` name) in place of its
    constant-weight MatMuls (weights kept beside it in ``path.data``); returns the files it now consists of."""
    root = logging.getLogger()
    handlers, root_level = list(root.handlers), root.level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    root.handlers[:] = handlers  # importing it configures INFO logging for every library
    root.setLevel(root_level)
    path = Path(path)
    model = onnx.load(str(path))
    fold_weight_transposes(model)
    quantiser_log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = quantiser_log.level
    quantiser_log.setLevel(logging.WARNING)  # it logs every node it visits
    try:
        quantiser = MatMulNBitsQuantizer(model, bits=BITS[weights], block_size=BLOCK, is_symmetric=True,
                                         accuracy_level=ACCURACY_LEVEL)
        quantiser.process()
    finally:
        quantiser_log.setLevel(level)
    data = path.with_name(path.name + ".data")
    tmp = path.with_name(path.name + ".tmp")
    onnx.save_model(quantiser.model.model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
    os.replace(tmp, path)
    return [path, data]
