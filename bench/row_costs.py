"""The cost of a call against its rows, per weight format and kernel, on this host.

A decoding mode's speed on a CPU is set by how a many-position call (a window, a tree, a verify) costs against a
one-position step; that is the kernel's, not the model's. This builds a stack of transformer-block matrices at
an official width (default Janus-Pro-1B: 2,048 wide, MLP 5,632; per layer q, k, v, o, gate, up, down, with a
norm between layers so values stay in range), writes it in every form vvs can run, and times one call per number
of rows. A guided AR step is 2 rows (conditional and unconditional), so costs are printed relative to a 2-row
call. The last column says whether a row's output is bitwise the same alone and among 31 other rows: the
property an exact mode needs of its target (a position's logits must not depend on the call).

Forms: float32; ONNX Runtime's ``MatMulNBits`` at int4 and int8 at accuracy levels 1 (float32 compute) and 4
(int8); ``w8a8`` (vvs's: int8 weights per channel, activations int8 per row through ``MatMulInteger``); its
signed-activation variant; int8 weights with per-tensor dynamic activations (``DynamicQuantizeMatMul``); static
Q/DQ int8; and OpenVINO (float32 arithmetic, as ``--backend openvino`` runs it) on the float32, the dequantise-form
int8 / int4 (OpenVINO compresses constant weights that reach a MatMul through a dequantisation) and the w8a8
stacks, plus the float32 stack in bf16 (OpenVINO's default on a CPU with bf16 units), where ``openvino`` is
installed.

Usage: python bench/row_costs.py [--layers 4] [--rows 1 2 4 8 16 32 64 128 256] [--forms ...] [--threads 2]
[--repeats 5] [--json F]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx_ir as ir  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from vvs.export.row_int8 import as_matmul_integer  # noqa: E402
from vvs.export.weight_only import as_matmul_nbits, dequantize_form  # noqa: E402
from vvs.tune import median_seconds  # noqa: E402

MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


def cpu() -> dict:
    """The CPU's model and the instruction sets that decide integer kernels."""
    info = {"model": platform.processor() or "unknown", "flags": []}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "model name" in fields:  # a VM's name hides the generation; family and model number tell it
        info["model"] = f"{fields['model name']} (family {fields.get('cpu family')}, model {fields.get('model')})"
    flags = set(fields.get("flags", "").split())
    info["flags"] = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16") if f in flags]
    return info


def stack(width: int, hidden: int, layers: int, seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    """The float32 stack and its matrices by name (``[K, N]``, as a MatMul multiplies)."""
    rng = np.random.default_rng(seed)
    arrays, nodes = {}, []
    shapes = {"q": (width, width), "k": (width, width), "v": (width, width), "o": (width, width),
              "gate": (width, hidden), "up": (width, hidden), "down": (hidden, width)}
    h = "x"
    for i in range(layers):
        for m in MATRICES:
            arrays[f"l{i}_{m}"] = (rng.standard_normal(shapes[m]) / np.sqrt(shapes[m][0])).astype(np.float32)
        n = f"l{i}_norm"
        nodes += [helper.make_node("RMSNormalization", [h, "ones"], [n], axis=-1, epsilon=1e-6)]
        for m in ("q", "k", "v"):
            nodes.append(helper.make_node("MatMul", [n, f"l{i}_{m}"], [f"l{i}_{m}_out"]))
        nodes += [helper.make_node("Sum", [f"l{i}_q_out", f"l{i}_k_out", f"l{i}_v_out"], [f"l{i}_attn"]),
                  helper.make_node("MatMul", [f"l{i}_attn", f"l{i}_o"], [f"l{i}_o_out"]),
                  helper.make_node("Add", [h, f"l{i}_o_out"], [f"l{i}_mid"]),
                  helper.make_node("RMSNormalization", [f"l{i}_mid", "ones"], [f"l{i}_norm2"], axis=-1, epsilon=1e-6),
                  helper.make_node("MatMul", [f"l{i}_norm2", f"l{i}_gate"], [f"l{i}_g"]),
                  helper.make_node("MatMul", [f"l{i}_norm2", f"l{i}_up"], [f"l{i}_u"]),
                  helper.make_node("Sigmoid", [f"l{i}_g"], [f"l{i}_gs"]),
                  helper.make_node("Mul", [f"l{i}_g", f"l{i}_gs"], [f"l{i}_silu"]),
                  helper.make_node("Mul", [f"l{i}_silu", f"l{i}_u"], [f"l{i}_gu"]),
                  helper.make_node("MatMul", [f"l{i}_gu", f"l{i}_down"], [f"l{i}_d"]),
                  helper.make_node("Add", [f"l{i}_mid", f"l{i}_d"], [f"l{i}_h"])]
        h = f"l{i}_h"
    nodes[-1].output[0] = "y"
    inits = [numpy_helper.from_array(a, name) for name, a in arrays.items()]
    inits.append(numpy_helper.from_array(np.ones(width, np.float32), "ones"))
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10), arrays


