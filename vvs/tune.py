"""``vvs-bench --tune``: pick the draft tree and skip setting that are fastest on *this* backend and machine.

On a GPU a 60-node verification costs about as much as a 1-token step; on a CPU it costs several times more.
The tuner therefore measures the backend's verify cost against the number of new positions, then decodes a few
images with each candidate tree (with the most frequent skipping, interval 2) to measure its target forwards and
cycles per image and its drafting seconds per cycle (one ``draft_tree`` call, whose cost grows with the tree),
and predicts seconds per image as ``verify forwards x verify cost + cycles x (drafting + runtime cost per
cycle)``. The skip interval is then chosen by measured wall-clock among the intervals whose quality stays within
AR's seed-to-seed spread.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline, as_conditions

TREE_CANDIDATES = [  # (tree_size, depth, draft_top_k): from one-draft chains to EAGLE-2's published tree
    (2, 0, 1), (3, 0, 2), (3, 1, 1), (4, 2, 1), (4, 2, 2), (6, 3, 2), (8, 3, 3), (12, 4, 3), (16, 4, 4), (24, 4, 5),
    (32, 5, 6), (48, 4, 8), (59, 4, 10),
]
SKIP_CANDIDATES = [2, 3, 4, 5, 8]


@dataclass
class TreeChoice:
    tree_size: int
    depth: int
    draft_top_k: int
    predicted_seconds: float


def median_seconds(fn, repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after one untimed call."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure_verify_costs(pipe: Pipeline, sizes: list[int], repeats: int = 5) -> dict[int, float]:
    """Median seconds of one verify call per number of new positions (CFG batch of one image, full cache)."""
    e = pipe.engines
    cfg = e.target
    rows, capacity = 2, cfg.max_positions + 12
    kv = torch.zeros(cfg.n_layer, 2, rows, cfg.n_head, capacity, cfg.head_dim, dtype=e.dtype, device=e.device)
    mix = torch.tensor([[3.0, -2.0]], device=e.device)
    costs = {}
    for t in sizes:
        inputs = dict(input_ids=torch.zeros(rows, t, dtype=torch.long, device=e.device),
                      position_ids=torch.full((rows, t), cfg.max_positions - 1, device=e.device),
                      attn_mask=torch.ones(rows, 1, t, capacity + t, dtype=torch.bool, device=e.device),
                      past_kv=kv, cfg_mix=mix)
        costs[t] = median_seconds(lambda: e.graphs["target_verify"].run(**inputs), repeats)
    return costs


def interpolate(costs: dict[int, float], t: int) -> float:
    xs = sorted(costs)
    if t <= xs[0]:
        return costs[xs[0]]
    for lo, hi in zip(xs, xs[1:]):
        if t <= hi:
            return costs[lo] + (costs[hi] - costs[lo]) * (t - lo) / (hi - lo)
    return costs[xs[-1]] * t / xs[-1]


def choose_tree(verify_cost: dict[int, float], measured: dict[tuple[int, int, int], tuple[float, float, float]],
                cycle_cost: float = 0.0) -> TreeChoice:
    """The candidate with the lowest predicted seconds per image. ``measured[(tree, depth, k)]`` = (target
    forwards, cycles, drafting seconds per cycle) per image; a verification after a skip also carries the skipped
    chain (up to depth + 1 tokens)."""
    best = None
    for (tree, depth, k), (target_fw, cycles, draft_cost) in measured.items():
        seconds = target_fw * interpolate(verify_cost, tree + depth + 1) + cycles * (draft_cost + cycle_cost)
        if best is None or seconds < best.predicted_seconds:
            best = TreeChoice(tree, depth, k, seconds)
    return best


def measure_trees(pipe: Pipeline, classes: torch.Tensor, base: dict, candidates=TREE_CANDIDATES, seed: int = 0):
    """Per candidate tree, on a few images: (target forwards, cycles, drafting seconds per cycle) per image; and
    the runtime's own seconds per cycle (time outside the graphs), median over candidates."""
    out, per_cycle = {}, []
    for tree, depth, k in candidates:
        if k > pipe.engines.max_draft_top_k:
            continue
        options = dict(tree_size=tree, depth=depth, draft_top_k=k, **base)
        pipe.generate(classes[:1], seed=seed, decode_images=False, **options)  # warm-up (and the graph's export)
        g = pipe.generate(classes, seed=seed, decode_images=False, **options)
        n = len(g.stats)
        cycles = sum(len(s.trace) for s in g.stats)
        out[(tree, depth, k)] = (sum(s.target_forwards for s in g.stats) / n, cycles / n,
                                 sum(s.draft_seconds for s in g.stats) / cycles)
        per_cycle.append(sum(s.other_seconds for s in g.stats) / cycles)
    return out, statistics.median(per_cycle)


