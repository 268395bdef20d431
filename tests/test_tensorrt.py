"""TensorRT: every graph of every precision through the real TensorRT-RTX builder (it builds without a GPU), and
the backend's binding, profile and runtime-cache logic run against ``fake_tensorrt`` — a runtime stand-in that
executes the real plans' source graphs with ONNX Runtime, because executing a plan needs a GPU."""
import hashlib
import json
import shutil

import pytest
import torch

import fake_tensorrt
from conftest import SMALL, exported_once
from vvs.discrete.engines import load_tensorrt
from vvs.discrete.exporter import export_folder
from vvs.engines import load_engines
from vvs.engines.buckets import buckets
from vvs.engines.manifest import EngineFolderError, graph_spec, read_manifest
from vvs.engines.tensorrt_build import BuildError, build_folder, shape_ranges
from vvs.errors import VVSError
from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline

trt = pytest.importorskip("tensorrt_rtx", reason="the test set-up installs tensorrt-rtx-cu13 from PyPI")

GRAPHS = ("target_prefill", "target_verify", "draft_tree", "vq_decode")
TRT_TYPES = {"float32": "FLOAT", "float16": "HALF", "int64": "INT64", "bool": "BOOL"}


SHARED_EXPORTS = {"fp32": "tiny_folder", "int8": "tiny_int8_folder"}  # the other tests' folders of the same model


@pytest.fixture(scope="module", params=["fp32", "fp16", "int8"])
def built(request, bundle_factory, tmp_path_factory):
    """An engine folder of the small random model at one precision, built for two GPU generations."""
    def build(folder):
        if request.param in SHARED_EXPORTS:
            shutil.copytree(request.getfixturevalue(SHARED_EXPORTS[request.param]), folder)
        else:
            export_folder(bundle_factory(), folder, precision=request.param, decoding_defaults=SMALL, progress=False)
        build_folder(folder, "tensorrt-rtx", max_images=4, compute_capabilities=[(8, 6), (12, 0)])

    return exported_once(tmp_path_factory, f"trt-{request.param}", build)


def network_io(onnx_path) -> dict[str, tuple[str, int]]:
    """What the TensorRT network built from a graph takes and returns: name -> (dtype, rank)."""
    from vvs.engines.tensorrt_build import FLAVOURS, polygraphy_trt

    ptrt = polygraphy_trt(FLAVOURS["tensorrt-rtx"])
    builder, network, parser = ptrt.NetworkFromOnnxPath(str(onnx_path))()
    tensors = [network.get_input(i) for i in range(network.num_inputs)]
    tensors += [network.get_output(i) for i in range(network.num_outputs)]
    return {t.name: (t.dtype.name, len(t.shape)) for t in tensors}


def test_every_graph_builds_and_is_recorded(built):
    manifest = read_manifest(built)
    record = manifest["tensorrt-rtx"]
    assert record["version"] == trt.__version__ and record["compute_capabilities"] == ["8.6", "12.0"]
    assert set(record["engines"]) == set(GRAPHS)
    for name, entry in record["engines"].items():
        plan = built / entry["file"]
        assert plan.stat().st_size > 10_000, f"{name}: suspiciously small plan"
        assert manifest["files"][entry["file"]]["sha256"] == hashlib.sha256(plan.read_bytes()).hexdigest()
        spec = graph_spec(manifest, name)
        io = network_io(built / manifest["graphs"][name]["file"])
        declared = {t.name: (TRT_TYPES[t.dtype], len(t.shape)) for t in (*spec.graph_inputs, *spec.outputs)}
        assert io == declared, f"{name}: the network's I/O differs from the spec"
        assert [len(p) for p in entry["profiles"]] == [len(spec.graph_inputs)] * len(entry["profiles"])


@pytest.mark.parametrize("fixture, family", [("janus_int8_folder", "janus-pro"), ("lumina_folder", "lumina-mgpt"),
                                             ("lumina_fp16_folder", "lumina-mgpt"),
                                             ("lumina_int8_folder", "lumina-mgpt")])
def test_a_prompt_family_folder_builds(request, fixture, family, tmp_path):
    """The prompt-id families' graphs through the same builder, with the network I/O their specs declare: Janus-Pro
    (an MLP head, a drafter that mixes guided logits) as SmoothQuant W8A8 Q/DQ layers in half precision; Lumina-mGPT
    (the joint vocabulary's embedding gathered by stream id, the head's stream rows, Chameleon's query/key norms and
    VQGAN) in fp32, fp16 and int8."""
    folder = tmp_path / family
    shutil.copytree(request.getfixturevalue(fixture), folder)
    build_folder(folder, "tensorrt-rtx", max_images=2)
    manifest = read_manifest(folder)
    assert manifest["model"]["family"] == family and set(manifest["tensorrt-rtx"]["engines"]) == set(GRAPHS)
    for name in GRAPHS:
        spec = graph_spec(manifest, name)
        declared = {t.name: (TRT_TYPES[t.dtype], len(t.shape)) for t in (*spec.graph_inputs, *spec.outputs)}
        assert network_io(folder / manifest["graphs"][name]["file"]) == declared, name


