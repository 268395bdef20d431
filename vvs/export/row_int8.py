"""w8a8: a graph's constant matrices as int8 per output channel, multiplied by activations quantised to int8 per
row, in the graph, through the standard ``MatMulInteger``.

Why per row: a row's codes and scale then depend on that row alone, and an integer product is exact, so a
position's output is bitwise the same whether its call carries one row or a window of them. A per-tensor scale
(ONNX Runtime's ``DynamicQuantizeMatMul``) is a little faster but makes each row's output depend on its
neighbours: the target would change between an AR step and a verify, and no mode could be exact.

Why ``MatMulInteger``: on CPUs with AVX-512 VNNI or AMX its cost grows slowly with the rows of a call (a 32-row
call about 1.3 two-row calls on a Xeon with AMX, against 4-7 for int4 ``MatMulNBits``), which is what makes a
window or a tree cost about one step. The activations go in as uint8 with a zero point of 128 (the u8 x s8 form
every x86 integer kernel has); ``bench/row_costs.py`` measures it beside the other forms.
"""
from __future__ import annotations

from collections.abc import Callable, Container

import numpy as np
import onnx_ir as ir
from onnx_ir import convenience

from vvs.export.weight_only import output_head, stored_matmuls

LEVELS = 127  # symmetric codes -127..127: -128 is never used, so negating a code cannot overflow
ZERO_POINT = 128  # of the uint8 activation codes
TINY = np.float32(1e-30)  # a row of zeros gets codes of zero, not a division by zero
CODES, SCALES = "_w8_codes", "_w8_scales"  # a matrix's initialisers: its name and these


def as_matmul_integer(graph: ir.Graph, read: Callable[[str], np.ndarray], weights: Container[str]) -> None:
    """Rewrite each MatMul of ``graph`` by a stored matrix named in ``weights`` (an initialiser ``[K, N]``, or the
    transpose of one ``[N, K]``) as per-row activation codes -> ``MatMulInteger`` -> int32 -> float, times the
    row's and the channel's scales. Other constant matrices stay float: RoPE's pair swap only moves and negates
    elements, and quantising its input would add error for nothing. So does the output head of a graph with
    logits (:func:`~vvs.export.weight_only.output_head`): its error moves every logit directly and guidance
    multiplies it, and it is a small share of a 1B-7B target (Janus-Pro-7B: 67M of 7B). An activation several matrices multiply (the
    query, key and value projections) is quantised once. ``read(name)`` gives an initialiser's float32 values,
    only as the file is written."""
    head = output_head(graph)
    rows: dict[str, tuple[ir.Value, ir.Value]] = {}  # activation name -> (codes, scale)
    matrices: dict[str, tuple[ir.Value, ir.Value]] = {}  # matrix name -> (int8 codes [K, N], scales [N])
    for node, matrix, transpose in stored_matmuls(graph):
        if matrix.name not in weights or node in head:
            continue
        x = node.inputs[0]
        if x.name not in rows:
            rows[x.name] = _row_codes(graph, node, x)
        if matrix.name not in matrices:
            matrices[matrix.name] = _channel_codes(graph, matrix, read, transpose is not None)
        codes, scale = rows[x.name]
        weight, channel_scale = matrices[matrix.name]
        new = _dequantised_product(graph, node, codes, scale, weight, channel_scale)
        convenience.replace_nodes_and_values(graph, node, [node], new, node.outputs, new[-1].outputs)
        if transpose is not None and not transpose.outputs[0].uses():
            graph.remove(transpose, safe=True)
    for name in matrices:
        if not graph.initializers[name].uses():
            graph.initializers.pop(name)


