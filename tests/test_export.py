"""ONNX export, the engine folder and the ONNX Runtime backend, against the torch reference."""
import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from conftest import SMALL
from vvs.discrete.graphs import build_graphs, graph_specs
from vvs.engines import load_engines
from vvs.engines.manifest import EngineFolderError
from vvs.export.onnx_export import export_graph
from vvs.export.spec import GraphSpec, sample_inputs
from vvs.files import umask
from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline

GRAPHS = ("target_prefill", "target_verify", "draft_tree", "vq_decode")


@pytest.fixture(scope="module")
def bundle(bundle_factory):
    return bundle_factory()


@pytest.fixture(scope="module")
def folder(tiny_folder):
    return tiny_folder


def torch_graphs(bundle):
    return build_graphs(bundle.target, bundle.drafter, bundle.vq, DecodeOptions(**SMALL).tree)


# shapes: AR step (new = 1), a full tree, a skipped chain + tree; short and long pasts
SHAPES = [dict(batch=2, images=1, new=1, past=3), dict(batch=2, images=1, new=12, past=5),
          dict(batch=6, images=3, new=16, past=17), dict(batch=3, images=3, new=4, past=2)]


@pytest.mark.parametrize("dims", SHAPES)
def test_every_graph_matches_torch_fp32(bundle, folder, dims):
    engines = load_engines(folder, "onnxruntime", threads=1)
    reference = torch_graphs(bundle)
    vocab, max_pos = bundle.target.config.vocab_size, bundle.target.config.max_positions - 1
    for name in GRAPHS:
        spec = engines.graphs[name].spec
        inputs = sample_inputs(spec, vocab, max_pos, dims)
        got = engines.graphs[name].run(**dict(zip(spec.input_names, inputs)))
        with torch.no_grad():
            want = reference[name](*inputs)
        want = want if isinstance(want, tuple) else (want,)
        for out_spec, w in zip(spec.outputs, want):
            g = got[out_spec.name]
            err = (g.float() - w.float()).abs()
            finite = torch.isfinite(w.float())
            assert torch.equal(finite, torch.isfinite(g.float())), f"{name}.{out_spec.name}"
            assert err[finite].max() <= 1e-4, f"{name}.{out_spec.name}: {err[finite].max()}"


def test_fp16_verify_graph_within_half_precision_error(bundle, tmp_path):
    """fp16 weights and activations (RMSNorm, RoPE and logits in fp32): each of the ~10 matmuls rounds to 11
    significant bits (relative 5e-4), so logits of magnitude ~10 carry ~1e-2 error; 5e-2 leaves room without
    hiding a real bug (a wrong mask or position moves logits by O(1))."""
    import copy

    from vvs.models.layers import cast_floating

    half = copy.deepcopy(bundle)
    graph = cast_floating(torch_graphs(half)["target_verify"], torch.float16)
    cfg = bundle.target.config
    spec = graph_specs(cfg, bundle.drafter.config, bundle.vq.config, DecodeOptions(**SMALL).tree, "float16")["target_verify"]
    path = tmp_path / "verify16.onnx"
    export_graph(graph, spec, path, cfg.vocab_size, cfg.max_positions - 1)
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = sample_inputs(spec, cfg.vocab_size, cfg.max_positions - 1, SHAPES[2])
    got = session.run(None, {n: t.numpy() for n, t in spec.graph_feeds(dict(zip(spec.input_names, inputs))).items()})
    fp32 = [t.float() if t.is_floating_point() else t for t in inputs]
    with torch.no_grad():
        want = torch_graphs(bundle)["target_verify"](*fp32)
    assert np.abs(got[0] - want[0].numpy()).max() < 5e-2
    assert np.abs(got[1].astype(np.float32) - want[1].numpy()).max() < 5e-2


def test_graphs_pass_the_onnx_checker_with_caches_as_inputs(bundle, folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    for name in GRAPHS:
        model = onnx.load(str(folder / f"{name}.onnx"))
        onnx.checker.check_model(model, full_check=True)
        assert model.opset_import[0].version == 23
        # caches are inputs, never baked-in constants
        spec = GraphSpec.from_dict(manifest["graphs"][name]["spec"])
        if name in ("target_verify", "draft_tree"):
            # the target takes each layer's keys and values as inputs of their own (views of the runtime's buffer)
            kv = [f"past_kv.{i}.{j}" for i in range(bundle.target.config.n_layer) for j in (0, 1)] \
                if name == "target_verify" else ["past_kv"]
            inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
                      for i in model.graph.input}
            for piece in kv:
                assert inputs[piece][-4] == "batch" and inputs[piece][-2] == "past", (piece, inputs[piece])
        assert [i.name for i in model.graph.input] == [t.name for t in spec.graph_inputs]


