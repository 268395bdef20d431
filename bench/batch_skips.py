"""What a skipped verification saves at batch > 1 (for docs/performance.md).

Usage: python bench/batch_skips.py --engine engines [--batches 1,4,8] [--images 8] [--mode ar,vvs] [--threads 2]

Decodes the same ``--images`` classes and seeds at each batch size and reports, per image: target row-forwards
(the verify forwards its rows took part in), the batch's verify calls (what each image would cost if skipping
images rode along, as before verify forwards ran only over the verifying images), TPF, seconds, and how many
images differ from the batch-1 tokens (randomness and decisions are per image, so only floating-point differences
between kernels at different batch sizes can make them differ).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402


class CountingEngine:
    def __init__(self, inner, groups: int):
        self.inner, self.spec, self.groups = inner, inner.spec, groups
        self.calls = self.rows = 0

    def run(self, **inputs):
        self.calls += 1
        self.rows += inputs["input_ids"].shape[0] // self.groups
        return self.inner.run(**inputs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", default="engines")
    parser.add_argument("--backend", default="onnxruntime")
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--mode", default="ar,vvs")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    engines = load_engines(args.engine, args.backend, threads=args.threads)
    pipe = Pipeline(engines)
    groups = 2 if pipe.options.guided else 1
    counter = CountingEngine(engines.graphs["target_verify"], groups)
    engines.graphs["target_verify"] = counter
    classes = [i % engines.target.num_classes for i in range(args.images)]
    pipe.generate(torch.tensor(classes[:1]), mode="vvs", decode_images=False)  # warm-up
    print("| mode | batch | target row-forwards / image | batch verify calls / image | TPF | s / image | "
          "images differing from batch 1 |")
    print("|---|---|---|---|---|---|---|")
    reference = {}
    for mode in args.mode.split(","):
        for batch in map(int, args.batches.split(",")):
            counter.calls = counter.rows = 0
            tokens, stats, calls = [], [], 0
            start = time.perf_counter()
            for first in range(0, args.images, batch):
                before = counter.calls
                gen = pipe.generate(torch.tensor(classes[first : first + batch]), mode=mode, seed=first,
                                    decode_images=False)
                calls += (counter.calls - before) * len(gen.stats)
                tokens.append(gen.tokens)
                stats += gen.stats
            seconds = (time.perf_counter() - start) / args.images
            tokens = torch.cat(tokens)
            differing = int((reference.setdefault(mode, tokens) != tokens).any(1).sum())
            tpf = sum(s.tokens for s in stats) / sum(s.target_forwards for s in stats)
            print(f"| {mode} | {batch} | {(counter.rows + args.images) / args.images:.1f} | "
                  f"{calls / args.images + 1:.1f} | {tpf:.2f} | {seconds:.2f} | {differing} of {args.images} |")
    print(f"(both counts include the prefill; totals over {args.images} images divided by {args.images})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