def tune(pipe: Pipeline, classes: list, seeds: int, instruments=None, log=print) -> tuple[DecodeOptions, dict]:
    """Choose the tree from predicted cost, then the skip interval by measured speed within AR's quality spread.
    Returns the options and a record of what was predicted and what was then measured (the prediction is for skip
    interval 2, the interval the tree candidates were decoded with, so that row of the benchmark checks it)."""
    from vvs.bench import Setting, run_benchmark, within_ar_spread

    labels = as_conditions(classes)
    costs = measure_verify_costs(pipe, sorted({1, 8, 16, 32, 64, 72}))
    log("verify seconds by new positions: " + ", ".join(f"{t}: {c * 1e3:.2f} ms" for t, c in costs.items()))
    base = {"mode": "vvs", "skip_policy": "uniform"}
    measured, cycle_cost = measure_trees(pipe, labels[: max(2, len(labels) // 4)], {**base, "skip_interval": 2})
    log("draft_tree call by tree: " + ", ".join(f"{t}x{d}x{k}: {m[2] * 1e3:.2f} ms" for (t, d, k), m in measured.items()))
    tree = choose_tree(costs, measured, cycle_cost)
    log(f"runtime cost per cycle: {cycle_cost * 1e3:.2f} ms; tree: size {tree.tree_size}, depth {tree.depth}, "
        f"top-k {tree.draft_top_k} (predicted {tree.predicted_seconds:.3f} s/image)")
    chosen = {"tree_size": tree.tree_size, "depth": tree.depth, "draft_top_k": tree.draft_top_k}
    settings = [Setting("ar", {"mode": "ar"})] + [
        Setting(f"vvs[skip_interval={i}]", {**base, **chosen, "skip_interval": i}) for i in SKIP_CANDIDATES]
    results, _ = run_benchmark(pipe, settings, classes, seeds, batch_size=1, instruments=instruments)
    modes = results["modes"]
    candidates = settings[1:]
    # every interval's row is kept and logged, so a pick can be checked against the ones it beat
    rows = [{"skip_interval": s.overrides["skip_interval"], "speedup_vs_ar": modes[s.label]["speedup_vs_ar"],
             "within_ar_quality_spread": within_ar_spread(modes[s.label], modes["ar"])} for s in candidates]
    for row in rows:
        log(f"skip interval {row['skip_interval']}: {row['speedup_vs_ar']:.2f}x vs ar, "
            + ("inside" if row["within_ar_quality_spread"] else "outside") + " AR's quality spread")
    ok = [i for i, row in enumerate(rows) if row["within_ar_quality_spread"]]
    best = max(ok or range(len(rows)), key=lambda i: rows[i]["speedup_vs_ar"])
    pick = rows[best]
    log(f"picked skip interval {pick['skip_interval']}"
        + ("" if ok else " (no interval stayed within AR's quality spread; kept the fastest)"))
    checked = modes[candidates[0].label]  # skip interval 2: the setting the prediction is for
    record = {"tree": chosen, "predicted_seconds_per_image": tree.predicted_seconds,
              "measured_seconds_per_image": checked["seconds_per_image"]["median"],
              "skip_interval": pick["skip_interval"], "measured_speedup_vs_ar": pick["speedup_vs_ar"],
              "within_ar_quality_spread": bool(ok), "skip_intervals": rows}
    log(f"predicted {record['predicted_seconds_per_image']:.3f} s/image at skip interval 2, measured "
        f"{record['measured_seconds_per_image']:.3f}")
    return pipe.options.updated(**candidates[best].overrides), record