def test_the_target_reads_each_layers_cache_where_it_lies(folder):
    """The verify graph takes the static buffer in pieces (one input per layer's keys or values); what the backends
    bind is each piece's place in the one buffer, not a copy, and the manifest keeps the spec's pieces."""
    spec = load_engines(folder, "onnxruntime").graphs["target_verify"].spec
    (kv,) = [t for t in spec.inputs if t.name == "past_kv"]
    assert kv.pieces == 2 and GraphSpec.from_dict(spec.to_dict()) == spec
    layers = kv.shape[0]
    buffer = torch.randn(layers, 2, 4, *kv.shape[3:4], 9, *kv.shape[5:])
    feeds = spec.graph_feeds({t.name: buffer if t is kv else torch.zeros(0) for t in spec.inputs})
    pieces = [name for name in feeds if name.startswith("past_kv")]
    assert pieces == [f"past_kv.{i}.{j}" for i in range(layers) for j in (0, 1)]
    for i in range(layers):
        for j in (0, 1):
            assert feeds[f"past_kv.{i}.{j}"].data_ptr() == buffer[i, j].data_ptr()
            assert feeds[f"past_kv.{i}.{j}"].is_contiguous()


def test_polygraphy_onnxrt_reproduces_torch_goldens(bundle, folder, tmp_path):
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult
    from polygraphy.json import save_json

    spec = load_engines(folder, "onnxruntime").graphs["target_verify"].spec
    cfg = bundle.target.config
    inputs = sample_inputs(spec, cfg.vocab_size, cfg.max_positions - 1, SHAPES[1])
    with torch.no_grad():
        outputs = torch_graphs(bundle)["target_verify"](*inputs)
    feed = {n: t.numpy() for n, t in spec.graph_feeds(dict(zip(spec.input_names, inputs))).items()}
    save_json([feed], tmp_path / "inputs.json")
    golden = RunResults()
    golden.append(("torch", [IterationResult({n: o.numpy() for n, o in zip(spec.output_names, outputs)},
                                             runner_name="torch")]))
    golden.save(str(tmp_path / "golden.json"))
    polygraphy = Path(sys.executable).with_name("polygraphy")
    proc = subprocess.run([str(polygraphy), "run", str(folder / "target_verify.onnx"), "--onnxrt",
                           "--load-inputs", str(tmp_path / "inputs.json"), "--load-outputs", str(tmp_path / "golden.json"),
                           "--atol", "1e-4", "--rtol", "1e-4"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "PASSED" in proc.stdout


@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_greedy_tokens_identical_on_torch_and_onnxruntime(folder, mode):
    classes = torch.tensor([1, 4, 7])
    runs = [Pipeline(load_engines(folder, b, threads=1)).generate(classes, mode=mode, seed=3, temperature=0,
                                                                   cfg_scale=2.0) for b in ("torch", "onnxruntime")]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert (runs[0].images - runs[1].images).abs().max() < 1e-4


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=1.0, top_p=0.8)])
def test_vvs_tokens_and_statistics_agree_between_backends(folder, sampling):
    def run(backend):
        gen = Pipeline(load_engines(folder, backend, threads=1)).generate(
            torch.tensor([2, 5]), mode="vvs", seed=1, cfg_scale=2.0, skip_interval=2, decode_images=False, **sampling)
        return gen.tokens, [{k: v for k, v in s.to_dict().items() if "seconds" not in k} for s in gen.stats]

    (tokens_t, stats_t), (tokens_o, stats_o) = run("torch"), run("onnxruntime")
    assert torch.equal(tokens_t, tokens_o)
    assert stats_t == stats_o and sum(s["skipped_verifications"] for s in stats_t) > 0


# --------------------------------------------------------------------------- broken folders


def broken_copy(folder, tmp_path):
    copy = tmp_path / "broken"
    shutil.copytree(folder, copy)
    return copy


def expect_folder_error(path, match):
    with pytest.raises(EngineFolderError) as err:
        load_engines(path, "onnxruntime")
    assert "\n" not in str(err.value)
    assert match in str(err.value)


def test_missing_file(folder, tmp_path):
    copy = broken_copy(folder, tmp_path)
    (copy / "draft_tree.onnx").unlink()
    expect_folder_error(copy, "draft_tree.onnx: missing from the engine folder")


