"""vvs-bench --tune over the drafter-free windows and the modes: the choice from the cost curve, the fastest exact
mode stored as the folder's default, and vvs-run using it (measurements injected: no timing is asserted)."""
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import vvs.bench
import vvs.tune
from conftest import SMALL, run_cli
from vvs.cli.bench import main as bench_main
from vvs.cli.run import main as run_main
from vvs.engines import load_engines
from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline


def test_the_window_follows_the_cost_curve(monkeypatch):
    """Longer windows need fewer forwards: where a forward costs the same at any length (GPU-like) the longest
    wins, where its cost grows with the window (CPU-like) the shortest; SJD-PAC's tree width is chosen with it."""
    forwards = {16: 60.0, 24: 50.0, 32: 45.0, 48: 42.0, 64: 40.0}
    monkeypatch.setattr(vvs.tune, "measure_windows", lambda pipe, classes, mode, candidates: {
        i: (forwards[c["window"]] - c.get("pac_tree_width", 0), 1e-4) for i, c in enumerate(candidates)})
    pipe = SimpleNamespace(engines=SimpleNamespace(target=SimpleNamespace(num_image_tokens=256)))
    flat = {1: 1e-3, 72: 1e-3}
    steep = {1: 1e-3, 16: 4e-3, 64: 16e-3}
    wide = vvs.tune.tune_windows(pipe, None, flat, log=lambda line: None)
    narrow = vvs.tune.tune_windows(pipe, None, steep, log=lambda line: None)
    assert wide["sjd"]["options"] == {"window": 64} and wide["gsd"]["options"] == {"window": 64}
    assert wide["sjd-pac"]["options"] == {"window": 64, "pac_tree_width": 3}
    assert narrow["sjd"]["options"] == {"window": 16}
    assert narrow["sjd-pac"]["options"] == {"window": 16, "pac_tree_width": 3}
    assert wide["sjd"]["predicted_seconds_per_image"] == pytest.approx(40.0 * (1e-3 + 1e-4))
    assert len(wide["sjd-pac"]["candidates"]) == len(vvs.tune.WINDOWS) * len(vvs.tune.PAC_TREE_WIDTHS)
    # a window longer than the image is not tried
    pipe.engines.target.num_image_tokens = 24
    short = vvs.tune.tune_windows(pipe, None, flat, log=lambda line: None)
    assert [r["window"] for r in short["gsd"]["candidates"]] == [16, 24]


def test_the_fastest_lossy_mode_must_stay_within_ar_quality():
    row = lambda seconds, exact, ok: {"seconds_per_image": seconds, "exact": exact,  # noqa: E731
                                      "within_ar_quality_spread": ok}
    rows = {"ar": row(2.0, True, True), "sjd": row(1.5, True, False), "sjd-pac": row(1.2, True, True),
            "gsd": row(0.9, False, False), "vvs-uniform": row(1.0, False, True)}
    # an exact mode's quality differs from AR's by noise alone: sjd-pac counts even outside the spread
    assert vvs.tune.fastest_modes(rows) == ("sjd-pac", "vvs-uniform")
    rows["sjd-pac"]["within_ar_quality_spread"] = False
    assert vvs.tune.fastest_modes({**rows, "vvs-uniform": row(1.3, False, True)}) == ("sjd-pac", "sjd-pac")


def fake_benchmark(seconds: dict, outside: set):
    """run_benchmark's result with the given seconds per setting label (1.5 s unlisted), and domain FIDs outside
    AR's spread for the labels in ``outside``."""
    def bench(pipe, settings, classes, seeds, batch_size, instruments=None):
        def entry(label):
            s = seconds.get(label, 1.5)
            return {"seconds_per_image": {"median": s}, "speedup_vs_ar": seconds["ar"] / s,
                    "class_accuracy": {"median": 0.9, "min": 0.9, "max": 0.9},
                    "domain_fid": {"median": 20.0 if label in outside else 12.0, "min": 11.0, "max": 13.0}}

        return {"modes": {s.label: entry(s.label) for s in settings}}, {}

    return bench


def test_a_folder_without_a_drafter_tunes_its_windows_and_modes(bundle_factory, monkeypatch):
    """No tree, no skip interval: the three window modes and ar are raced; the fastest exact one (sjd-pac) comes
    back as the options to store, at its window, and the fastest of all (gsd, inside AR's spread) is recorded."""
    from vvs.discrete.bundle import ModelBundle
    from vvs.discrete.engines import torch_engines

    b = bundle_factory()
    pipe = Pipeline(torch_engines(ModelBundle(b.target, None, b.vq, b.family)), DecodeOptions(**SMALL, mode="ar"))
    monkeypatch.setattr(vvs.tune, "measure_verify_costs", lambda pipe, sizes: {t: 1e-3 * t for t in sizes})
    seen = {}

    def bench(pipe, settings, *args, **kwargs):
        seen["settings"] = {s.label: s.overrides for s in settings}
        return fake_benchmark({"ar": 2.0, "sjd": 1.6, "sjd-pac": 1.2, "gsd": 0.9}, set())(pipe, settings, *args,
                                                                                             **kwargs)

    monkeypatch.setattr(vvs.bench, "run_benchmark", bench)
    options, record = vvs.tune.tune(pipe, [0, 1, 2, 3], seeds=1, log=lambda line: None)
    assert list(seen["settings"]) == ["ar", "sjd", "sjd-pac", "gsd"]
    assert "tree" not in record and "skip_intervals" not in record
    assert record["fastest_exact_mode"] == "sjd-pac" and record["fastest_mode"] == "gsd"
    pac = record["windows"]["sjd-pac"]
    assert seen["settings"]["sjd-pac"] == {"mode": "sjd-pac", **pac["options"]}
    assert pac["measured_seconds_per_image"] == 1.2 and pac["options"]["window"] == 16  # the image's 16 tokens
    assert pac["predicted_seconds_per_image"] == min(r["predicted_seconds_per_image"] for r in pac["candidates"])
    assert options.name == "sjd-pac" and options.window == 16
    assert options.pac_tree_width == pac["options"]["pac_tree_width"]
    assert set(record["modes"]) == {"ar", "sjd", "sjd-pac", "gsd"} and record["modes"]["gsd"]["exact"] is False


