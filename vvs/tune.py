"""``vvs-bench --tune``: pick the draft tree, skip setting, drafter-free windows and default mode that are fastest on
*this* backend and machine.

On a GPU a 60-node verification costs about as much as a 1-token step; on a CPU it costs several times more.
The tuner therefore measures the backend's verify cost against the number of new positions, then decodes a few
images with each candidate tree (with the most frequent skipping, interval 2) to measure its target forwards and
cycles per image and its drafting seconds per cycle (one ``draft_tree`` call, whose cost grows with the tree),
and predicts seconds per image as ``verify forwards x verify cost + cycles x (drafting + runtime cost per
cycle)``. The drafter-free modes (``sjd``, ``sjd-pac``, ``gsd``) are sized the same way: each candidate window
(and SJD-PAC tree width) decodes a few images, and seconds per image are predicted as ``target forwards x
(verify cost at the window's length + runtime cost per forward)``. One benchmark then races every mode at its
choice, and every skip interval: the skip interval is chosen by measured wall-clock among the intervals whose
quality stays within AR's seed-to-seed spread, and the fastest exact mode measured becomes the folder's default
mode (the fastest of all modes is recorded beside it).
"""
from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import torch

from vvs.runtime.options import EXACT_MODES, DecodeOptions
from vvs.runtime.pipeline import Pipeline, as_conditions

TREE_CANDIDATES = [  # (tree_size, depth, draft_top_k): from one-draft chains to EAGLE-2's published tree
    (2, 0, 1), (3, 0, 2), (3, 1, 1), (4, 2, 1), (4, 2, 2), (6, 3, 2), (8, 3, 3), (12, 4, 3), (16, 4, 4), (24, 4, 5),
    (32, 5, 6), (48, 4, 8), (59, 4, 10),
]
SKIP_CANDIDATES = [2, 3, 4, 5, 8]
# the windows the drafter-free modes try: from the 16 tokens SJD and GSD publish to SJD-PAC's 64. None is shorter:
# a folder stores one window for the three modes, and a shorter one leaves no room for SJD-PAC's published tree
# (13 nodes); a window longer than the image is left out
WINDOWS = (16, 24, 32, 48, 64)
PAC_TREE_WIDTHS = (1, 2, 3)  # SJD-PAC's candidates per tree position: 1 drafts a plain chain, 3 is the paper's
WINDOW_CANDIDATES = {  # mode -> the options each candidate gives it
    "sjd": [{"window": w} for w in WINDOWS],
    "sjd-pac": [{"window": w, "pac_tree_width": k} for w in WINDOWS for k in PAC_TREE_WIDTHS],
    "gsd": [{"window": w} for w in WINDOWS],
}
DRAFTER_MODES = ("sd", "lantern", "vvs-dynamic")  # raced at the tuned tree (vvs-uniform: at each skip interval)
TREE_COST_SIZES = (1, 8, 16, 32, 64, 72)  # new positions of the verify-cost curve the trees are read from


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


def measure_windows(pipe: Pipeline, classes: torch.Tensor, mode: str, candidates: list[dict], seed: int = 0):
    """Per candidate of a window mode (its index in ``candidates``), on a few images: (target forwards per image,
    the runtime's own seconds per forward, outside the graphs). No warm-up decode, as the trees have: a window's
    graph time is read from the verify-cost curve, not from these decodes."""
    out = {}
    for i, options in enumerate(candidates):
        g = pipe.generate(classes, seed=seed, decode_images=False, mode=mode, **options)
        forwards = sum(s.target_forwards for s in g.stats)
        out[i] = (forwards / len(g.stats), sum(s.other_seconds for s in g.stats) / forwards)
    return out


def predict_windows(verify_cost: dict[int, float], candidates: list[dict],
                    measured: dict[int, tuple[float, float]]) -> list[dict]:
    """Each candidate's options with its measurement and predicted seconds per image: every target forward costs
    the verify call at the window's length plus the runtime's own time per forward."""
    return [{**candidates[i], "target_forwards_per_image": forwards, "runtime_seconds_per_forward": overhead,
             "predicted_seconds_per_image": forwards * (interpolate(verify_cost, candidates[i]["window"]) + overhead)}
            for i, (forwards, overhead) in measured.items()]


