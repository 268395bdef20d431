"""Weight-only int8 or int4 for ONNX Runtime on CPU: a graph's constant matrices as block-wise ``MatMulNBits``.

Why: a drafter call at official sizes streams its weights (the decoder layer and the 16,384-code head) once per tree
level for a handful of rows, so on a CPU it is bound by memory traffic, the more so in a decoding loop, where the
target's forward has evicted the drafter's weights from the caches; int8 weights stream a quarter of the bytes, int4
an eighth. Accuracy level 4 makes ONNX Runtime multiply int8 activations (quantised per block on the fly) with the
weights, which is where the time goes away; level 0 dequantises and is slower than float32 here. The drafter only
proposes, so what this changes is which drafts are proposed, never what an exact mode samples. Quantising the
target too (``--weights``) is what lets a 7B target fit the memory users have: exact modes then sample the
quantised target's distribution. TensorRT cannot parse ``MatMulNBits``: :func:`dequantize_form` writes the same
integers and scales in the form its parser takes.

int4-head8 keeps the target's output head -- the matrix whose product is the logits -- at int8: an error there moves
every logit directly (guidance then multiplies it), and the head is a small share of a 1B-7B target's weights
(Janus-Pro-7B: 67M of 7B). On the shipped Janus-Pro pair it raises top-1 agreement with float32 from 80 % to 92 %.
"""
from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
from onnx import numpy_helper
from onnx_ir import convenience

# by the name an engine folder records: the bits of its matrices, and of the target's output head
BITS = {"int8": (8, 8), "int4": (4, 4), "int4-head8": (4, 8)}
HEADLESS = {"int4-head8": "int4"}  # what a graph without logits stores (the drafter's: its head proposes only)
BLOCK = 32
ACCURACY_LEVEL = 4  # int8 activations times int8 weights


def as_matmul_nbits(graph: ir.Graph, read: Callable[[str], np.ndarray], weights: str,
                    accuracy_level: int = ACCURACY_LEVEL) -> None:
    """Rewrite each MatMul of ``graph`` by a constant matrix -- an initialiser ``[K, N]``, or the transpose of one
    ``[N, K]``, as torch's exporter writes a Linear -- as ``MatMulNBits`` of ``weights`` (a :data:`BITS` name;
    its head bits apply to the :func:`output_head` of a graph with logits).
    ``read(name)`` gives an initialiser's float32 values; it is called only as the file is written, once per
    matrix, so the graph never holds more than one matrix's floats. ``accuracy_level``: what the kernel multiplies
    in (ONNX Runtime's levels: 1 float32, 4 int8; ``bench/row_costs.py`` measures each)."""
    matrices, head = BITS[weights]
    heads = output_head(graph)
    quantised: dict[tuple[str, int], tuple[ir.Value, ir.Value, int, int]] = {}
    for node, matrix, transpose in stored_matmuls(graph):
        transposed = transpose is not None
        bits = head if node in heads else matrices
        if (matrix.name, bits) not in quantised:
            quantised[matrix.name, bits] = _packed(graph, matrix, read, bits, transposed)
        packed, scales, k, n = quantised[matrix.name, bits]
        attributes = [ir.AttrInt64(key, value) for key, value in
                      (("K", k), ("N", n), ("bits", bits), ("block_size", BLOCK), ("accuracy_level", accuracy_level))]
        new = ir.Node("com.microsoft", "MatMulNBits", [node.inputs[0], packed, scales], attributes, name=node.name)
        convenience.replace_nodes_and_values(graph, node, [node], [new], node.outputs, new.outputs)
        if transposed and not transpose.outputs[0].uses():
            graph.remove(transpose, safe=True)
    for name in {name for name, _ in quantised}:
        if not graph.initializers[name].uses():
            graph.initializers.pop(name)
    graph.opset_imports.setdefault("com.microsoft", 1)