@pytest.fixture(scope="module")
def tuned_folder(tiny_folder, tmp_path_factory):
    """A copy of the tiny folder tuned by vvs-bench --tune: the verify costs and the trees' measurements injected
    (the tree candidates are the folder's own tree, whose graph it holds), windows and modes measured."""
    folder = tmp_path_factory.mktemp("tuned") / "tiny"
    shutil.copytree(tiny_folder, folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vvs.tune, "measure_verify_costs", lambda pipe, sizes: {t: 1e-4 * (1 + t) for t in sizes})
        patch.setattr(vvs.tune, "measure_trees", lambda *a, **k: ({(12, 3, 4): (10.0, 8.0, 1e-4)}, 1e-4))
        patch.setattr("sys.argv", ["vvs-bench", "--engine", str(folder), "--tune", "--mode", "ar", "--num-images",
                                   "2", "--num-seeds", "1", "--threads", "1",
                                   "--out", str(tmp_path_factory.mktemp("bench"))])
        try:
            bench_main()
        except SystemExit as done:
            assert not done.code
    return folder


def test_tune_stores_windows_and_the_fastest_modes(tuned_folder):
    manifest = json.loads((tuned_folder / "manifest.json").read_text())
    tuning, defaults = manifest["tuning"], manifest["decoding_defaults"]
    assert tuning["tree"] == {"tree_size": 12, "depth": 3, "draft_top_k": 4}
    assert set(tuning["windows"]) == {"sjd", "sjd-pac", "gsd"}
    assert all(w["options"]["window"] == 16 for w in tuning["windows"].values())
    assert set(tuning["modes"]) == {"ar", "sd", "lantern", "vvs-dynamic", "vvs-uniform", "sjd", "sjd-pac", "gsd"}
    exact = tuning["fastest_exact_mode"]
    assert exact in ("ar", "sd", "sjd", "sjd-pac") and tuning["modes"][exact]["exact"]
    assert tuning["fastest_mode"] in tuning["modes"] and tuning["measured_on"]
    # the default mode is the fastest exact one, with the options it was measured at; the tuned tree and skip
    # interval stay in the defaults for the drafter modes
    assert defaults["mode"] == exact
    stored = DecodeOptions.from_dict(defaults)
    assert stored.updated(**tuning["modes"][exact]["options"]) == stored
    assert defaults["skip_interval"] == tuning["skip_interval"]


def test_run_without_a_mode_uses_and_names_the_fastest_exact_mode(tuned_folder, tmp_path, capsys, monkeypatch):
    manifest = json.loads((tuned_folder / "manifest.json").read_text())
    exact = manifest["tuning"]["fastest_exact_mode"]
    tokens = tmp_path / "tokens.npy"
    code, _, err = run_cli(run_main, ["--engine", tuned_folder, "--class", "1", "--class", "3", "--out", tmp_path / "o",
                                      "--stats-json", tmp_path / "s.json", "--save-tokens", tokens, "--threads", "1"],
                           capsys, monkeypatch)
    assert code == 0, err
    assert (f"vvs-run: mode {exact} (this folder's fastest exact mode on this host, measured by vvs-bench --tune on "
            f"{manifest['tuning']['measured_on']})") in err.splitlines()
    assert {i["mode"] for i in json.loads((tmp_path / "s.json").read_text())["images"]} == {exact}
    measured = {k: v for k, v in manifest["tuning"]["modes"][exact]["options"].items() if k != "mode"}
    pipe = Pipeline(load_engines(tuned_folder, "onnxruntime", threads=1))
    expected = pipe.generate(torch.tensor([1, 3]), mode=exact, decode_images=False, **measured)
    assert np.array_equal(np.load(tokens), expected.tokens.numpy())
    # a mode given by name runs as asked, without the note
    code, _, err = run_cli(run_main, ["--engine", tuned_folder, "--mode", "ar", "--class", "1", "--out",
                                      tmp_path / "o2", "--threads", "1"], capsys, monkeypatch)
    assert code == 0 and "fastest exact mode" not in err


def test_an_untuned_folder_runs_its_default_mode_without_a_note(tiny_folder, tmp_path, capsys, monkeypatch):
    code, _, err = run_cli(run_main, ["--engine", tiny_folder, "--class", "1", "--out", tmp_path / "o",
                                      "--stats-json", tmp_path / "s.json", "--threads", "1"], capsys, monkeypatch)
    assert code == 0, err
    assert "fastest exact mode" not in err
    default = json.loads((tiny_folder / "manifest.json").read_text())["decoding_defaults"]["mode"]
    assert {i["mode"] for i in json.loads((tmp_path / "s.json").read_text())["images"]} == {default}
