"""vvs-bench bookkeeping and the auto-tuner's choice, on tiny models (seconds, not minutes)."""
import json

import pytest

from conftest import run_cli
from vvs.bench import make_settings, parse_sweep, run_benchmark, write_results
from vvs.cli.bench import main as bench_main
from vvs.errors import VVSError
from vvs.tune import choose_tree


def test_bookkeeping_is_exact(pipeline_factory, tmp_path):
    pipe = pipeline_factory()
    settings = make_settings(["sd", "vvs-uniform"], parse_sweep(("skip_interval=2,3",)))
    assert [s.label for s in settings] == ["ar", "sd", "vvs-uniform", "vvs-uniform[skip_interval=2]",
                                          "vvs-uniform[skip_interval=3]"]
    results, samples = run_benchmark(pipe, settings, [1, 2, 3], seeds=2, batch_size=2, progress=False)
    modes = results["modes"]
    assert modes["ar"]["tokens_per_target_forward"] == 1.0 and modes["ar"]["speedup_vs_ar"] == 1.0
    for label, entry in modes.items():
        # TPF is tokens / target forwards as the runtime counted them: 3 images x 2 seeds x 16 tokens
        assert entry["tokens_per_target_forward"] == pytest.approx(16 / entry["target_forwards_per_image"])
        s = entry["seconds_per_image"]
        assert s["min"] <= s["median"] <= s["max"]
        assert entry["speedup_vs_ar"] == pytest.approx(modes["ar"]["seconds_per_image"]["median"] / s["median"])
        # each seed set's own ratio: AR's seconds over the mode's, set by set
        runs = entry["speedup_vs_ar_per_seed_set"]
        assert runs["min"] <= runs["median"] <= runs["max"]
        assert runs["min"] >= modes["ar"]["seconds_per_image"]["min"] / s["max"] - 1e-12
        assert runs["max"] <= modes["ar"]["seconds_per_image"]["max"] / s["min"] + 1e-12
    assert modes["ar"]["speedup_vs_ar_per_seed_set"] == {"median": 1.0, "min": 1.0, "max": 1.0, "stdev": 0.0}
    assert modes["vvs-uniform[skip_interval=2]"]["skipped_verifications_per_image"] > 0
    write_results(results, tmp_path, samples)
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {label} |" in table for label in modes)
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "results.json").read_text())["modes"].keys() == modes.keys()
    assert len(list(tmp_path.glob("samples_*.png"))) == len(modes)


def test_sweep_and_mode_errors():
    with pytest.raises(VVSError, match="option --sweep 'speed=2'"):
        parse_sweep(("speed=2",))
    with pytest.raises(VVSError, match="option --mode: unknown turbo"):
        make_settings(["turbo"], {})


def test_tuner_prefers_smaller_trees_when_verification_cost_grows():
    # measured per image: bigger trees need fewer target forwards and cycles, but cost more per drafting call
    measured = {(8, 3, 3): (120.0, 200.0, 1e-5), (24, 4, 5): (95.0, 110.0, 1e-5), (59, 4, 10): (85.0, 90.0, 1e-5)}
    flat = {1: 1e-3, 8: 1e-3, 32: 1e-3, 64: 1e-3}  # GPU-like: a 60-node verify costs a 1-token step
    steep = {1: 1e-3, 8: 2e-3, 32: 6e-3, 64: 11e-3}  # CPU-like: cost grows with the tree
    assert choose_tree(flat, measured).tree_size == 59
    assert choose_tree(steep, measured).tree_size == 8
    # drafting a big tree can cost more than it saves
    pricey = {**measured, (59, 4, 10): (85.0, 90.0, 5e-3)}
    choice = choose_tree(flat, pricey)
    assert choice.tree_size == 24
    assert choice.predicted_seconds == pytest.approx(95.0 * 1e-3 + 110.0 * 1e-5)
    # a runtime cost per cycle favours trees that need fewer cycles
    assert choose_tree(steep, measured, cycle_cost=0.0).tree_size == 8
    assert choose_tree(steep, measured, cycle_cost=5e-3).tree_size == 24