def test_truncated_file(folder, tmp_path):
    copy = broken_copy(folder, tmp_path)
    data = (copy / "target_verify.onnx").read_bytes()
    (copy / "target_verify.onnx").write_bytes(data[: len(data) // 2])
    expect_folder_error(copy, "target_verify.onnx: ")


def test_edited_file(folder, tmp_path):
    copy = broken_copy(folder, tmp_path)
    data = bytearray((copy / "tables.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (copy / "tables.safetensors").write_bytes(bytes(data))
    expect_folder_error(copy, "tables.safetensors: contents differ from the manifest's sha256")


def test_mismatched_graph_even_with_a_consistent_manifest(folder, tmp_path):
    from vvs.engines.manifest import file_record

    copy = broken_copy(folder, tmp_path)
    shutil.copy(copy / "draft_tree.onnx", copy / "target_verify.onnx")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["target_verify.onnx"] = file_record(copy / "target_verify.onnx")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    expect_folder_error(copy, "target_verify.onnx: inputs")


def test_not_an_engine_folder(tmp_path):
    expect_folder_error(tmp_path, "manifest.json: missing")
    (tmp_path / "manifest.json").write_text("{not json")
    expect_folder_error(tmp_path, "not valid JSON")


def test_an_exported_folder_follows_the_umask(tiny_folder):
    """A folder exported by one account is served by another: folders and files get the modes the umask gives
    (the weights were 0600 and the folder 0700)."""
    mask = umask()
    for path in [tiny_folder, *tiny_folder.rglob("*")]:
        want = (0o777 if path.is_dir() else 0o666) & ~mask
        assert stat.S_IMODE(path.stat().st_mode) == want, f"{path}: {oct(stat.S_IMODE(path.stat().st_mode))}"


def test_a_quantised_drafter_runs_on_onnxruntime_and_changes_no_exact_token(bundle_factory, tmp_path):
    """``--drafter-weights int8``, the target left float32: every constant matrix of the draft_tree graph (the layer
    and the head) becomes ONNX Runtime's 8-bit MatMulNBits, in the folder's graph and in a tree graph exported later
    for another shape; greedy ``sd`` still decodes exactly the ``ar`` tokens. TensorRT-RTX (which builds int4, see
    tests/test_weight_only.py, whose int4 folders also cover the 4-bit drafter) and half precision refuse it in one
    line."""

    from vvs.discrete.exporter import export_folder
    from vvs.engines.tensorrt_build import BuildError, build_folder
    from vvs.errors import VVSError
    from vvs.runtime.options import TreeShape
    from vvs.runtime.pipeline import Pipeline

    weights, bits = "int8", 8
    bundle = bundle_factory()
    manifest = export_folder(bundle, tmp_path / "f", decoding_defaults=SMALL, progress=False, drafter_weights=weights)
    assert manifest["graphs"]["draft_tree"]["weights"] == weights
    engines = load_engines(tmp_path / "f", "onnxruntime")
    other = TreeShape(5, 2, 2)
    engines.draft_tree(other)
    graphs = [tmp_path / "f" / manifest["graphs"]["draft_tree"]["file"],
              *(tmp_path / "f" / "trees").glob(f"*{weights}.onnx")]
    assert len(graphs) == 2
    for path in graphs:
        graph = onnx.load(str(path)).graph
        weights_ = {i.name for i in graph.initializer}
        quantised = [n for n in graph.node if n.op_type == "MatMulNBits"]
        assert len(quantised) >= 8  # fc, q, k, v, o, gate, up, down, head: once per tree level
        assert {a.i for n in quantised for a in n.attribute if a.name == "bits"} == {bits}
        assert not any(n.op_type == "MatMul" and n.input[1] in weights_ for n in graph.node)
    pipe = Pipeline(engines)
    for tree in (None, other):
        shape = {} if tree is None else dict(tree_size=tree.tree_size, depth=tree.depth, draft_top_k=tree.draft_top_k)
        ar = pipe.generate([1, 3], mode="ar", temperature=0, cfg_scale=2.0, decode_images=False)
        sd = pipe.generate([1, 3], mode="sd", temperature=0, cfg_scale=2.0, decode_images=False, **shape)
        assert torch.equal(ar.tokens, sd.tokens)
    with pytest.raises(BuildError, match="its int8 weights .* export the folder with --drafter-weights fp32"):
        build_folder(tmp_path / "f", "tensorrt-rtx")
    with pytest.raises(VVSError, match=f"--drafter-weights {weights}: needs a drafter and --precision fp32"):
        export_folder(bundle, tmp_path / "g", precision="fp16", progress=False, drafter_weights=weights)


def test_force_replaces_a_folder_of_an_earlier_format(bundle_factory, tmp_path):
    """A user upgrading vvs re-exports over the folder the earlier version wrote: ``--force`` takes a format-1
    folder (its manifest kept in tests/golden/old_folders), and without ``--force`` the message says to pass it."""
    from vvs.discrete.exporter import export_folder
    from vvs.errors import VVSError

    out = tmp_path / "engines"
    out.mkdir()
    shutil.copy(Path(__file__).parent / "golden" / "old_folders" / "llamagen" / "manifest.json", out / "manifest.json")
    with pytest.raises(VVSError, match="an engine folder is already there; pass --force to replace it"):
        export_folder(bundle_factory(), out, progress=False)
    manifest = export_folder(bundle_factory(), out, progress=False, force=True)
    assert manifest["format"] == "vvs-engine-folder/2"
    assert load_engines(out, "onnxruntime").target.vocab_size == 16