def tune_windows(pipe: Pipeline, classes: torch.Tensor, costs: dict[int, float], log=print) -> dict[str, dict]:
    """Per drafter-free mode: the predicted-fastest candidate's options and every candidate's prediction."""
    image_tokens = pipe.engines.target.num_image_tokens
    chosen = {}
    for mode, table in WINDOW_CANDIDATES.items():
        candidates = [c for c in table if c["window"] <= image_tokens]
        rows = predict_windows(costs, candidates, measure_windows(pipe, classes, mode, candidates))
        best = min(range(len(rows)), key=lambda i: rows[i]["predicted_seconds_per_image"])
        chosen[mode] = {"options": candidates[best], "candidates": rows,
                        "predicted_seconds_per_image": rows[best]["predicted_seconds_per_image"]}
        log(f"{mode}: " + ", ".join(f"{name_of(c)} {r['target_forwards_per_image']:.1f} forwards, "
                                    f"{r['predicted_seconds_per_image']:.3f} s" for c, r in zip(candidates, rows))
            + f"; chose {name_of(candidates[best])}")
    return chosen


def name_of(options: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in options.items())


def tune_tree(pipe: Pipeline, classes: torch.Tensor, costs: dict[int, float], log=print) -> TreeChoice:
    measured, cycle_cost = measure_trees(pipe, classes, {"mode": "vvs", "skip_policy": "uniform", "skip_interval": 2})
    log("draft_tree call by tree: "
        + ", ".join(f"{t}x{d}x{k}: {m[2] * 1e3:.2f} ms" for (t, d, k), m in measured.items()))
    tree = choose_tree(costs, measured, cycle_cost)
    log(f"runtime cost per cycle: {cycle_cost * 1e3:.2f} ms; tree: size {tree.tree_size}, depth {tree.depth}, "
        f"top-k {tree.draft_top_k} (predicted {tree.predicted_seconds:.3f} s/image)")
    return tree


def race_settings(tree: TreeChoice | None, windows: dict[str, dict]) -> tuple[list, list]:
    """The settings the benchmark races: ar, VVS at every skip interval and the other drafter modes at the tuned
    tree (with a drafter), each drafter-free mode at its window. Returns ``(settings, the skip interval ones)``."""
    from vvs.bench import Setting

    intervals, others = [], []
    if tree is not None:
        shape = {"tree_size": tree.tree_size, "depth": tree.depth, "draft_top_k": tree.draft_top_k}
        intervals = [Setting(f"vvs[skip_interval={i}]", {"mode": "vvs", "skip_policy": "uniform", **shape,
                                                         "skip_interval": i}) for i in SKIP_CANDIDATES]
        others = [Setting(m, {"mode": m, **shape}) for m in DRAFTER_MODES]
    others += [Setting(m, {"mode": m, **w["options"]}) for m, w in windows.items()]
    return [Setting("ar", {"mode": "ar"}), *intervals, *others], intervals


def pick_interval(modes: dict, intervals: list, log=print) -> tuple[int, list[dict], bool]:
    """The fastest skip interval whose quality stays within AR's spread (else the fastest): its index, every
    interval's row, and whether any stayed within."""
    from vvs.bench import within_ar_spread

    # every interval's row is kept and logged, so a pick can be checked against the ones it beat
    rows = [{"skip_interval": s.overrides["skip_interval"], "speedup_vs_ar": modes[s.label]["speedup_vs_ar"],
             "within_ar_quality_spread": within_ar_spread(modes[s.label], modes["ar"])} for s in intervals]
    for row in rows:
        log(f"skip interval {row['skip_interval']}: {row['speedup_vs_ar']:.2f}x vs ar, "
            + ("inside" if row["within_ar_quality_spread"] else "outside") + " AR's quality spread")
    ok = [i for i, row in enumerate(rows) if row["within_ar_quality_spread"]]
    best = max(ok or range(len(rows)), key=lambda i: rows[i]["speedup_vs_ar"])
    log(f"picked skip interval {rows[best]['skip_interval']}"
        + ("" if ok else " (no interval stayed within AR's quality spread; kept the fastest)"))
    return best, rows, bool(ok)


def tree_record(tree: TreeChoice, modes: dict, intervals: list, log=print) -> tuple[dict, object]:
    """What the tree and skip tuning chose and measured, and the picked VVS setting."""
    best, rows, ok = pick_interval(modes, intervals, log)
    checked = modes[intervals[0].label]  # skip interval 2: the setting the prediction is for
    record = {"tree": {"tree_size": tree.tree_size, "depth": tree.depth, "draft_top_k": tree.draft_top_k},
              "predicted_seconds_per_image": tree.predicted_seconds,
              "measured_seconds_per_image": checked["seconds_per_image"]["median"],
              "skip_interval": rows[best]["skip_interval"], "measured_speedup_vs_ar": rows[best]["speedup_vs_ar"],
              "within_ar_quality_spread": ok, "skip_intervals": rows}
    log(f"predicted {record['predicted_seconds_per_image']:.3f} s/image at skip interval 2, measured "
        f"{record['measured_seconds_per_image']:.3f}")
    return record, intervals[best]