def rewritten(model: onnx.ModelProto, arrays: dict, rewrite) -> onnx.ModelProto:
    graph = ir.from_proto(model)
    rewrite(graph.graph, lambda name: arrays[name])
    return ir.to_proto(graph)


def signed_activations(model: onnx.ModelProto) -> onnx.ModelProto:
    """w8a8 with int8 activation codes (no zero point) instead of uint8 ones around 128."""
    for node in model.graph.node:
        if node.op_type == "Add" and "w8a8_zero_point" in node.input:
            node.op_type, node.input[:] = "Identity", [node.input[0]]
        if node.op_type == "Cast" and "_w8a8_cast" in node.name:
            node.attribute[0].i = TensorProto.INT8
        if node.op_type == "MatMulInteger":
            del node.input[2:]
    _drop_unused(model.graph)
    return model


def per_tensor(model: onnx.ModelProto, arrays: dict) -> onnx.ModelProto:
    """int8 weights per channel times activations quantised per call (ONNX Runtime fuses the pattern into
    ``DynamicQuantizeMatMul``)."""
    from vvs.export.row_int8 import channel_int8

    graph = model.graph
    for node in [n for n in graph.node if n.op_type == "MatMul"]:
        codes, scales = channel_int8(arrays[node.input[1]])
        w, s = node.input[1] + "_c", node.input[1] + "_s"
        graph.initializer.extend([numpy_helper.from_array(codes, w), numpy_helper.from_array(scales, s)])
        x, out = node.input[0], node.output[0]
        at = list(graph.node).index(node)
        graph.node.remove(node)
        new = [helper.make_node("DynamicQuantizeLinear", [x], [f"{out}_q", f"{out}_qs", f"{out}_qz"]),
               helper.make_node("MatMulInteger", [f"{out}_q", w, f"{out}_qz"], [f"{out}_i"]),
               helper.make_node("Cast", [f"{out}_i"], [f"{out}_f"], to=TensorProto.FLOAT),
               helper.make_node("Mul", [f"{out}_qs", s], [f"{out}_ss"]),
               helper.make_node("Mul", [f"{out}_f", f"{out}_ss"], [out])]
        for offset, n in enumerate(new):
            graph.node.insert(at + offset, n)
    _drop_unused(graph)
    return model


def static_qdq(model: onnx.ModelProto, arrays: dict) -> onnx.ModelProto:
    """Static Q/DQ int8: activations with one fixed scale per matrix (what a calibration gives), weights per
    channel."""
    from vvs.export.row_int8 import channel_int8

    graph = model.graph
    for node in [n for n in graph.node if n.op_type == "MatMul"]:
        codes, scales = channel_int8(arrays[node.input[1]])
        w, s = node.input[1] + "_c", node.input[1] + "_s"
        a_s, a_z, w_z = node.input[1] + "_as", node.input[1] + "_az", node.input[1] + "_wz"
        graph.initializer.extend([numpy_helper.from_array(codes, w), numpy_helper.from_array(scales, s),
                                  numpy_helper.from_array(np.float32(4.0 / 127), a_s),
                                  numpy_helper.from_array(np.int8(0), a_z),
                                  numpy_helper.from_array(np.zeros(len(scales), np.int8), w_z)])
        x, out = node.input[0], node.output[0]
        at = list(graph.node).index(node)
        graph.node.remove(node)
        new = [helper.make_node("QuantizeLinear", [x, a_s, a_z], [f"{out}_q"]),
               helper.make_node("DequantizeLinear", [f"{out}_q", a_s, a_z], [f"{out}_dq"]),
               helper.make_node("DequantizeLinear", [w, s, w_z], [f"{out}_w"], axis=1),
               helper.make_node("MatMul", [f"{out}_dq", f"{out}_w"], [out])]
        for offset, n in enumerate(new):
            graph.node.insert(at + offset, n)
    _drop_unused(graph)
    return model


