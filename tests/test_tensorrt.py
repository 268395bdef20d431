"""TensorRT builder and backend logic, against ``fake_tensorrt`` because TensorRT cannot be installed here (its
builder libraries are not on PyPI). The stand-in keeps only the TensorRT 11 API, enforces profiles on every
``set_input_shape``, parses with TensorRT's operator rules, and executes through ONNX Runtime at the bound
addresses — so what passes here is the binding, profile and build logic, not TensorRT's kernels."""
import ast
import shutil
from pathlib import Path

import pytest
import torch

import fake_tensorrt
from vvs.engines.buckets import buckets
from vvs.engines.manifest import read_manifest
from vvs.engines.tensorrt_backend import load_tensorrt
from vvs.engines.tensorrt_build import BuildError, build_folder, shape_ranges
from vvs.engines import load_engines
from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline

TRT_SOURCES = [Path(__file__).parent.parent / "vvs/engines" / f for f in ("tensorrt_build.py", "tensorrt_backend.py")]


@pytest.fixture(scope="module")
def built(tiny_folder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("trt") / "eng"
    shutil.copytree(tiny_folder, folder)
    build_folder(folder, max_images=4, trt=fake_tensorrt)
    return folder


def test_profiles_cover_every_bucket_the_runtime_requests(built):
    manifest = read_manifest(built)
    opts = DecodeOptions.from_dict(manifest["decoding_defaults"])
    c = manifest["model"]["target"]["cls_token_num"]
    for name in ("target_verify", "drafter_step"):
        profiles = shape_ranges(manifest, name, 4)
        news = sorted(p["input_ids"][1][1] for p in profiles)
        assert news == buckets(name, c, opts)
        assert opts.tree_size + opts.max_path_tokens in buckets("target_verify", c, opts)
    assert set(manifest["tensorrt"]["engines"]) == {"target_prefill", "target_verify", "drafter_step", "vq_decode"}
    assert manifest["tensorrt"]["version"] == fake_tensorrt.__version__
    assert all(e["file"] in manifest["files"] for e in manifest["tensorrt"]["engines"].values())


@pytest.mark.parametrize("mode", ["ar", "sd", "vvs"])
def test_tensorrt_backend_tokens_equal_onnxruntime(built, mode):
    trt_engines = load_tensorrt(built, "cpu", trt=fake_tensorrt)
    classes = torch.tensor([1, 6])
    a = Pipeline(trt_engines).generate(classes, mode=mode, temperature=0, cfg_scale=2.0, skip_interval=2)
    b = Pipeline(load_engines(built, "onnxruntime", threads=1)).generate(classes, mode=mode, temperature=0,
                                                                         cfg_scale=2.0, skip_interval=2)
    assert torch.equal(a.tokens, b.tokens)
    executed = {profile for kind, path, profile in fake_tensorrt.calls if kind == "execute_async_v3"
                and path.endswith("target_verify.onnx")}
    assert executed  # verify ran, within a declared profile (the stand-in raises otherwise)


REMOVED_IN_TRT11 = {"FP16", "INT8", "BF16", "FP8", "INT4", "FP4", "OBEY_PRECISION_CONSTRAINTS",
                    "PREFER_PRECISION_CONSTRAINTS", "int8_calibrator", "IInt8Calibrator", "IInt8EntropyCalibrator2",
                    "CalibrationAlgoType", "set_calibration_profile", "set_quantization_flag",
                    "platform_has_fast_fp16", "platform_has_fast_int8", "IAlgorithmSelector", "execute_async_v2",
                    "get_binding_index"}


def test_no_removed_tensorrt_api_is_used():
    for path in TRT_SOURCES:
        used = {n.attr if isinstance(n, ast.Attribute) else n.id
                for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Attribute, ast.Name))}
        assert not used & REMOVED_IN_TRT11, f"{path.name} uses {used & REMOVED_IN_TRT11}"
    assert not hasattr(fake_tensorrt.BuilderFlag, "FP16") and not hasattr(fake_tensorrt, "IInt8EntropyCalibrator2")


def test_int8_engines_only_from_qdq_graphs(tiny_folder, tmp_path):
    import json

    folder = tmp_path / "eng"
    shutil.copytree(tiny_folder, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["precision"] = "int8"  # claims int8, but the graphs carry no Q/DQ
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BuildError, match="target_prefill: an int8 engine needs a Q/DQ graph"):
        build_folder(folder, trt=fake_tensorrt)


def test_failed_build_names_the_graph_and_the_reason(tiny_folder, tmp_path, monkeypatch):
    folder = tmp_path / "eng"
    shutil.copytree(tiny_folder, folder)
    monkeypatch.setattr(fake_tensorrt.OnnxParser, "parse_from_file",
                        lambda self, path: self.errors.append("Attention: unsupported mask type") or False)
    with pytest.raises(BuildError) as err:
        build_folder(folder, trt=fake_tensorrt)
    assert str(err.value) == "target_prefill: TensorRT could not parse target_prefill.onnx: Attention: unsupported mask type"


def test_version_mismatch_is_a_clear_error(built, monkeypatch):
    from vvs.engines.manifest import EngineFolderError

    monkeypatch.setattr(fake_tensorrt, "__version__", "11.5.0")
    with pytest.raises(EngineFolderError, match="built with TensorRT 11.4.0.106 but 11.5.0 is installed"):
        load_tensorrt(built, "cpu", trt=fake_tensorrt)
