"""``vvs-bench --tune``: pick the draft tree and skip setting that are fastest on *this* backend and machine.

On a GPU a 60-node verification costs about as much as a 1-token step; on a CPU it costs several times more.
The tuner therefore measures the backend's step costs (verify against the number of new positions, one drafter
call), measures how many target and drafter forwards and decoding cycles each candidate tree needs per image
(with the most frequent skipping, interval 2), and predicts seconds per image as ``verify forwards x verify cost
+ drafter forwards x drafter cost + cycles x runtime cost per cycle``. The skip interval is then chosen by
measured wall-clock among the intervals whose quality stays within AR's seed-to-seed spread.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from vvs.runtime.options import DecodeOptions
from vvs.runtime.pipeline import Pipeline

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


def _time(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure_step_costs(pipe: Pipeline, sizes: list[int], repeats: int = 5) -> tuple[dict[int, float], float]:
    """Median seconds of one verify call per number of new positions (CFG batch of one image, full cache),
    and of one drafter call over ``draft_top_k`` nodes."""
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
        costs[t] = _time(lambda: e.graphs["target_verify"].run(**inputs), repeats)
    k = pipe.options.draft_top_k
    dkv = torch.zeros(e.drafter_layers, 2, rows, cfg.n_head, capacity, cfg.head_dim, dtype=e.dtype, device=e.device)
    dinputs = dict(features=torch.zeros(rows, k, cfg.dim, dtype=e.dtype, device=e.device),
                   input_ids=torch.zeros(rows, k, dtype=torch.long, device=e.device),
                   position_ids=torch.full((rows, k), cfg.max_positions - 1, device=e.device),
                   attn_mask=torch.ones(rows, 1, k, capacity + k, dtype=torch.bool, device=e.device), past_kv=dkv,
                   cfg_mix=mix, temperature=torch.ones(1, device=e.device),
                   top_k=torch.zeros(1, dtype=torch.long, device=e.device), top_p=torch.ones(1, device=e.device))
    return costs, _time(lambda: e.graphs["drafter_step"].run(**dinputs), repeats)


def interpolate(costs: dict[int, float], t: int) -> float:
    xs = sorted(costs)
    if t <= xs[0]:
        return costs[xs[0]]
    for lo, hi in zip(xs, xs[1:]):
        if t <= hi:
            return costs[lo] + (costs[hi] - costs[lo]) * (t - lo) / (hi - lo)
    return costs[xs[-1]] * t / xs[-1]


def choose_tree(verify_cost: dict[int, float], drafter_cost: float, forwards: dict[tuple[int, int, int], tuple],
                cycle_cost: float = 0.0) -> TreeChoice:
    """The candidate with the lowest predicted seconds per image. ``forwards[(tree, depth, k)]`` = measured
    (target forwards, drafter forwards[, cycles]) per image; a verification after a skip also carries the
    skipped chain (up to depth + 1 tokens)."""
    best = None
    for (tree, depth, k), measured in forwards.items():
        target_fw, drafter_fw = measured[:2]
        cycles = measured[2] if len(measured) > 2 else target_fw
        seconds = (target_fw * interpolate(verify_cost, tree + depth + 1) + drafter_fw * drafter_cost
                   + cycles * cycle_cost)
        if best is None or seconds < best.predicted_seconds:
            best = TreeChoice(tree, depth, k, seconds)
    return best


def measure_forwards(pipe: Pipeline, classes: torch.Tensor, base: dict, candidates=TREE_CANDIDATES, seed: int = 0):
    """Per candidate tree, on a few images: (target forwards, drafter forwards, cycles) per image; and the
    runtime's own seconds per cycle (time outside the graphs), median over candidates."""
    out, per_cycle = {}, []
    for tree, depth, k in candidates:
        if k > pipe.engines.max_draft_top_k:
            continue
        g = pipe.generate(classes, seed=seed, decode_images=False, tree_size=tree, depth=depth, draft_top_k=k, **base)
        n = len(g.stats)
        cycles = sum(len(s.trace) for s in g.stats)
        out[(tree, depth, k)] = (sum(s.target_forwards for s in g.stats) / n,
                                 sum(s.drafter_forwards for s in g.stats) / n, cycles / n)
        per_cycle.append(sum(s.other_seconds for s in g.stats) / cycles)
    return out, statistics.median(per_cycle)


def tune(pipe: Pipeline, classes: list[int], seeds: int, instruments=None, log=print) -> DecodeOptions:
    """Choose the tree from predicted cost, then the skip interval by measured speed within AR's quality spread."""
    from vvs.bench import Setting, run_benchmark, within_ar_spread

    labels = torch.tensor(classes)
    costs, draft_cost = measure_step_costs(pipe, sorted({1, 8, 16, 32, 64, 72}))
    log("verify seconds by new positions: " + ", ".join(f"{t}: {c * 1e3:.2f} ms" for t, c in costs.items())
        + f"; drafter call: {draft_cost * 1e3:.2f} ms")
    base = {"mode": "vvs", "skip_policy": "uniform"}
    forwards, cycle_cost = measure_forwards(pipe, labels[: max(2, len(labels) // 4)], {**base, "skip_interval": 2})
    tree = choose_tree(costs, draft_cost, forwards, cycle_cost)
    log(f"runtime cost per cycle: {cycle_cost * 1e3:.2f} ms; tree: size {tree.tree_size}, depth {tree.depth}, "
        f"top-k {tree.draft_top_k} (predicted {tree.predicted_seconds:.3f} s/image)")
    chosen = {"tree_size": tree.tree_size, "depth": tree.depth, "draft_top_k": tree.draft_top_k}
    settings = [Setting("ar", {"mode": "ar"})] + [
        Setting(f"vvs[skip_interval={i}]", {**base, **chosen, "skip_interval": i}) for i in SKIP_CANDIDATES]
    results, _ = run_benchmark(pipe, settings, classes, seeds, batch_size=1, instruments=instruments)
    modes = results["modes"]
    ok = [s for s in settings[1:] if within_ar_spread(modes[s.label], modes["ar"])]
    pick = max(ok or settings[1:], key=lambda s: modes[s.label]["speedup_vs_ar"])
    log(f"skip interval {pick.overrides['skip_interval']}: {modes[pick.label]['speedup_vs_ar']:.2f}x vs ar"
        + ("" if ok else " (no interval stayed within AR's quality spread; kept the fastest)"))
    return pipe.options.updated(**pick.overrides)
