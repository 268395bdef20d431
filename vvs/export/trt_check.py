"""Static checks that an ONNX graph is something TensorRT 11's ONNX parser takes.

Checked here (so that CI, which has no TensorRT, catches regressions):
- every operator is in the parser's supported set (the subset vvs graphs can reasonably contain);
- no control flow (``If``/``Loop``/``Scan``): TensorRT cannot parse attention inside an ``If`` (NVIDIA/TensorRT#4739);
- ``Attention`` nodes have a single output (past/present outputs fail to import, NVIDIA/TensorRT#4738);
- ``TopK``'s ``K`` is a constant;
- Q/DQ nodes carry int8 zero points of 0 (TensorRT supports symmetric quantization only; a missing zero point
  means uint8).
"""
from __future__ import annotations

import onnx
from onnx import numpy_helper

SUPPORTED_OPS = frozenset("""
Abs Add And ArgMax ArgMin Attention Cast Ceil Clip Concat Constant ConstantOfShape Conv Cos CumSum
DequantizeLinear Div Einsum Equal Erf Exp Expand Flatten Floor Gather GatherElements GatherND Gemm Greater
GreaterOrEqual GroupNormalization Identity InstanceNormalization IsNaN LayerNormalization Less LessOrEqual Log
LogSoftmax MatMul Max Mean Min Mod Mul Neg Not Or Pad Pow QuantizeLinear RMSNormalization Range Reciprocal
ReduceL2 ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize RotaryEmbedding
ScatterElements ScatterND Shape Sigmoid Sign Sin Size Slice Softmax Split Sqrt Squeeze Sub Sum Tanh Tile TopK
Transpose Trilu Unsqueeze Where Xor
""".split())
CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def tensorrt_problems(model: onnx.ModelProto) -> list[str]:
    """Human-readable problems; empty when the graph should parse."""
    problems = []
    constants = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            constants[node.output[0]] = next((a.t for a in node.attribute if a.name == "value"), None)
    for node in model.graph.node:
        where = f"{node.op_type} node {node.name or node.output[0]!r}"
        if node.op_type in CONTROL_FLOW:
            problems.append(f"{where}: control flow is not supported around attention")
        elif node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED_OPS:
            problems.append(f"{where}: operator {node.domain + '::' if node.domain else ''}{node.op_type} "
                            "is not in TensorRT 11's ONNX parser")
        if node.op_type == "Attention" and len([o for o in node.output if o]) != 1:
            problems.append(f"{where}: Attention must have a single output (no past/present outputs)")
        if node.op_type == "TopK" and node.input[1] not in constants:
            problems.append(f"{where}: K must be a constant")
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            zp = node.input[2] if len(node.input) > 2 and node.input[2] else None
            if zp is None or zp not in constants:
                problems.append(f"{where}: needs an explicit int8 zero point (a missing one means uint8)")
            else:
                value = numpy_helper.to_array(constants[zp])
                if value.dtype.name != "int8" or value.any():
                    problems.append(f"{where}: zero point must be int8 zeros, got {value.dtype.name}")
    return problems
