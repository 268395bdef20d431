"""One copy of the weights on disk: every graph of a folder reads each distinct tensor from one file, at every
storage the exporter writes, and the torch backend reads the target and the drafter back from the graphs."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from vvs.export import onnx_export
from vvs.export.shared_weights import WEIGHTS_FILE, graph_parameters, share_weights, weight_bytes
from vvs.export.spec import GraphSpec, TensorSpec
from vvs.export.weight_only import as_float, integers_and_scales, node_attributes


class Stack(torch.nn.Module):
    def __init__(self, width: int = 64, depth: int = 3):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def export_twice(tmp_path, weights: str | None, monkeypatch):
    """The module traced twice, as a folder's prefill and verify graphs are: one external, one inline."""
    module = Stack().eval()
    shape = ("batch", "new", 64)  # a Linear of a 2-D input exports as Gemm, which the weight-only form leaves
    paths = []
    for name, external in (("a", True), ("b", False)):
        monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_BYTES", 0 if external else 1 << 30)
        spec = GraphSpec(name, (TensorSpec("x", "float32", shape),), (TensorSpec("y", "float32", shape),))
        paths.append(onnx_export.export_graph(module, spec, tmp_path / f"{name}.onnx", 2, 0, weights=weights)[0])
    return module, paths


def run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("weights", [None, "int8", "int4"])
def test_two_graphs_of_one_module_store_its_weights_once(tmp_path, weights, monkeypatch):
    module, paths = export_twice(tmp_path, weights, monkeypatch)
    x = np.random.default_rng(0).standard_normal((3, 2, 64)).astype(np.float32)
    before = [run(p, x) for p in paths]
    single = (tmp_path / "a.onnx.data").stat().st_size
    files = share_weights(tmp_path, paths)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "b.onnx", WEIGHTS_FILE]
    assert files == [*paths, tmp_path / WEIGHTS_FILE]
    assert (tmp_path / WEIGHTS_FILE).stat().st_size <= single  # the second graph's matrices added nothing
    stored = weight_bytes(tmp_path, ["a.onnx", "b.onnx"])  # with each graph's small inline tensors (biases)
    nodes = sum(onnx.load(str(p), load_external_data=False).graph.ByteSize() for p in paths)
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 1.1 * stored + nodes
    for path, want in zip(paths, before):
        np.testing.assert_array_equal(run(path, x), want)


@pytest.mark.parametrize("weights", [None, "int4"])
def test_a_module_is_read_back_from_its_graphs(tmp_path, weights, monkeypatch):
    module, paths = export_twice(tmp_path, weights, monkeypatch)
    share_weights(tmp_path, paths)
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    got = graph_parameters(tmp_path, ["b.onnx"], "", shapes)
    assert got.keys() == shapes.keys()
    for name, p in module.named_parameters():
        if weights is None or name.endswith("bias"):
            assert torch.equal(got[name], p.detach()), name
    if weights is not None:  # what the MatMulNBits multiplies by: the dequantised codes
        model = onnx.load(str(paths[0]))
        inits = {t.name: t for t in model.graph.initializer}
        node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
        dequantised = onnx.numpy_helper.to_array(as_float(*integers_and_scales(node, inits),
                                                         node_attributes(node)["block_size"]))
        name = node.input[1].rsplit("_Q", 1)[0]
        assert torch.equal(got[name], torch.from_numpy(dequantised.T.copy()))
        assert (got[name] - dict(module.named_parameters())[name]).abs().max() < 0.05


def test_a_folder_stores_its_target_once_and_runs_on_torch_from_its_graphs(tiny_folder):
    from vvs.discrete.folder_models import folder_drafter, folder_target
    from vvs.engines.manifest import TORCH_WEIGHTS, read_manifest
    from vvs.memory import folder_weight_bytes

    manifest = read_manifest(tiny_folder)
    assert WEIGHTS_FILE in manifest["files"]
    assert not {TORCH_WEIGHTS["target"], TORCH_WEIGHTS["drafter"]} & set(manifest["files"])
    weights = folder_weight_bytes(tiny_folder)
    graphs = sum(manifest["files"][f]["bytes"] for f in manifest["files"] if f.endswith(".onnx") or f == WEIGHTS_FILE)
    assert graphs <= 1.1 * weights, f"the graphs take {graphs / weights:.2f}x the bytes of their weights"
    target = folder_target(tiny_folder, manifest)
    assert folder_drafter(tiny_folder, manifest, target.config) is not None


def test_a_folder_exported_with_torch_weights_reads_them(bundle_factory, tmp_path):
    from vvs.discrete.folder_models import folder_target
    from vvs.discrete.exporter import export_folder
    from vvs.engines.manifest import TORCH_WEIGHTS

    bundle = bundle_factory()
    manifest = export_folder(bundle, tmp_path / "f", progress=False, torch_weights=True)
    assert {TORCH_WEIGHTS["target"], TORCH_WEIGHTS["drafter"]} <= set(manifest["files"])
    target = folder_target(tmp_path / "f", manifest)
    want = bundle.target.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in target.state_dict().items())


def test_an_int8_folder_without_torch_weights_says_how_to_get_them(tiny_int8_folder, tmp_path):
    from vvs.engines import load_engines
    from vvs.engines.manifest import TORCH_WEIGHTS
    from vvs.errors import VVSError

    folder = tmp_path / "int8"
    shutil.copytree(tiny_int8_folder, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    for name in ("target", "drafter"):  # as exported without --torch-weights
        (folder / TORCH_WEIGHTS[name]).unlink()
        del manifest["files"][TORCH_WEIGHTS[name]]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(VVSError, match="export the folder with --torch-weights"):
        load_engines(folder, "torch")