def _drop_unused(graph) -> None:
    used = {i for n in graph.node for i in n.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)


def forms(model: onnx.ModelProto, arrays: dict) -> dict:
    """Each form's model, built on demand (a 24-layer float32 stack is 5 GB)."""
    def w8a8(graph, read):
        as_matmul_integer(graph, read, arrays)

    def nbits(weights, level):
        return lambda: rewritten(model, arrays, lambda g, r: as_matmul_nbits(g, r, weights, level))

    built = {"fp32": lambda: model,
             "int4-acc4": nbits("int4", 4), "int4-acc1": nbits("int4", 1),
             "int8-acc4": nbits("int8", 4), "int8-acc1": nbits("int8", 1),
             "w8a8": lambda: rewritten(model, arrays, w8a8),
             "w8a8-signed": lambda: signed_activations(rewritten(model, arrays, w8a8)),
             "int8-per-tensor": lambda: per_tensor(_copy(model), arrays),
             "static-qdq": lambda: static_qdq(_copy(model), arrays)}
    try:
        import openvino  # noqa: F401
    except ImportError:
        return built
    built.update({"openvino-fp32": lambda: model, "openvino-bf16": lambda: model,
                  "openvino-int8": lambda: dequantize_form(nbits("int8", 4)()),
                  "openvino-int4": lambda: dequantize_form(nbits("int4", 4)()),
                  "openvino-w8a8": lambda: rewritten(model, arrays, w8a8)})
    return built


def _copy(model):
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    return copied


def runner(form: str, model: onnx.ModelProto, folder: Path, threads: int):
    """A function of ``x [rows, width]`` -> ``y``, on ONNX Runtime or OpenVINO."""
    path = folder / f"{form}.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location=f"{form}.data")
    if form.startswith("openvino"):
        import openvino as ov

        from vvs.engines.openvino_backend import compile_config

        config = compile_config(threads)  # float32 arithmetic, as --backend openvino runs
        if form == "openvino-bf16":  # what OpenVINO does by default on a CPU with bf16 units: not float32's values
            config["INFERENCE_PRECISION_HINT"] = "bf16"
        compiled = ov.Core().compile_model(str(path), "CPU", config)
        request = compiled.create_infer_request()
        return lambda x: request.infer({0: x})[0].copy()
    import onnxruntime as ort

    from vvs.engines.onnxruntime_backend import session_options

    session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"x": x})[0]


def measure(run, rows: list[int], width: int, repeats: int) -> tuple[dict, bool]:
    rng = np.random.default_rng(1)
    costs = {r: median_seconds(lambda r=r: run(rng.standard_normal((r, width), dtype=np.float32)), repeats)
             for r in rows}
    among = rng.standard_normal((32, width), dtype=np.float32)
    alone = run(among[:1].copy())
    return costs, bool(np.array_equal(alone[0], run(among)[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=5632)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--forms", nargs="+", default=None, help="default: every form this host can run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    host = cpu()
    print(f"host: {host['model']}; {', '.join(host['flags']) or 'no AVX2'}; {args.threads} threads; "
          f"{args.layers} layers of {len(MATRICES)} matrices, width {args.width}, MLP {args.hidden}")
    model, arrays = stack(args.width, args.hidden, args.layers)
    built = forms(model, arrays)
    chosen = args.forms or list(built)
    unknown = [f for f in chosen if f not in built]
    if unknown:
        sys.exit(f"row_costs.py: error: no form {', '.join(unknown)}; choose from {', '.join(built)}")
    results = {}
    print(f"{'form':<18}{'2 rows ms':>10}" + "".join(f"{r:>7}" for r in args.rows) + "  row alone = among 32")
    with tempfile.TemporaryDirectory() as tmp:
        for form in chosen:
            run = runner(form, built[form](), Path(tmp), args.threads)
            costs, invariant = measure(run, args.rows, args.width, args.repeats)
            base = costs.get(2) or costs[min(costs)]
            results[form] = {"seconds": costs, "invariant": invariant}
            print(f"{form:<18}{base * 1e3:>10.1f}" + "".join(f"{costs[r] / base:>6.2f}x" for r in args.rows)
                  + f"  {'bitwise' if invariant else 'differs'}", flush=True)
            del run
    if args.json:
        args.json.write_text(json.dumps({"host": host, "args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