def test_profiles_cover_every_bucket_the_runtime_requests(built):
    manifest = read_manifest(built)
    opts = DecodeOptions.from_dict(manifest["decoding_defaults"])
    c = manifest["model"]["target"]["cls_token_num"]
    for name in ("target_verify", "draft_tree"):
        news = sorted(p["input_ids"][1][1] for p in shape_ranges(manifest, name, 4))
        assert news == buckets(name, c, opts)
    assert opts.tree_size + opts.max_path_tokens in buckets("target_verify", c, opts)


@pytest.fixture
def runnable(built, tmp_path, monkeypatch):
    """The built folder, with the stand-in runtime taught which ONNX graph each real plan came from."""
    folder = tmp_path / "eng"
    shutil.copytree(built, folder)
    manifest = read_manifest(folder)
    for name, entry in manifest["tensorrt-rtx"]["engines"].items():
        digest = hashlib.sha256((folder / entry["file"]).read_bytes()).hexdigest()
        fake_tensorrt.plans[digest] = {"onnx": str(folder / manifest["graphs"][name]["file"]),
                                       "profiles": entry["profiles"]}
    monkeypatch.setattr(fake_tensorrt, "__version__", trt.__version__)
    return folder


FP32_ONLY = pytest.mark.parametrize("built", ["fp32"], indirect=True)  # one precision is enough for the runtime logic


@FP32_ONLY
@pytest.mark.parametrize("mode", ["ar", "sd", "vvs"])
def test_backend_tokens_equal_onnxruntime(runnable, mode):
    fake_tensorrt.calls.clear()
    engines = load_tensorrt(runnable, "cpu", backend="tensorrt-rtx", trt=fake_tensorrt)
    opts = dict(mode=mode, temperature=0, cfg_scale=2.0, **({"skip_interval": 2} if mode == "vvs" else {}))
    classes = torch.tensor([1, 6, 3])
    a = Pipeline(engines).generate(classes, **opts)
    b = Pipeline(load_engines(runnable, "onnxruntime", threads=1)).generate(classes, **opts)
    assert torch.equal(a.tokens, b.tokens)
    assert any(kind == "execute_async_v3" and path.endswith("target_verify.onnx")
               for kind, path, _ in fake_tensorrt.calls)
    assert all(with_cache for kind, _, with_cache in fake_tensorrt.calls if kind == "create_execution_context")
    engines.close()  # what TensorRT-RTX specialised for this GPU is kept for the next load
    assert (runnable / "tensorrt-rtx" / "runtime.cache").read_bytes().endswith(b"+specialised")


@FP32_ONLY
def test_wrong_flavour_or_version_says_rebuild(runnable, monkeypatch):
    with pytest.raises(EngineFolderError) as err:
        load_tensorrt(runnable, "cpu", backend="tensorrt", trt=fake_tensorrt)
    assert "holds no TensorRT engines (it has TensorRT-RTX engines (--backend tensorrt-rtx))" in str(err.value)
    monkeypatch.setattr(fake_tensorrt, "__version__", "9.9.9")
    with pytest.raises(EngineFolderError) as err:
        load_tensorrt(runnable, "cpu", backend="tensorrt-rtx", trt=fake_tensorrt)
    assert f"built with TensorRT-RTX {trt.__version__} but 9.9.9 is installed; rebuild them" in str(err.value)


@FP32_ONLY
def test_a_plan_from_elsewhere_is_refused(runnable):
    manifest = read_manifest(runnable)
    entry = manifest["tensorrt-rtx"]["engines"]["vq_decode"]
    fake_tensorrt.plans.pop(hashlib.sha256((runnable / entry["file"]).read_bytes()).hexdigest())
    with pytest.raises(EngineFolderError, match="could not deserialize it .* rebuild the engines"):
        load_tensorrt(runnable, "cpu", backend="tensorrt-rtx", trt=fake_tensorrt)


def test_int8_engines_only_from_qdq_graphs(tiny_folder, tmp_path):
    folder = tmp_path / "eng"
    shutil.copytree(tiny_folder, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["precision"] = "int8"  # claims int8, but the graphs carry no Q/DQ
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BuildError, match="target_prefill: an int8 engine needs a Q/DQ graph"):
        build_folder(folder, "tensorrt-rtx")


def test_a_graph_the_builder_rejects_names_the_graph(tiny_folder, tmp_path):
    import onnx

    folder = tmp_path / "eng"
    shutil.copytree(tiny_folder, folder)
    path = folder / "vq_decode.onnx"
    model = onnx.load(str(path))
    model.graph.node[0].op_type = "NoSuchOp"
    onnx.save(model, str(path))
    manifest = json.loads((folder / "manifest.json").read_text())
    from vvs.engines.manifest import file_record

    manifest["files"]["vq_decode.onnx"] = file_record(path)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BuildError, match="^vq_decode: TensorRT-RTX could not build vq_decode.onnx: "):
        build_folder(folder, "tensorrt-rtx")


def test_compute_capability_only_for_rtx():
    with pytest.raises(VVSError, match="only --backend tensorrt-rtx builds for chosen GPUs"):
        build_folder("nowhere", "tensorrt", compute_capabilities=[(8, 9)])
