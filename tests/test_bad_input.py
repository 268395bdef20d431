"""Bad input, faults and leftovers: every case ends in a one-line error with exit code 2 (``OptionsError`` /
``VVSError`` from the API), never a traceback, and never a changed file outside the output paths."""
import errno
import hashlib
import json
import math
import os
import re
import shutil
import socket
from dataclasses import fields

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError

from conftest import run_cli
from vvs.cli.bench import main as bench_main
from vvs.cli.export import main as export_main
from vvs.cli.run import main as run_main
from vvs.cli.serve import main as serve_main
from vvs.cli.train import main as train_main
from vvs.discrete.exporter import export_folder
from vvs.engines import load_engines
from vvs.engines.manifest import EngineFolderError
from vvs.errors import VVSError
from vvs.runtime.options import DecodeOptions, OptionsError
from vvs.runtime.pipeline import Pipeline


def snapshot(root) -> dict:
    """Every file under ``root`` with its sha256 (symbolic links by their target)."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                files[path] = "link:" + os.readlink(path)
            elif os.path.isfile(path):
                files[path] = hashlib.sha256(open(path, "rb").read()).hexdigest()
            else:
                files[path] = "special"
    return files


def one_line_error(code, err, prog):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def folder(tiny_folder, tmp_path):
    copy = tmp_path / "engines"
    shutil.copytree(tiny_folder, copy)
    return copy


RUN_CASES = [
    (["--cfg", "nan"], "option --cfg nan: must be a finite number"),
    (["--cfg", "inf"], "option --cfg inf: must be a finite number"),
    (["--temperature", "nan"], "option --temperature nan: must be a finite number"),
    (["--temperature", "inf"], "option --temperature inf: must be a finite number"),
    (["--lantern-delta", "nan"], "option --lantern-delta nan: must be a finite number"),
    (["--lantern-delta", "inf"], "option --lantern-delta inf: must be a finite number"),
    (["--top-k", "1e23"], "'1e23' is not a valid integer"),
    (["--top-k", str(10**23)], f"option --top-k {10**23}: exceeds the vocabulary of 16 codes"),
    (["--depth", "16"], "option --depth 16: must be below the image's 16 tokens"),
    # sizes bounded before anything is allocated or exported (a window of 100000 once grew until the kernel killed
    # the process; a deep tree's draft_tree graph takes minutes to export)
    (["--depth", "1000"], "option --depth 1000: must be in [0, 16]"),
    (["--mode", "sd", "--tree-size", "5000"], "option --tree-size 5000: must be in [2, 512]"),
    (["--mode", "sjd", "--window", "100000"], "option --window 100000: must be at most the image's 16 tokens"),
    # an option none of the run's modes reads is refused, not ignored
    (["--window", "8"], "option --window: applies to modes sjd, sjd-pac or gsd only, not vvs-uniform"),
    (["--mode", "vvs-dynamic", "--skip-interval", "3"],
     "option --skip-interval: applies to mode vvs-uniform only, not vvs-dynamic"),
    (["--mode", "vvs-uniform,sd", "--sim-threshold", "0.5"],
     "option --sim-threshold: applies to mode vvs-dynamic only, not vvs-uniform, sd"),
    (["--mode", "sjd", "--pac-tree-width", "2"], "option --pac-tree-width: applies to mode sjd-pac only, not sjd"),
    (["--mode", "ar,sjd", "--gsd-group-size", "4"], "option --gsd-group-size: applies to mode gsd only, not ar, sjd"),
    # the lossy walk has one name, the mode's; there is no flag that makes sjd-pac lossy
    (["--mode", "sjd", "--pac-rule", "official"], "No such option '--pac-rule'"),
    # a too-large tree is reported against the tree option that was given, not the window nobody gave
    # ... and its advice names only a window the image allows, and no count of hundreds of digits
    (["--mode", "sjd-pac", "--pac-tree-depth", "5"],
     "option --pac-tree-depth 5: the 121 nodes of SJD-PAC's tree (pac_tree_width=3, pac_tree_depth=5) must be "
     "fewer than sjd-pac's window of 16 tokens; shrink the tree (a window holds at most the image's 16 tokens)"),
    (["--mode", "sjd-pac", "--pac-tree-depth", "300"],
     "option --pac-tree-depth 300: SJD-PAC's tree (pac_tree_width=3, pac_tree_depth=300) has more than 512 nodes "
     "(the published tree has 13); shrink it"),
    (["--mode", "sjd-pac", "--pac-tree-width", "64"], "option --pac-tree-width 64: SJD-PAC's tree (pac_tree_width=64, "
                                                      "pac_tree_depth=3) has more than 512 nodes"),
    (["--num-images", "1000000000"], "--num-images"),
    (["--class", "²"], "option --class '²': not a class id or name"),
    (["--class", "1,x"], "option --class 'x': not a class id or name"),
    (["--class", "0,1", "--num-images", "2"], "option --num-images 2: fewer than the 3 classes given"),
    (["--cfg", "1e38"], "option --cfg 1e+38: must be in [0, 1000]"),
    (["--seed", str(2**64)], "option --seed"),
    (["--seed", "1.5"], "option --seed '1.5'"),
    (["--device", "tpu"], "option --device 'tpu': not a device vvs runs on; use cpu, cuda or cuda:N"),
    (["--backend", "torch", "--device", "cuda"], "option --device cuda: no CUDA device is available here"),
    (["--backend", "tensorrt"], "TensorRT plans run on an NVIDIA GPU and none is available here"),
    (["--mode", "ar", "--mode", "sd", "--draft-top-k", "11"],
     "option --draft-top-k 11: the engine folder accepts draft trees with at most 10 children per node"),
    (["--mode", ""], None),  # an empty value means "the default": not an error
]


@pytest.mark.parametrize("args,message", RUN_CASES)
def test_vvs_run_bad_arguments(folder, tmp_path, capsys, monkeypatch, args, message):
    if "cuda" in " ".join(args) and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    code, _, err = run_cli(run_main, ["--engine", folder, "--out", out, "--class", "1", "--threads", "1", *args],
                           capsys, monkeypatch)
    if message is None:
        assert code == 0, err
        return
    assert message in one_line_error(code, err, "vvs-run")
    assert snapshot(tmp_path) == before, "a failed run changed files"
    assert not out.exists() or not any(out.iterdir()), "nothing is written before the options are checked"


def test_an_earlier_run_is_never_mixed_in(folder, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    base = ["--engine", folder, "--out", out, "--threads", "1", "--temperature", "0"]
    assert run_cli(run_main, [*base, "--class", "1,2"], capsys, monkeypatch)[0] == 0
    first = snapshot(out)
    code, _, err = run_cli(run_main, [*base, "--class", "3"], capsys, monkeypatch)
    assert "already holds files (an earlier run?); pass --overwrite" in one_line_error(code, err, "vvs-run")
    assert snapshot(out) == first
    (out / "notes.txt").write_text("mine")
    assert run_cli(run_main, [*base, "--class", "3", "--overwrite"], capsys, monkeypatch)[0] == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == [".vvs-run.json", "notes.txt", "vvs_000_tiger_shark.png", "vvs_grid.png"]  # run 1's files


def test_another_run_writing_to_the_same_folder_is_refused(folder, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".vvs-run.lock").write_text(str(os.getppid()))  # a live process holds it
    code, _, err = run_cli(run_main, ["--engine", folder, "--out", out, "--class", "1", "--overwrite"], capsys,
                           monkeypatch)
    assert f"another vvs-run (pid {os.getppid()}) is writing there" in one_line_error(code, err, "vvs-run")
    (out / ".vvs-run.lock").write_text("999999999")  # left by a killed run: taken over
    code, _, err = run_cli(run_main, ["--engine", folder, "--out", out, "--class", "1", "--overwrite",
                                      "--temperature", "0", "--threads", "1"], capsys, monkeypatch)
    assert code == 0, err
    assert not (out / ".vvs-run.lock").exists()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder", "out"])
def test_statistics_never_replace_what_is_not_a_regular_file(folder, tmp_path, capsys, monkeypatch, kind):
    target = tmp_path / "real.json"
    target.write_text("keep")
    stats = tmp_path / "stats.json"
    if kind == "symlink":
        stats.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(stats)
    elif kind == "folder":
        stats.mkdir()
    else:
        stats = tmp_path / "out"
    before = snapshot(tmp_path)
    code, _, err = run_cli(run_main, ["--engine", folder, "--out", tmp_path / "out", "--class", "1",
                                      "--stats-json", stats], capsys, monkeypatch)
    assert "--stats-json" in one_line_error(code, err, "vvs-run")
    assert snapshot(tmp_path) == before and target.read_text() == "keep"


def test_a_graph_missing_from_the_file_list_is_refused(folder, capsys, monkeypatch):
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["files"]["draft_tree.onnx"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EngineFolderError, match="draft_tree.onnx: not in the manifest's file list"):
        load_engines(folder, "onnxruntime")


@pytest.mark.parametrize("edit,message", [
    ({"cfg_scale": math.nan}, "decoding_defaults: option cfg_scale=nan: must be a finite number"),
    ({"turbo": 1}, "decoding_defaults: unknown option(s): turbo"),
    ({"top_k": "many"}, "decoding_defaults: option top_k='many': must be an integer"),
])
def test_a_bad_manifest_default_names_the_manifest(folder, tmp_path, capsys, monkeypatch, edit, message):
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["decoding_defaults"].update(edit)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_cli(run_main, ["--engine", folder, "--out", tmp_path / "out"], capsys, monkeypatch)
    line = one_line_error(code, err, "vvs-run")
    assert f"{folder / 'manifest.json'}: {message}" in line and "fix the file or re-export" in line


def _set(manifest: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for key in parents:
        manifest = manifest[key]
    if value is DELETE:
        del manifest[last]
    else:
        manifest[last] = value


DELETE = object()


@pytest.mark.parametrize("path,value,message", [
    ("graphs", "x", "graphs: 'x' is not of type 'object'"),
    ("model.target", DELETE, "model: 'target' is a required property"),
    ("files.vq_decode.onnx", {"sha256": "0" * 64, "bytes": [1]}, "is not of type 'integer'"),
    ("graphs.target_verify.file", "../../etc/passwd", "graphs.target_verify.file"),
    ("precision", "fp8", "precision: 'fp8' is not one of"),
    ("graphs.draft_tree.tree", [4, 2], "graphs.draft_tree.tree: [4, 2] is too short"),
    ("model.target.n_head", 0, "model.target: integer modulo by zero"),
    ("model.vq.turbo", True, "model.vq: VQConfig.__init__() got an unexpected keyword argument 'turbo'"),
    ("tensorrt-rtx", {"engines": []}, "tensorrt-rtx.engines: [] is not of type 'object'"),
])
def test_a_manifest_of_the_wrong_shape_is_one_error_naming_the_field(folder, tmp_path, capsys, monkeypatch, path,
                                                                      value, message):
    """Valid JSON of the wrong shape is refused when the folder is read, before any work, with exit 2."""
    manifest = json.loads((folder / "manifest.json").read_text())
    if path.startswith("files."):
        manifest["files"][path.split(".", 1)[1]] = value
    else:
        _set(manifest, path, value)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "out"
    code, _, err = run_cli(run_main, ["--engine", folder, "--out", out], capsys, monkeypatch)
    line = one_line_error(code, err, "vvs-run")
    assert f"{folder / 'manifest.json'}: " in line and message in line and "re-export" in line
    assert not out.exists()


@pytest.mark.parametrize("args,message", [
    (["--class", "1,x"], "option --class 'x': not a class id or name"),
    (["--mode", "vvs,turbo"], "option --mode 'turbo': unknown"),
    (["--cfg", "nan"], "option --cfg nan: must be a finite number"),
    (["--num-seeds", "0"], "--num-seeds"),
    (["--mode", "ar,vvs", "--sweep", "skip_interval=3,0"], "option --sweep skip_interval=0: must be >= 1"),
])
def test_vvs_bench_bad_arguments(folder, tmp_path, capsys, monkeypatch, args, message):
    code, _, err = run_cli(bench_main, ["--engine", folder, "--out", tmp_path / "b", "--num-images", "2", *args],
                           capsys, monkeypatch)
    assert message in one_line_error(code, err, "vvs-bench")


@pytest.mark.parametrize("args,message", [
    (["--mode", "vvs", "--window", "32"], "option --window: applies to modes sjd, sjd-pac or gsd only, not "
                                          "vvs-uniform"),
    (["--mode", "vvs-dynamic", "--skip-interval", "3"], "option --skip-interval: applies to mode vvs-uniform only"),
    (["--tree-size", "5000"], "option --tree-size 5000: must be in [2, 512]"),
    # the folder's own bounds too, as its manifest states them
    (["--depth", "16"], "option --depth 16: must be below the image's 16 tokens"),
    (["--mode", "sjd", "--window", "100"], "option --window 100: must be at most the image's 16 tokens"),
    (["--draft-top-k", "11"], "option --draft-top-k 11: the engine folder accepts draft trees with at most 10 "
                              "children per node"),
    (["--backend", "tensorrt"], "TensorRT plans run on an NVIDIA GPU and none is available here"),
    (["--mode", "ar,vvs", "--sweep", "skip_interval=3,0"], "option --sweep skip_interval=0: must be >= 1"),
])
def test_vvs_bench_scale_refuses_bad_options_before_inflating(folder, tmp_path, capsys, monkeypatch, args, message):
    """Inflating to an official size takes minutes (a 7B model: 5 GB by 40 s): nothing of it starts before every
    option the plain path refuses is refused."""
    import vvs.discrete.scale

    if "tensorrt" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr(vvs.discrete.scale, "scale_folder", lambda *a, **k: pytest.fail("inflated first"))
    code, _, err = run_cli(bench_main, ["--engine", folder, "--out", tmp_path / "b", "--num-images", "2",
                                        "--scale", "GPT-B", *args], capsys, monkeypatch)
    assert message in one_line_error(code, err, "vvs-bench")


def test_vvs_bench_needs_two_images_for_fid(folder, tmp_path, capsys, monkeypatch):
    import vvs.bench

    monkeypatch.setattr(vvs.bench, "load_instruments", lambda *a: object())  # as for the shipped model
    code, _, err = run_cli(bench_main, ["--engine", folder, "--out", tmp_path / "b", "--num-images", "1"], capsys,
                           monkeypatch)
    assert "need at least 2 images per seed set" in one_line_error(code, err, "vvs-bench")


# ---------------------------------------------------------------------- export


def test_export_never_deletes_a_folder_that_only_looks_like_an_engine_folder(bundle_factory, tmp_path):
    mine = tmp_path / "mine"
    (mine / "photos").mkdir(parents=True)
    (mine / "manifest.json").write_text('{"my": "notes"}')
    (mine / "photos" / "a.jpg").write_bytes(b"x")
    before = snapshot(tmp_path)
    for force in (False, True):
        with pytest.raises(VVSError, match="exists and is not an engine folder"):
            export_folder(bundle_factory(), mine, progress=False, force=force)
        assert snapshot(tmp_path) == before


def test_export_replaces_an_engine_folder_only_with_force_and_cleans_what_a_killed_export_left(bundle_factory,
                                                                                                 tiny_folder, tmp_path):
    eng = tmp_path / "engines"
    shutil.copytree(tiny_folder, eng)
    with pytest.raises(VVSError, match="an engine folder is already there; pass --force to replace it"):
        export_folder(bundle_factory(), eng, progress=False)
    (eng / "extra.txt").write_text("x")
    stale = tmp_path / ".engines.vvs-export-999999999-abc"  # a killed export's work: its process is gone
    stale.mkdir()
    (stale / "target_verify.onnx").write_bytes(b"half")
    export_folder(bundle_factory(), eng, progress=False, force=True)
    assert not (eng / "extra.txt").exists() and (eng / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engines"]


def test_export_into_the_current_folder_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("x")
    code, _, err = run_cli(export_main, ["--out", "."], capsys, monkeypatch)
    assert "is the folder vvs-export runs in" in one_line_error(code, err, "vvs-export")
    assert (tmp_path / "keep.txt").read_text() == "x"


@pytest.mark.parametrize("args,message", [
    (["--backend", "tensorrt-rtx", "--compute-capability", "99.x"], "option --compute-capability '99.x': write "
                                                                     "major.minor"),
    (["--compute-capability", "8.9"], "option --compute-capability: needs --backend tensorrt-rtx"),
])
def test_export_refuses_bad_build_options_before_exporting(tmp_path, capsys, monkeypatch, args, message):
    import vvs.discrete.exporter

    monkeypatch.setattr(vvs.discrete.exporter, "export_folder", lambda *a, **k: pytest.fail("exported first"))
    code, _, err = run_cli(export_main, ["--out", tmp_path / "engines", *args], capsys, monkeypatch)
    assert message in one_line_error(code, err, "vvs-export")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("model,loader", [("llamagen", "vvs.families.llamagen.bundle"),
                                          ("janus-pro", "vvs.families.janus_pro.bundle")])
def test_export_refuses_conflicting_weights_before_loading(tmp_path, capsys, monkeypatch, model, loader):
    """A 7B checkpoint takes minutes to load: what the options alone decide is refused first."""
    import importlib

    monkeypatch.setattr(importlib.import_module(loader), "load_bundle", lambda *a, **k: pytest.fail("loaded first"))
    code, _, err = run_cli(export_main, ["--model", model, "--out", tmp_path / "engines", "--weights", "int4",
                                         "--drafter-weights", "int8"], capsys, monkeypatch)
    assert "option --drafter-weights int8: --weights int4 already sets the drafter's weights" in \
        one_line_error(code, err, "vvs-export")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("key,value,message", [
    ("hidden_size", "64", "hidden_size is '64', not a positive integer; fix the file"),
    ("num_attention_heads", 0, "num_attention_heads is 0, not a positive integer; fix the file"),
    ("rms_norm_eps", "x", "rms_norm_eps is 'x', not a positive number; fix the file"),
])
def test_a_bad_janus_config_value_is_one_line(tmp_path, capsys, monkeypatch, key, value, message):
    from janus_reference import official_config, tokenizer

    folder = tmp_path / "Janus-Pro-1B"
    folder.mkdir()
    config = official_config()
    config["language_config"][key] = value
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer().save(str(folder / "tokenizer.json"))
    code, _, err = run_cli(export_main, ["--model", "janus-pro", "--checkpoint", folder, "--out", tmp_path / "e"],
                           capsys, monkeypatch)
    assert f"{folder / 'config.json'}: {message}" in one_line_error(code, err, "vvs-export")


def config_readers():
    """Lumina-mGPT's and a LANTERN/EAGLE drafter's config.json readers: (a good config, read(folder))."""
    from lumina_reference import vocabulary
    from vvs.discrete.loading import load_drafter
    from vvs.families.llamagen.gpt import gpt_config
    from vvs.families.lumina_mgpt.loading import official_config

    target = gpt_config("GPT-tiny", vocab_size=16, grid_size=4)
    return {"lumina": ({"model_type": "chameleon", "vocabulary_map": vocabulary(), "hidden_size": 64,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                        "vocab_size": len(vocabulary())}, lambda folder: official_config(folder, 16, 4, {})),
            "drafter": ({"hidden_size": target.dim, "intermediate_size": 64, "num_attention_heads": target.n_head,
                         "vocab_size": 16}, lambda folder: load_drafter(folder, target))}


@pytest.mark.parametrize("reader,key,value,message", [
    ("lumina", "hidden_size", "64", "hidden_size is '64', not a positive integer"),
    ("lumina", "num_attention_heads", 0, "num_attention_heads is 0, not a positive integer"),
    ("lumina", "rope_theta", -1, "rope_theta is -1, not a positive number"),
    ("drafter", "hidden_size", "64", "hidden_size is '64', not a positive integer"),
    ("drafter", "num_attention_heads", 0, "num_attention_heads is 0, not a positive integer"),
    ("drafter", "rms_norm_eps", "x", "rms_norm_eps is 'x', not a positive number"),
])
def test_a_bad_lumina_or_drafter_config_value_is_one_line(tmp_path, reader, key, value, message):
    from vvs.models.loading import CheckpointError

    config, read = config_readers()[reader]
    (tmp_path / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(CheckpointError) as err:
        read(tmp_path)
    assert str(err.value) == f"{tmp_path / 'config.json'}: {message}; fix the file"


@pytest.mark.parametrize("writer,failure,reason", [
    ("export_graph", lambda: OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    # the torch weights, written by safetensors, whose errors are not OSErrors
    ("save_model", lambda: SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
     "No space left on device"),
])
def test_export_onto_a_full_disk_changes_nothing(bundle_factory, tiny_folder, tmp_path, monkeypatch, writer,
                                                failure, reason):
    import vvs.discrete.exporter as exporter

    eng = tmp_path / "engines"
    shutil.copytree(tiny_folder, eng)
    before = snapshot(tmp_path)

    def full(*args, **kwargs):
        raise failure()

    monkeypatch.setattr(exporter, writer, full)
    with pytest.raises(VVSError, match=f"export failed while writing \\(.*{reason}.*\\); the folder was left as it "
                                       "was"):
        export_folder(bundle_factory(), eng, progress=False, force=True)
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------- the Python API


@pytest.mark.parametrize("conditions,options,message", [
    ([], {}, "no class ids given"),
    ("cat", {}, "conditions must be a list or tensor of class ids, got str"),
    (None, {}, "got NoneType"),
    ([2.9], {}, "class id 2.9 is not an integer"),
    (torch.tensor([1.0]), {}, "class ids must be integers, got a torch.float32 tensor"),
    ([True], {}, "class id true is not an integer"),
    ([1], {"top_k": "5"}, "option top_k='5': must be an integer"),
    ([1], {"mode": "vvs-uniform", "skip_policy": "dynamic"},
     "option skip_policy='dynamic': mode vvs-uniform sets skip_policy='uniform'; give mode vvs to choose skip_policy"),
    ([1], {"mode": ["ar"]}, 'option mode=["ar"]: must be a string'),
    ([1], {"temperature": math.nan}, "option temperature=nan: must be a finite number"),
    ([1], {"mode": ""}, "option mode='': unknown mode"),
    ([1], {"seed": 1.5}, "seed 1.5: seeds must be integers"),
    ([1], {"seed": 2**70}, "seed 1180591620717411303424: seeds must be integers"),
    ([1], {"seed": [1, 2]}, "got 2 seeds for 1 images"),
    ([1], {"depth": 16}, "option depth=16: must be below the image's 16 tokens"),
    ([1], {"depth": 10**6}, "option depth=1000000: must be in [0, 16]"),
    ([2**70], {}, f"class id {2**70} is out of range"),
    (torch.tensor([[1, 2], [3, 4]]), {}, "class ids must be a 1-D tensor [n], got shape [2, 2]"),
    ([1], {"cfg_scale": 1e38}, "option cfg_scale=1e+38: must be in [0, 1000]"),
    ([1], {"timeout": "x"}, "timeout 'x': give the seconds a request may take"),
    ([1], {"timeout": -5}, "timeout -5: give the seconds a request may take"),
    ([1], {"mode": "vvs", "window": 32}, "option window applies to modes sjd, sjd-pac or gsd only, not vvs-uniform"),
    ([1], {"mode": "vvs-dynamic", "skip_interval": 2}, "option skip_interval applies to mode vvs-uniform only"),
])
def test_api_errors_are_options_errors(pipeline_factory, conditions, options, message):
    pipe = pipeline_factory()
    with pytest.raises(OptionsError) as err:
        pipe.generate(conditions, decode_images=False, **options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_too_long_prompt_is_advised_only_a_size_a_folder_can_take():
    from types import SimpleNamespace

    from janus_reference import tokenizer
    from vvs.families.janus_pro.prompts import PromptIds

    builder = PromptIds(tokenizer(), SimpleNamespace(cls_token_num=16, pad_id=0, bos_id=1))
    with pytest.raises(OptionsError) as err:
        builder.encode(["cat " * 20])
    assert str(err.value).endswith("is 26 tokens with the chat template; this folder takes at most 16: shorten it, "
                                   "or re-export with --prompt-tokens 26 or more")
    with pytest.raises(OptionsError) as err:
        builder.encode(["cat " * 5000])
    assert str(err.value).endswith("is 5006 tokens with the chat template; this folder takes at most 16: shorten it "
                                   "(no folder takes more than 4096)")


@pytest.mark.parametrize("codes,message", [
    (torch.full((1, 16), 16), "codes must lie in [0, 16) (the codebook's size), got 16..16"),
    (torch.full((1, 16), -1), "codes must lie in [0, 16)"),
    (torch.zeros(16, dtype=torch.long), "codes must be integers [n, 16], got torch.int64 [16]"),
    (torch.zeros(1, 16), "codes must be integers [n, 16], got torch.float32"),
])
def test_decode_checks_its_codes(pipeline_factory, codes, message):
    with pytest.raises(OptionsError) as err:
        pipeline_factory().decode(codes)
    assert message in str(err.value)


def test_api_rejects_bad_captions(pipeline_factory):
    pipe = pipeline_factory(model_type="t2i")
    good = torch.randn(1, 3, 8)
    for captions, mask, message in [
        (good, None, "needs caption_mask"),
        (good, torch.ones(1, 3), "caption_mask must be bool"),
        (good, torch.zeros(1, 3, dtype=torch.bool), "every caption needs at least one valid slot"),
        (torch.randn(1, 3, 7), torch.ones(1, 3, dtype=torch.bool), "captions must be float embeddings [n >= 1, 3, 8]"),
        (torch.full((1, 3, 8), math.nan), torch.ones(1, 3, dtype=torch.bool), "NaN or infinite"),
        ([3, 5], None, "this model is text-conditional: give prompts (a list of strings), or caption embeddings "
                       "[n, 3, 8] with caption_mask; class ids have no meaning here"),
        (torch.tensor([3]), None, "class ids have no meaning here"),
    ]:
        with pytest.raises(OptionsError, match=re.escape(message)):
            pipe.generate(captions, caption_mask=mask, decode_images=False)


def test_a_class_conditional_pipeline_takes_class_names_and_refuses_a_caption_mask(folder):
    pipe = Pipeline(load_engines(folder, "onnxruntime", threads=1))
    by_name = pipe.generate(["goldfish", " 4 "], mode="ar", seed=2, decode_images=False)
    assert torch.equal(by_name.tokens, pipe.generate([1, 4], mode="ar", seed=2, decode_images=False).tokens)
    with pytest.raises(OptionsError, match="'wolf' is not a class of this class-conditional model; give a class id "
                                           r"\(0-9\) or a name \(tench, goldfish"):
        pipe.generate(["wolf"], decode_images=False)
    with pytest.raises(OptionsError, match="caption_mask goes with caption embeddings; this model is class-cond"):
        pipe.generate([1], caption_mask=torch.ones(1, 3, dtype=torch.bool), decode_images=False)


def test_pipeline_of_a_folder_checks_lantern_k_against_the_stored_table(folder):
    pipe = Pipeline(load_engines(folder, "onnxruntime", threads=1))
    stored = json.loads((folder / "manifest.json").read_text())["tables"]["neighbours_per_code"]
    with pytest.raises(OptionsError, match=f"the engine folder stores {stored} neighbours per code"):
        pipe.generate([1], mode="lantern", lantern_k=stored + 1, decode_images=False)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from([f.name for f in fields(DecodeOptions)]),
       value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30), st.text(max_size=5),
                       st.none(), st.booleans(), st.lists(st.integers(), max_size=2)))
def test_any_option_value_is_taken_or_refused_in_one_line(field, value):
    try:
        DecodeOptions(**{field: value})
    except OptionsError as err:
        assert str(err).startswith("option ") and "\n" not in str(err)  # cross-field checks may name another


def test_tune_refuses_a_folder_it_could_not_save_to_before_tuning(folder, tmp_path, capsys, monkeypatch):
    """Root can write anywhere, so the read-only manifest is simulated; the check must come before the tuning."""
    import vvs.tune

    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path).endswith("manifest.json") and
                        mode == os.W_OK else real_access(path, mode))
    monkeypatch.setattr(vvs.tune, "tune", lambda *a, **k: pytest.fail("tuned before checking the folder"))
    code, _, err = run_cli(bench_main, ["--engine", folder, "--out", tmp_path / "b", "--tune"], capsys, monkeypatch)
    assert "option --tune: " in one_line_error(code, err, "vvs-bench") and "is not writable" in err


SERVE_CASES = [
    (["--engine", "{missing}"], "no such engine folder (create one with vvs-export)"),
    (["--engine", "{folder}", "--min-replicas", "2"], "--min-replicas needs --max-replicas"),
    (["--engine", "{folder}", "--min-replicas", "3", "--max-replicas", "2"], "--min-replicas 3 is above --max-replicas 2"),
    (["--engine", "{folder}", "--device", "tpu"], "not a device vvs runs on"),
    (["--engine", "{folder}", "--port", "0"], "--port"),
    (["--engine", "{folder}", "--max-request-mb", "0"], "--max-request-mb"),
]


@pytest.mark.parametrize("args,message", SERVE_CASES, ids=[m for _, m in SERVE_CASES])
def test_serve_refuses_bad_arguments_before_starting_ray(folder, tmp_path, capsys, monkeypatch, args, message):
    args = [a.format(folder=folder, missing=tmp_path / "nope") for a in args]
    code, _, err = run_cli(serve_main, args, capsys, monkeypatch)
    assert message in one_line_error(code, err, "vvs-serve")


def test_serve_checks_the_folder_before_starting_ray(folder, capsys, monkeypatch):
    import ray

    (folder / "vq_decode.onnx").unlink()
    code, _, err = run_cli(serve_main, ["--engine", folder], capsys, monkeypatch)
    assert "vq_decode.onnx: missing from the engine folder" in one_line_error(code, err, "vvs-serve")
    assert not ray.is_initialized()


def test_serve_refuses_a_port_in_use(folder, capsys, monkeypatch):
    import ray

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        code, _, err = run_cli(serve_main, ["--engine", folder, "--port", port], capsys, monkeypatch)
    assert f"option --port {port}: 127.0.0.1:{port} is not free" in one_line_error(code, err, "vvs-serve")
    assert not ray.is_initialized()


def test_a_damaged_cached_tree_graph_is_detected_and_exported_again(folder, capfd):
    """Graphs for other tree shapes are exported into trees/ on first use with their size and sha256; an edited
    (or truncated) one fails that check at the next use and is exported again, instead of running or crashing,
    and says so in one line on stderr (the first export says nothing)."""
    options = dict(mode="sd", seed=0, temperature=0, cfg_scale=2.0, tree_size=5, depth=2, draft_top_k=2,
                   decode_images=False)
    first = Pipeline(load_engines(folder, "onnxruntime", threads=1)).generate(torch.tensor([1, 2]), **options)
    assert "exporting it again" not in capfd.readouterr().err
    graph = next((folder / "trees").glob("draft_tree-5x2x2-*.onnx"))
    good = graph.read_bytes()
    graph.write_bytes(good[:100] + bytes([good[100] ^ 0xFF]) + good[101:])  # same size: only the sha256 tells
    again = Pipeline(load_engines(folder, "onnxruntime", threads=1)).generate(torch.tensor([1, 2]), **options)
    assert torch.equal(again.tokens, first.tokens)
    assert graph.read_bytes() == good
    said = [line for line in capfd.readouterr().err.splitlines() if "exporting it again" in line]
    assert said == [f"vvs: {graph}: {graph.name} does not match the sha256 recorded when it was exported (edited or "
                    "damaged); exporting it again"]


@pytest.mark.parametrize("command", ["all", "mar", "t2i"])
def test_train_checks_its_output_folder_before_training(tmp_path, capsys, monkeypatch, command):
    """A folder that cannot be written (here: below a file) is one line and exit 2 before any training."""
    import vvs.families.llamagen.train_shipped
    import vvs.families.llamagen.train_t2i
    import vvs.families.mar.train

    monkeypatch.setattr(vvs.families.llamagen.train_shipped, "reproduce", lambda *a: pytest.fail("trained before checking --out"))
    monkeypatch.setattr(vvs.families.mar.train, "reproduce_mar", lambda *a: pytest.fail("trained before checking --out"))
    monkeypatch.setattr(vvs.families.llamagen.train_t2i, "reproduce_t2i", lambda *a: pytest.fail("trained before checking --out"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli(train_main, [command, "--out", blocker / "runs"], capsys, monkeypatch)
    assert "cannot write output there" in one_line_error(code, err, "vvs-train")