def mode_rows(modes: dict, named: dict) -> dict[str, dict]:
    """Per mode name (-> its raced setting): its options, measured seconds per image and speed-up, whether it is
    exact and whether its quality stayed within AR's spread."""
    from vvs.bench import within_ar_spread

    return {name: {"options": s.overrides, "seconds_per_image": modes[s.label]["seconds_per_image"]["median"],
                   "speedup_vs_ar": modes[s.label]["speedup_vs_ar"], "exact": name in EXACT_MODES,
                   "within_ar_quality_spread": within_ar_spread(modes[s.label], modes["ar"])}
            for name, s in named.items()}


def fastest_modes(rows: dict[str, dict]) -> tuple[str, str]:
    """``(fastest exact mode, fastest mode)`` by measured seconds per image. A lossy mode competes only within AR's
    quality spread; an exact one samples the target's own distribution, so its instruments differ from AR's by
    noise alone."""
    def seconds(name):
        return rows[name]["seconds_per_image"]

    exact = min((m for m in rows if rows[m]["exact"]), key=seconds)
    fastest = min((m for m in rows if rows[m]["exact"] or rows[m]["within_ar_quality_spread"]), key=seconds)
    return exact, fastest


def tune(pipe: Pipeline, classes: list, seeds: int, instruments=None, log=print) -> tuple[DecodeOptions, dict]:
    """Choose the tree (with a drafter) and each drafter-free mode's window from predicted cost, then race every
    mode in one benchmark: the skip interval, the fastest exact mode (the returned options' mode) and the fastest
    mode by measured speed. Returns the options and a record of what was predicted and then measured (the tree's
    prediction is for skip interval 2, the interval its candidates were decoded with, so that row checks it)."""
    from vvs.bench import run_benchmark

    labels = as_conditions(classes)
    few = labels[: max(2, len(labels) // 4)]
    costs = measure_verify_costs(pipe, sorted({*TREE_COST_SIZES, *WINDOWS}))
    log("verify seconds by new positions: " + ", ".join(f"{t}: {c * 1e3:.2f} ms" for t, c in costs.items()))
    tree = tune_tree(pipe, few, costs, log) if pipe.engines.has_drafter else None
    windows = tune_windows(pipe, few, costs, log)
    settings, intervals = race_settings(tree, windows)
    results, _ = run_benchmark(pipe, settings, classes, seeds, batch_size=1, instruments=instruments)
    modes = results["modes"]
    named = {s.label: s for s in settings if s not in intervals}
    record, vvs = {}, None
    if tree is not None:
        record, vvs = tree_record(tree, modes, intervals, log)
        named["vvs-uniform"] = vvs  # at the picked skip interval
    rows = mode_rows(modes, named)
    for mode, w in windows.items():
        w["measured_seconds_per_image"] = rows[mode]["seconds_per_image"]
        log(f"{mode} at {name_of(w['options'])}: predicted {w['predicted_seconds_per_image']:.3f} s/image, "
            f"measured {w['measured_seconds_per_image']:.3f}")
    exact, fastest = fastest_modes(rows)
    log(f"fastest exact mode: {exact} ({rows[exact]['speedup_vs_ar']:.2f}x vs ar); fastest mode within AR's "
        f"quality spread: {fastest} ({rows[fastest]['speedup_vs_ar']:.2f}x vs ar)")
    record.update(windows=windows, modes=rows, fastest_exact_mode=exact, fastest_mode=fastest,
                  measured_on=datetime.now(timezone.utc).date().isoformat(), host=platform.node())
    tuned = pipe.options if vvs is None else pipe.options.updated(**vvs.overrides)
    return tuned.updated(**rows[exact]["options"]), record


def tuned_mode_note(manifest: dict) -> str | None:
    """What vvs-run says when the folder's default mode is the fastest exact mode ``--tune`` measured (None for a
    folder never tuned, tuned before modes were raced, or whose default was changed since)."""
    tuning = manifest.get("tuning") or {}
    mode = tuning.get("fastest_exact_mode")
    if mode is None or manifest["decoding_defaults"].get("mode") != mode:
        return None
    host = "this host" if tuning.get("host") == platform.node() else f"host {tuning.get('host')}"
    return (f"vvs-run: mode {mode} (this folder's fastest exact mode on {host}, measured by vvs-bench --tune on "
            f"{tuning.get('measured_on')})")