def output_head(graph: ir.Graph, output: str = "logits") -> set[ir.Node]:
    """The MatMuls by a constant matrix nearest to ``output`` upstream: the head whose product the logits are
    (guidance mixes the conditional and unconditional rows after it, itself a MatMul by an input)."""
    heads: set[ir.Node] = set()
    todo = [v.producer() for v in graph.outputs if v.name == output]
    seen: set[ir.Node] = set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.op_type == "MatMul" and stored_matrix(node) is not None:
            heads.add(node)
        else:
            todo.extend(value.producer() for value in node.inputs if value is not None)
    return heads


def stored_matmuls(graph: ir.Graph):
    """``(node, matrix, transpose)`` for each MatMul of ``graph`` by a stored matrix (:func:`stored_matrix`), in
    graph order, listed before the caller rewrites any of them."""
    for node in list(graph):
        if node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
            stored = stored_matrix(node)
            if stored is not None:
                yield node, *stored


def stored_matrix(node: ir.Node) -> tuple[ir.Value, ir.Node | None] | None:
    """The initialiser ``[K, N]`` a MatMul multiplies by, with the Transpose it goes through when stored ``[N, K]``
    (as torch's exporter writes a Linear); None when its second input is not a stored matrix."""
    source = node.inputs[1]
    transpose = source.producer()
    if not (transpose is not None and transpose.op_type == "Transpose"
            and list(transpose.attributes.get_ints("perm", [1, 0])) == [1, 0]):
        transpose = None
    matrix = source if transpose is None else transpose.inputs[0]
    if matrix.is_initializer() and matrix.shape is not None and len(matrix.shape) == 2:
        return matrix, transpose
    return None


