"""The console commands as a user types them: outputs on success, one-line errors with exit code 2."""
import json

import numpy as np
import pytest
import torch

from conftest import run_cli
from vvs.cli.export import main as export_main
from vvs.cli.run import main as run_main
from vvs.engines import load_engines
from vvs.models.loading import save_model
from vvs.runtime.pipeline import Pipeline


def test_run_writes_images_grid_stats_and_tokens(tiny_folder, tmp_path, capsys, monkeypatch):
    out, stats, tokens = tmp_path / "out", tmp_path / "stats.json", tmp_path / "tokens.npy"
    code, stdout, err = run_cli(run_main, ["--engine", tiny_folder, "--mode", "ar", "--mode", "vvs", "--class", "1",
                                           "--class", "3", "--temperature", "0", "--cfg", "2", "--out", out,
                                           "--stats-json", stats, "--save-tokens", tokens, "--threads", "1"],
                                capsys, monkeypatch)
    assert code == 0, err
    assert "TPF" in stdout and "vvs" in stdout
    assert sorted(p.name for p in out.iterdir()) == [".vvs-run.json", "ar_000_goldfish.png", "ar_001_tiger_shark.png",
                                                     "ar_grid.png", "vvs_000_goldfish.png", "vvs_001_tiger_shark.png",
                                                     "vvs_grid.png"]
    payload = json.loads(stats.read_text())
    assert len(payload["images"]) == 4 and set(payload["aggregate"]) == {"ar", "vvs"}
    for image in payload["images"]:
        assert {"tokens", "target_forwards", "drafter_forwards", "skipped_verifications",
                "tokens_per_target_forward", "mean_accept_length", "seconds"} <= image.keys()
        assert image["tokens"] == 16
    ar = [i for i in payload["images"] if i["mode"] == "ar"]
    assert all(i["tokens_per_target_forward"] == 1.0 and i["drafter_forwards"] == 0 for i in ar)
    saved = np.load(tokens)
    pipe = Pipeline(load_engines(tiny_folder, "onnxruntime", threads=1))
    for m, mode in enumerate(["ar", "vvs"]):
        expected = pipe.generate(torch.tensor([1, 3]), mode=mode, temperature=0, cfg_scale=2.0, decode_images=False)
        assert np.array_equal(saved[2 * m : 2 * m + 2], expected.tokens.numpy()), mode
    assert not list(tmp_path.rglob(".*.tmp"))


@pytest.mark.parametrize("args,message", [
    (["--class", "99"], "option --class 99: out of range, the model has 10 classes (0-9)"),
    (["--class", "dog"], "option --class 'dog': not a class id or name"),
    (["--seed", "1,2,3", "--class", "1"], "option --seed: got 3 seeds for 1 images"),
    (["--seed", "-4"], "option --seed '-4': give a non-negative integer"),
    (["--seed", str(2**64)], f"option --seed {2**64}: seeds must be integers in [0, {2**63 - 1}]"),
    (["--top-p", "2"], "option --top-p 2.0: must be in (0, 1]"),
    (["--tree-size", "-1"], "option --tree-size -1"),
    (["--mode", "fast"], "option --mode 'fast': unknown; choose from ar, sd, lantern, vvs, vvs-uniform, vvs-dynamic"),
    (["--bogus"], "No such option '--bogus'"),
    (["--mode", "sjd", "--window", "1"], "option --window 1: must be >= 2 (the root plus at least one draft)"),
    (["--mode", "sjd-pac", "--window", "8"], "option --window 8: must exceed the 13 nodes of SJD-PAC's tree"),
    (["--mode", "gsd", "--gsd-prob-gap", "2"], "option --gsd-prob-gap 2.0: must be a probability difference"),
])
def test_run_bad_arguments(tiny_folder, tmp_path, capsys, monkeypatch, args, message):
    code, _, err = run_cli(run_main, ["--engine", tiny_folder, "--out", tmp_path / "o", *args], capsys, monkeypatch)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vvs-run: error: ") and message in lines[0], err