def test_tuner_records_the_measured_speed_next_to_the_prediction(pipeline_factory, monkeypatch):
    """The tuner's record holds its prediction for the chosen tree (at skip interval 2, as the candidates were
    decoded) and the benchmark's measurement of that same setting, the picked interval's measured speed-up, and
    every interval's row: the fastest (2) is passed over because its FID lies outside AR's spread, and says so."""
    import vvs.bench
    import vvs.tune

    monkeypatch.setattr(vvs.tune, "measure_verify_costs", lambda pipe, sizes: {t: 1e-3 * t for t in sizes})
    monkeypatch.setattr(vvs.tune, "measure_trees", lambda *a, **k: ({(4, 2, 1): (100.0, 150.0, 1e-3),
                                                                    (12, 3, 4): (80.0, 100.0, 9e-3)}, 5e-4))
    seen = {}

    def bench(pipe, settings, classes, seeds, batch_size, instruments=None):
        seen["labels"] = [s.label for s in settings]
        seconds = {"ar": 2.0, "vvs[skip_interval=2]": 1.1, "vvs[skip_interval=3]": 1.25}
        fid = {"ar": 12.0, "vvs[skip_interval=2]": 15.0}

        def quality(label):
            return {"class_accuracy": {"median": 0.9, "min": 0.9, "max": 0.9},
                    "domain_fid": {"median": fid.get(label, 12.5), "min": 11.0, "max": 13.0}}

        modes = {s.label: {"seconds_per_image": {"median": seconds.get(s.label, 1.5)},
                           "speedup_vs_ar": 2.0 / seconds.get(s.label, 1.5), **quality(s.label)} for s in settings}
        return {"modes": modes}, {}

    monkeypatch.setattr(vvs.bench, "run_benchmark", bench)
    lines = []
    options, record = vvs.tune.tune(pipeline_factory(), [0, 1], seeds=1, log=lines.append)
    assert seen["labels"][:2] == ["ar", "vvs[skip_interval=2]"]
    assert record["tree"] == {"tree_size": 4, "depth": 2, "draft_top_k": 1}
    assert record["predicted_seconds_per_image"] == pytest.approx(100 * 7e-3 + 150 * 1.5e-3)
    assert record["measured_seconds_per_image"] == 1.1
    assert record["skip_interval"] == 3 and options.skip_interval == 3
    assert (options.tree_size, options.depth, options.draft_top_k) == (4, 2, 1)
    assert record["measured_speedup_vs_ar"] == pytest.approx(1.6)
    assert [(r["skip_interval"], r["within_ar_quality_spread"]) for r in record["skip_intervals"]] == [
        (2, False), (3, True), (4, True), (5, True), (8, True)]
    assert record["skip_intervals"][0]["speedup_vs_ar"] == pytest.approx(2.0 / 1.1)
    assert "skip interval 2: 1.82x vs ar, outside AR's quality spread" in lines
    assert "skip interval 3: 1.60x vs ar, inside AR's quality spread" in lines
    assert "picked skip interval 3" in lines
    # every other mode measured 1.5 s against AR's 2: the first exact one raced (sd) is the default, at the tree;
    # VVS at the picked interval (1.25 s, inside AR's spread) is the fastest of all
    assert options.mode == "sd" and record["fastest_exact_mode"] == "sd"
    assert record["fastest_mode"] == "vvs-uniform" and record["modes"]["vvs-uniform"]["seconds_per_image"] == 1.25


def test_bench_command_writes_results(tiny_folder, tmp_path, capsys, monkeypatch):
    out = tmp_path / "bench"
    code, stdout, err = run_cli(bench_main, ["--engine", tiny_folder, "--mode", "ar,vvs-uniform", "--num-images", "2",
                                             "--num-seeds", "2", "--threads", "1", "--out", out], capsys, monkeypatch)
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    assert set(results["modes"]) == {"ar", "vvs-uniform"}
    ar, vvs = results["modes"]["ar"], results["modes"]["vvs-uniform"]
    ratio = ar["seconds_per_image"]["median"] / vvs["seconds_per_image"]["median"]
    assert vvs["speedup_vs_ar"] == pytest.approx(ratio, rel=1e-6)
    assert ar["tokens_per_target_forward"] == 1.0 and vvs["skipped_verifications_per_image"] > 0
    assert "speed-up vs ar" in stdout


def test_the_pareto_legend_covers_no_point():
    """A point in the lower-right corner of the plot, where the legend used to sit (vvs-uniform was hidden so)."""
    import matplotlib.pyplot as plt

    from vvs.bench import pareto_figure

    fid = lambda median: {"median": median, "min": median - 0.2, "max": median + 0.2}  # noqa: E731
    modes = {"ar": {"domain_fid": fid(12.0), "speedup_vs_ar": 1.0, "tokens_per_target_forward": 1.0},
             "vvs-uniform": {"domain_fid": fid(12.19), "speedup_vs_ar": 0.31, "tokens_per_target_forward": 1.02},
             "lantern": {"domain_fid": fid(11.0), "speedup_vs_ar": 0.9, "tokens_per_target_forward": 2.5}}
    fig = pareto_figure({"modes": modes})
    fig.canvas.draw()
    try:
        for ax in fig.axes:
            legend = ax.get_legend().get_window_extent()
            for collection in ax.collections[:len(modes)]:  # the scatter points, before the spread band
                for x, y in collection.get_offset_transform().transform(collection.get_offsets()):
                    assert not legend.contains(x, y)
    finally:
        plt.close(fig)
