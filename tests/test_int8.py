"""INT8: SmoothQuant W8A8 Q/DQ graphs on ONNX Runtime CPU against the fp32 reference."""
import onnx
import pytest
import torch
from onnx import numpy_helper

from conftest import SMALL
from vvs.engines import load_engines
from vvs.families.llamagen.exporter import export_folder
from vvs.families.llamagen.graphs import build_graphs
from vvs.export.spec import sample_inputs
from vvs.runtime.options import DecodeOptions


@pytest.fixture(scope="module")
def int8_folder(bundle_factory, tmp_path_factory):
    out = tmp_path_factory.mktemp("int8") / "eng"
    export_folder(bundle_factory(), out, precision="int8", decoding_defaults=SMALL, progress=False)
    return out


def test_qdq_graph_zero_points_are_int8(int8_folder):
    model = onnx.load(str(int8_folder / "target_verify.onnx"))
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    # GPT-tiny: 2 blocks x (wqkv, wo, w1, w3, w2) int8 weights; w1 and w3 share one activation quantizer
    weights = [n for n in qdq if n.op_type == "DequantizeLinear" and n.input[0] in constants]
    assert len(weights) == 2 * 5 and all(constants[n.input[0]].dtype.name == "int8" for n in weights)
    assert sum(n.op_type == "QuantizeLinear" for n in qdq) == 2 * 4
    for node in qdq:
        zp = constants[node.input[2]]
        assert zp.dtype.name == "int8" and not zp.any()
    drafter = onnx.load(str(int8_folder / "draft_tree.onnx"))
    assert not any(n.op_type == "QuantizeLinear" for n in drafter.graph.node)  # the drafter stays unquantized


def test_int8_logits_close_to_fp32(bundle_factory, int8_folder):
    """Per-tensor int8 activations round to absmax/254 and per-row weights to rowmax/254: about 0.4% relative
    noise per quantized matmul, ten of them in series in this model, so logits move by a few percent of their
    range. 5% of the largest logit, with ≥ 90% top-1 agreement, bounds that; a wrong scale, a uint8 zero point
    or a missing SmoothQuant compensation gives errors of order 100%."""
    bundle = bundle_factory()
    engines = load_engines(int8_folder, "onnxruntime", threads=1)
    spec = engines.graphs["target_verify"].spec
    cfg = bundle.target.config
    inputs = sample_inputs(spec, cfg.vocab_size, cfg.max_positions - 1, dict(batch=4, images=2, new=12, past=5))
    got = engines.graphs["target_verify"].run(**dict(zip(spec.input_names, inputs)))["logits"]
    with torch.no_grad():
        want = build_graphs(bundle.target, bundle.drafter, bundle.vq, DecodeOptions(**SMALL).tree)["target_verify"](*inputs)[0]
    assert (got - want).abs().max() <= 0.05 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    torch_int8 = load_engines(int8_folder, "torch").graphs["target_verify"].run(**dict(zip(spec.input_names, inputs)))
    # the same W8A8 + fp16 model in two runtimes: fp16 rounding differs, and where it moves an activation across
    # an int8 rounding boundary the error grows to a quantization step (measured: 0.5% of the largest logit)
    ref = torch_int8["logits"]
    assert (got - ref).abs().max() <= 0.01 * want.abs().max()
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