def test_run_unwritable_output(tiny_folder, tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli(run_main, ["--engine", tiny_folder, "--out", blocker / "sub"], capsys, monkeypatch)
    assert code == 2 and "cannot write output there" in err and len(err.strip().splitlines()) == 1


def test_run_corrupt_engine_folder(tiny_folder, tmp_path, capsys, monkeypatch):
    import shutil

    broken = tmp_path / "eng"
    shutil.copytree(tiny_folder, broken)
    (broken / "vq_decode.onnx").write_bytes(b"garbage")
    code, _, err = run_cli(run_main, ["--engine", broken, "--out", tmp_path / "o"], capsys, monkeypatch)
    assert code == 2 and "vq_decode.onnx" in err and len(err.strip().splitlines()) == 1


def tiny_files(bundle, folder):
    return ["--checkpoint", save_model(bundle.target, folder / "t.safetensors", "gpt"),
            "--drafter", save_model(bundle.drafter, folder / "d.safetensors", "drafter"),
            "--vq", save_model(bundle.vq, folder / "v.safetensors", "vq")]


def test_export_writes_a_folder_that_runs(bundle_factory, tmp_path, capsys, monkeypatch):
    out = tmp_path / "engines"
    code, stdout, err = run_cli(export_main, [*tiny_files(bundle_factory(), tmp_path), "--out", out, "--lantern-k", "8"],
                                capsys, monkeypatch)
    assert code == 0, err
    assert "wrote" in stdout and (out / "manifest.json").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tables"]["neighbours_per_code"] == 8
    assert set(manifest["graphs"]) == {"target_prefill", "target_verify", "draft_tree", "vq_decode"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".engines")]


def test_export_refuses_to_overwrite_a_foreign_folder(bundle_factory, tmp_path, capsys, monkeypatch):
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "holiday.jpg").write_bytes(b"x")
    code, _, err = run_cli(export_main, [*tiny_files(bundle_factory(), tmp_path), "--out", foreign], capsys, monkeypatch)
    assert code == 2 and "exists and is not an engine folder" in err, err
    assert (foreign / "holiday.jpg").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".photos")]


def test_help_of_the_package_points_to_its_entry_points():
    """``help(vvs)`` showed only a list of modules."""
    import pydoc

    import vvs

    text = pydoc.render_doc(vvs, renderer=pydoc.plaintext)
    for name in ("vvs.engines.load_engines", "vvs.runtime.pipeline.Pipeline", "vvs.serve.client.Client", "vvs-run"):
        assert name in text


INT4_MANIFEST = {"precision": "fp32", "files": {"torch_target.safetensors": {}},
                 "graphs": {"target_prefill": {"weights": "int4"}, "target_verify": {"weights": "int4"},
                            "draft_tree": {"weights": "int4"}, "vq_decode": {"weights": "fp32"}}}


def test_the_export_summary_names_the_weights_format():
    from vvs.cli.export import graph_formats

    assert graph_formats(INT4_MANIFEST) == "int4 weights, vq_decode fp32"
    drafter_int8 = {**INT4_MANIFEST, "graphs": {**INT4_MANIFEST["graphs"], "target_prefill": {"weights": "fp32"},
                                                 "target_verify": {"weights": "fp32"},
                                                 "draft_tree": {"weights": "int8"}}}
    assert graph_formats(drafter_int8) == "fp32 weights, draft_tree int8"


def test_the_torch_backend_says_it_runs_a_quantised_folder_s_float32_weights(capsys):
    import click

    from vvs.cli.common import backend_notice
    from vvs.cli.run import run_cmd

    with click.Context(run_cmd, info_name="vvs-run"):
        backend_notice(INT4_MANIFEST, "onnxruntime")
        backend_notice({**INT4_MANIFEST, "files": {}}, "torch")  # no float32 weights: the torch loader refuses
        assert capsys.readouterr().err == ""
        backend_notice(INT4_MANIFEST, "torch")
    assert capsys.readouterr().err == (
        "vvs-run: note: --backend torch runs this folder's float32 weights, not its int4 graphs (exact modes sample "
        "the float32 target); --backend onnxruntime runs the int4 model\n")
