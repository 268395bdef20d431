"""``vvs-export --weights w8a8``: int8 weights per output channel times activations quantised to int8 per row, in
the graph, through ``MatMulInteger`` (:mod:`vvs.export.row_int8`).

What must hold: the rewrite computes exactly the integer arithmetic it claims (against numpy), a row's output is
bitwise the same alone and among 31 other rows (the property that lets an exact mode share a target between an
AR step and a many-position call), every weight matrix of the target's and the drafter's graphs is rewritten and
nothing else is, and the folder decodes with a top-1 agreement near float32's."""
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from conftest import SMALL, exported_once, run_cli
from vvs.engines import load_engines
from vvs.engines.manifest import read_manifest
from vvs.export.row_int8 import as_matmul_integer, channel_int8
from vvs.runtime.pipeline import Pipeline

K, N = 96, 40
TARGET = ("target_prefill", "target_verify")


def linear_graph(matrix: np.ndarray, swap: np.ndarray) -> onnx.ModelProto:
    """``(x @ matrix) @ swap``, ``matrix`` a weight and ``swap`` a constant that is not one."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="linear"),
         helper.make_node("MatMul", ["h", "swap"], ["y"], name="swap")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", N])],
        [numpy_helper.from_array(matrix, "W"), numpy_helper.from_array(swap, "swap")])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10))
    as_matmul_integer(model.graph, {"W": matrix, "swap": swap}.__getitem__, weights={"W"})
    return ir.to_proto(model)


@pytest.fixture(scope="module")
def rewritten():
    rng = np.random.default_rng(0)
    matrix = (rng.standard_normal((K, N)) / 10).astype(np.float32)
    matrix[:, 3] = 0  # a channel of zeros
    swap = np.eye(N, dtype=np.float32)[::-1].copy()
    model = linear_graph(matrix, swap)
    assert [n.op_type for n in model.graph.node].count("MatMulInteger") == 1
    assert sum(n.op_type == "MatMul" for n in model.graph.node) == 1  # the swap's
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]), matrix, swap


def test_the_rewrite_is_the_integer_arithmetic_it_claims(rewritten):
    """Per row: scale = max|x| / 127, codes = round(x / scale) in -127..127; per channel likewise on the weights;
    the product of the codes is exact in int32 and scaled back by both scales. A row of zeros gives zeros; the
    non-weight constant (the swap) is multiplied in float."""
    session, matrix, swap = rewritten
    x = np.random.default_rng(1).standard_normal((7, K)).astype(np.float32) * np.float32(3)
    x[2] = 0
    codes, scales = channel_int8(matrix)
    step = np.maximum(np.abs(x).max(-1, keepdims=True), np.float32(1e-30)) / np.float32(127)
    rows = np.clip(np.rint(x / step), -127, 127).astype(np.int64)
    expected = ((rows @ codes.astype(np.int64)).astype(np.float32) * step * scales) @ swap
    got = session.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, expected)
    assert not got[2].any()
    assert np.abs(got - (x @ matrix) @ swap).max() < 0.02 * np.abs(x @ matrix).max()


def test_a_row_is_bitwise_the_same_alone_and_among_31_others(rewritten):
    session = rewritten[0]
    among = np.random.default_rng(2).standard_normal((32, K)).astype(np.float32)
    for row in (0, 17, 31):
        alone = session.run(None, {"x": among[row:row + 1]})[0][0]
        assert np.array_equal(alone, session.run(None, {"x": among})[0][row]), row


def test_channel_codes_are_symmetric_with_positive_scales():
    values = np.array([[1.0, 0.0, -2.0], [-0.5, 0.0, 1.0]], np.float32)
    codes, scales = channel_int8(values)
    assert codes.dtype == np.int8 and scales.dtype == np.float32
    np.testing.assert_array_equal(codes, [[127, 0, -127], [-64, 0, 64]])
    np.testing.assert_allclose(scales, [1 / 127, 1.0, 2 / 127])


@pytest.fixture(scope="module")
def w8a8_folder(bundle_factory, tmp_path_factory):
    from vvs.discrete.exporter import export_folder

    return exported_once(tmp_path_factory, "tiny-weights-w8a8", lambda path: export_folder(
        bundle_factory(), path, decoding_defaults=SMALL, progress=False, weights="w8a8"))


def test_every_weight_of_target_and_drafter_is_multiplied_in_integers(w8a8_folder):
    """The target's and the drafter's stored weight matrices all become MatMulInteger over per-row codes; what
    stays a float MatMul by a stored matrix is RoPE's pair swap and the target's output head (one matrix, in the
    graphs with logits); the image decoder is untouched."""
    manifest = read_manifest(w8a8_folder)
    for name in (*TARGET, "draft_tree"):
        graph = onnx.load(str(w8a8_folder / manifest["graphs"][name]["file"]), load_external_data=False).graph
        stored = {i.name for i in graph.initializer}
        integer = [n for n in graph.node if n.op_type == "MatMulInteger"]
        floating = {n.input[1] for n in graph.node if n.op_type == "MatMul" and n.input[1] in stored}
        assert integer and not any(n.op_type == "MatMulNBits" for n in graph.node), name
        heads = {m for m in floating if "rope_swap" not in m}
        assert len(heads) == (1 if name in TARGET else 0), (name, floating)
        assert manifest["graphs"][name]["weights"] == "w8a8"
    assert manifest["graphs"]["vq_decode"]["weights"] == "fp32"


def test_a_position_is_bitwise_the_same_beside_other_images(w8a8_folder):
    """One image's guided AR steps through the folder's own graphs give the same logits, bit for bit, when three
    other images share the calls (bench/call_invariance.py's batch column)."""
    from bench.call_invariance import walk

    engines = load_engines(w8a8_folder, "onnxruntime", threads=1)
    conditions = torch.tensor([1, 4, 7, 9])
    tokens = Pipeline(engines).generate(conditions, mode="ar", temperature=0, decode_images=False).tokens
    alone = walk(engines, conditions[:1], tokens[:1], 1, 2.0)
    assert torch.equal(alone, walk(engines, conditions, tokens, 1, 2.0)[:1])


def test_top1_agreement_with_the_float32_target(w8a8_folder, tiny_folder):
    from tests.test_weight_only import top1_agreement

    agreement = top1_agreement(tiny_folder, {"w8a8": w8a8_folder}, [0, 1, 2, 3], cfg_scale=2.0)["w8a8"]
    print(f"w8a8 top-1 agreement with fp32 (tiny bundle): {agreement}")
    assert agreement >= 0.95


def test_tensorrt_builders_refuse_w8a8_in_one_line(tmp_path, capsys, monkeypatch, w8a8_folder):
    from vvs.cli.export import main
    from vvs.engines.tensorrt_build import BuildError, build_folder

    code, _, err = run_cli(main, ["--out", tmp_path / "f", "--weights", "w8a8", "--backend", "tensorrt-rtx"],
                           capsys, monkeypatch)
    assert code == 2 and err.strip().splitlines() == [
        "vvs-export: error: option --weights w8a8: ONNX Runtime's MatMulInteger, which tensorrt-rtx does not build; "
        "export it for --backend onnxruntime, or without it for tensorrt-rtx (which takes int4 or int4-head8)"]
    assert not (tmp_path / "f").exists()
    with pytest.raises(BuildError, match="target_prefill: its w8a8 weights are ONNX Runtime's MatMulInteger, which "
                                         "TensorRT-RTX does not build"):
        build_folder(w8a8_folder, "tensorrt-rtx")


def test_the_torch_models_read_back_from_a_w8a8_folder(w8a8_folder, bundle_factory):
    """A folder without torch weights gives the torch backend its target read back from the graphs: each weight
    matrix the int8 codes times their channel's scale, within half a code step of the original."""
    from vvs.discrete.folder_models import folder_target

    manifest = read_manifest(w8a8_folder)
    original = bundle_factory().target.state_dict()
    read = folder_target(w8a8_folder, manifest).state_dict()
    matrix = "layers.0.attention.wqkv.weight"
    step = original[matrix].abs().amax(1, keepdim=True) / 127
    assert not torch.equal(read[matrix], original[matrix])
    assert ((read[matrix] - original[matrix]).abs() <= step / 2 + 1e-7).all()
    assert torch.equal(read["output.weight"], original["output.weight"])  # the head stays float32
