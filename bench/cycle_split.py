"""Where a speculative cycle's time goes: per setting, seconds per image and, per cycle, drafting / verifying /
other (runtime) milliseconds and engine calls, ONNX Runtime CPU by default, batch 1, settings interleaved.

Usage: python bench/cycle_split.py --engine engines [--images 8] [--threads 2] [--json out.json]

Settings: ar; sd, lantern, vvs-uniform, vvs-dynamic with the folder's tree; lantern and vvs-uniform with the
tree the first --tune picked on this machine (4 nodes, depth 2, top-k 2; skip interval 3), and vvs-uniform with
the one it picks since drafting costs one call per cycle (a chain: 4 nodes, depth 2, top-k 1; skip interval 3).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.runtime.options import DecodeOptions  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402

SMALL_TREE = dict(tree_size=4, depth=2, draft_top_k=2)
SETTINGS = {
    "ar": dict(mode="ar"),
    "sd": dict(mode="sd"),
    "lantern": dict(mode="lantern"),
    "vvs-uniform": dict(mode="vvs", skip_policy="uniform"),
    "vvs-dynamic": dict(mode="vvs", skip_policy="dynamic"),
    "lantern 4x2x2": dict(mode="lantern", **SMALL_TREE),
    "vvs-uniform 4x2x2 skip 3": dict(mode="vvs", skip_policy="uniform", skip_interval=3, **SMALL_TREE),
    "vvs-uniform 4x2x1 skip 3": dict(mode="vvs", skip_policy="uniform", skip_interval=3, tree_size=4, depth=2,
                                     draft_top_k=1),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="engines")
    parser.add_argument("--backend", default="onnxruntime")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engines = load_engines(args.engine, args.backend, threads=args.threads)
    pipe = Pipeline(engines, DecodeOptions.from_dict(engines.default_options), max_batch=1)
    classes = engines.target.num_classes
    for options in SETTINGS.values():  # warm-up (and any tree graph's export)
        pipe.generate(torch.tensor([0]), seed=10_000, decode_images=False, **options)
    runs = {name: [] for name in SETTINGS}
    for i in range(args.images):
        for name, options in SETTINGS.items():
            s = pipe.generate(torch.tensor([i % classes]), seed=i, decode_images=False, **options).stats[0]
            cycles = len(s.trace)
            runs[name].append({"seconds": s.seconds, "cycles": cycles, "tpf": s.tokens_per_target_forward,
                               "draft_ms": s.draft_seconds / cycles * 1e3, "verify_ms": s.verify_seconds / cycles * 1e3,
                               "other_ms": s.other_seconds / cycles * 1e3,
                               "calls": (s.drafter_forwards + s.verify_forwards) / cycles})
    pipe.close()
    table = {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for name, rows in runs.items()}
    ar = table["ar"]["seconds"]
    print("| setting | s/img | vs ar | TPF | cycles/img | engine calls/cycle | draft ms/cycle | verify ms/cycle | "
          "other ms/cycle |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, m in table.items():
        print(f"| {name} | {m['seconds']:.3f} | {ar / m['seconds']:.2f}x | {m['tpf']:.2f} | {m['cycles']:.0f} | "
              f"{m['calls']:.2f} | {m['draft_ms']:.2f} | {m['verify_ms']:.2f} | {m['other_ms']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"medians": table, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
