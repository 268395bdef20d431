"""Per-graph step latency, backends side by side in one process (for docs/performance.md).

Usage: python bench/step_latency.py --engine engines [--backends onnxruntime,torch] [--threads 2]

Times every graph at the shapes the decoding loop uses (the draft_tree call for the prefill's slots and for a
cycle's stable update, verify at 1 / tree / chain + tree, one image with guidance, full KV capacity), median of
--repeats calls, backends interleaved per shape.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.engines.buckets import buckets  # noqa: E402
from vvs.export.spec import sample_inputs  # noqa: E402
from vvs.runtime.cache import KVCache  # noqa: E402
from vvs.runtime.options import DecodeOptions  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", default="engines")
    parser.add_argument("--backends", default="onnxruntime,torch")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    backends = {b: load_engines(args.engine, b, threads=args.threads) for b in args.backends.split(",")}
    first = next(iter(backends.values()))
    cfg, opts = first.target, DecodeOptions.from_dict(first.default_options)
    past = KVCache.slots(cfg.max_positions + 2 * opts.max_path_tokens)
    shapes = [("target_prefill", None), *(("draft_tree", n) for n in buckets("draft_tree", cfg.cls_token_num, opts)),
              *(("target_verify", n) for n in buckets("target_verify", cfg.cls_token_num, opts)), ("vq_decode", None)]
    print(f"| graph | new | {' | '.join(f'{b} ms' for b in backends)} |")
    print("|---|---|" + "---|" * len(backends))
    for name, new in shapes:
        spec = first.graphs[name].spec
        dims = dict(batch=2, images=1, new=new or 1, past=past)
        inputs = dict(zip(spec.input_names, sample_inputs(spec, cfg.vocab_size, cfg.max_positions - 1, dims)))
        samples = {b: [] for b in backends}
        for b, e in backends.items():
            e.graphs[name].run(**inputs)  # warm-up
        for _ in range(args.repeats):
            for b, e in backends.items():
                start = time.perf_counter()
                e.graphs[name].run(**inputs)
                samples[b].append((time.perf_counter() - start) * 1e3)
        label = "-" if new is None else f"{new} (AR step)" if (name, new) == ("target_verify", 1) else str(new)
        print(f"| {name} | {label} | " + " | ".join(f"{statistics.median(samples[b]):.2f}" for b in backends) + " |")


if __name__ == "__main__":
    main()