def _packed(graph: ir.Graph, matrix: ir.Value, read, bits: int, transposed: bool) -> tuple[ir.Value, ir.Value, int, int]:
    """Initialisers of ``matrix`` as ONNX Runtime's block-wise symmetric codes ``[N, blocks, bytes]`` and scales
    ``[N, blocks]``, computed together when the first of them is written."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    n, k = matrix.shape if transposed else reversed(matrix.shape)
    blocks = -(-k // BLOCK)
    shapes = {"codes": (n, blocks, BLOCK * bits // 8), "scales": (n, blocks)}
    done: dict[str, np.ndarray] = {}

    def quantise(part: str) -> ir.Tensor:
        if part not in done:
            values = read(matrix.name)
            values = np.ascontiguousarray(values.T if transposed else values, dtype=np.float32)  # [K, N]
            values = np.pad(values, ((0, blocks * BLOCK - k), (0, 0)))
            if bits == 4:
                done["codes"] = np.zeros(shapes["codes"], np.uint8)
                done["scales"] = np.zeros(shapes["scales"], np.float32)
                quantize_matmul_4bits(done["codes"], values, done["scales"], np.zeros((n, blocks), np.uint8), BLOCK,
                                      n, k, True)
            else:
                done["codes"], done["scales"] = int8_blocks(values)
        return ir.Tensor(done.pop(part), name=f"{matrix.name}_Q{bits}_{part}")

    values = []
    for part, dtype in (("codes", ir.DataType.UINT8), ("scales", ir.DataType.FLOAT)):
        lazy = ir.LazyTensor(lambda part=part: quantise(part), dtype=dtype, shape=ir.Shape(shapes[part]),
                             name=f"{matrix.name}_Q{bits}_{part}")
        value = ir.Value(name=lazy.name, shape=lazy.shape, type=ir.TensorType(dtype), const_value=lazy)
        graph.register_initializer(value)
        values.append(value)
    return values[0], values[1], k, n


def int8_blocks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values [K, N]`` (K a multiple of :data:`BLOCK`) as symmetric int8 codes ``[N, blocks, BLOCK]`` (the integer
    plus MatMulNBits' implied zero point of 128) and positive scales ``[N, blocks]``: the largest |value| of a block
    is 127 of its scale, a block of zeros has scale 1. ONNX Runtime's own int8 quantiser maps the largest to -128
    with a negative scale, and a scale of zero to its zeros; TensorRT's parser refuses both."""
    k, n = values.shape
    blocks = values.T.reshape(n, k // BLOCK, BLOCK)
    largest = np.abs(blocks).max(-1)
    scales = np.where(largest == 0, 1, largest / 127).astype(np.float32)
    codes = (np.clip(np.rint(blocks / scales[..., None]), -127, 127) + 128).astype(np.uint8)
    return codes, scales


def dequantize_form(model: onnx.ModelProto, to_float: bool = False) -> onnx.ModelProto:
    """The same weights in the form TensorRT's parser takes: each ``MatMulNBits`` (as :func:`as_matmul_nbits`
    writes it: symmetric, no zero points, no bias) -> ``DequantizeLinear`` of its int4 / int8 matrix with one scale
    per block of ``BLOCK`` rows (opset 21's ``block_size``) -> ``MatMul``; ``to_float``: a ``MatMul`` of those values
    stored as float32. The integers and scales are ONNX Runtime's, so every backend multiplies by the same
    weights."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    stored = {}  # a matrix's integers and scales (or its float32 values), once however many nodes share it
    for node in list(graph.node):
        if node.op_type != "MatMulNBits":
            continue
        block = node_attributes(node)["block_size"]
        if node.input[1] not in stored:
            weight, scale = integers_and_scales(node, inits)
            stored[node.input[1]] = [as_float(weight, scale, block)] if to_float else [weight, scale]
            graph.initializer.extend(stored[node.input[1]])
        names = [t.name for t in stored[node.input[1]]]
        position = list(graph.node).index(node)
        graph.node.remove(node)
        matrix = names[0] if to_float else f"{node.name}_w"
        graph.node.insert(position, onnx.helper.make_node("MatMul", [node.input[0], matrix], list(node.output),
                                                          name=node.name))
        if not to_float:  # one DequantizeLinear per MatMul: TensorRT fuses each into the one MatMul it feeds
            graph.node.insert(position, onnx.helper.make_node("DequantizeLinear", names, [matrix],
                                                              name=f"{node.name}_dq", axis=0, block_size=block))
    used = {name for node in graph.node for name in node.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)
    return model


def node_attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def integers_and_scales(node: onnx.NodeProto, inits: dict) -> tuple[onnx.TensorProto, onnx.TensorProto]:
    """A ``MatMulNBits`` node's matrix as signed integers ``[K, N]`` and their scales ``[blocks, N]``."""
    if len(node.input) > 3 and any(node.input[3:]):
        raise ValueError(f"{node.name}: MatMulNBits with zero points, group indices or a bias")
    attrs = node_attributes(node)
    k, n, bits = attrs["K"], attrs["N"], attrs["bits"]
    packed = numpy_helper.to_array(inits[node.input[1]])  # [N, blocks, bytes per block] of unsigned codes
    scales = numpy_helper.to_array(inits[node.input[2]]).reshape(n, -1)
    codes = packed.reshape(n, -1)
    if bits == 4:  # two codes a byte, the first in the low nibble
        codes = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(n, -1)
    signed = codes[:, :k].astype(np.int16) - (1 << (bits - 1))  # the implied zero point of a symmetric code
    name = node.input[1]
    stored = ml_dtypes.int4 if bits == 4 else np.int8
    weight = numpy_helper.from_array(np.ascontiguousarray(signed.T).astype(stored), f"{name}_q")
    scale = numpy_helper.from_array(np.ascontiguousarray(scales.T), f"{name}_scale")
    return weight, scale


def as_float(weight: onnx.TensorProto, scale: onnx.TensorProto, block: int) -> onnx.TensorProto:
    integers, scales = numpy_helper.to_array(weight).astype(np.float32), numpy_helper.to_array(scale)
    values = integers * np.repeat(scales, block, axis=0)[: integers.shape[0]]
    return numpy_helper.from_array(values, weight.name.removesuffix("_q") + "_f32")