def _constant(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    if name not in graph.initializers:
        tensor = ir.Tensor(array, name=name)
        graph.register_initializer(ir.Value(name=name, shape=tensor.shape, type=ir.TensorType(tensor.dtype),
                                            const_value=tensor))
    return graph.initializers[name]


def _row_codes(graph: ir.Graph, before: ir.Node, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """uint8 codes of ``x`` and each row's scale ``[..., 1]``: the row's largest magnitude is code 127 away from
    the zero point."""
    last = _constant(graph, "w8a8_last_axis", np.array([-1], np.int64))
    levels = _constant(graph, "w8a8_levels", np.float32(LEVELS))
    low, high = _constant(graph, "w8a8_low", np.float32(-LEVELS)), _constant(graph, "w8a8_high", np.float32(LEVELS))
    zero = _constant(graph, "w8a8_zero_point", np.float32(ZERO_POINT))
    tiny = _constant(graph, "w8a8_tiny", TINY)
    nodes = []

    def op(kind: str, *inputs: ir.Value, **attributes) -> ir.Value:
        attrs = [ir.AttrInt64(key, value) for key, value in attributes.items()]
        nodes.append(ir.Node("", kind, list(inputs), attrs, name=f"{x.name}_w8a8_{kind.lower()}_{len(nodes)}"))
        return nodes[-1].outputs[0]

    largest = op("ReduceMax", op("Abs", x), last, keepdims=1)
    scale = op("Div", op("Max", largest, tiny), levels)
    codes = op("Cast", op("Add", op("Clip", op("Round", op("Div", x, scale)), low, high), zero),
               to=ir.DataType.UINT8)
    graph.insert_before(before, nodes)
    return codes, scale


def _channel_codes(graph: ir.Graph, matrix: ir.Value, read, transposed: bool) -> tuple[ir.Value, ir.Value]:
    """``matrix`` as int8 codes ``[K, N]`` and one positive scale per output channel ``[N]``, computed together
    when the first of them is written."""
    k, n = reversed(matrix.shape) if transposed else matrix.shape
    done: dict[str, np.ndarray] = {}

    def quantise(part: str) -> ir.Tensor:
        if part not in done:
            values = read(matrix.name)
            done["codes"], done["scales"] = channel_int8(values.T if transposed else values)
        return ir.Tensor(done.pop(part), name=matrix.name + names[part])

    names = {"codes": CODES, "scales": SCALES}
    values = []
    for part, dtype, shape in (("codes", ir.DataType.INT8, (k, n)), ("scales", ir.DataType.FLOAT, (n,))):
        lazy = ir.LazyTensor(lambda part=part: quantise(part), dtype=dtype, shape=ir.Shape(shape),
                             name=matrix.name + names[part])
        value = ir.Value(name=lazy.name, shape=lazy.shape, type=ir.TensorType(dtype), const_value=lazy)
        graph.register_initializer(value)
        values.append(value)
    return values[0], values[1]


def channel_int8(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values [K, N]`` as symmetric int8 codes ``[K, N]`` and positive scales ``[N]`` (a column of zeros: 1)."""
    values = np.asarray(values, dtype=np.float32)
    largest = np.abs(values).max(0)
    scales = np.where(largest == 0, 1, largest / LEVELS).astype(np.float32)
    codes = np.clip(np.rint(values / scales), -LEVELS, LEVELS).astype(np.int8)
    return np.ascontiguousarray(codes), scales


def _dequantised_product(graph: ir.Graph, node: ir.Node, codes, scale, weight, channel_scale) -> list[ir.Node]:
    zero_point = _constant(graph, "w8a8_zero_point_u8", np.uint8(ZERO_POINT))
    name = node.name or node.outputs[0].name
    product = ir.Node("", "MatMulInteger", [codes, weight, zero_point], name=f"{name}_int")
    as_float = ir.Node("", "Cast", [product.outputs[0]], [ir.AttrInt64("to", ir.DataType.FLOAT)], name=f"{name}_float")
    per_row = ir.Node("", "Mul", [as_float.outputs[0], scale], name=f"{name}_row_scale")
    per_channel = ir.Node("", "Mul", [per_row.outputs[0], channel_scale], name=f"{name}_channel_scale")
    return [product, as_float, per_row, per_channel]
