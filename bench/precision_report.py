"""One precision against another on ONNX Runtime CPU (for docs/performance.md; TPF and quality come from
vvs-bench on both folders): logit error and top-1 agreement of the verify graph on real decoding inputs, and the
pixel error of the VQ decoder on the decoded images.

Usage: python bench/precision_report.py --reference engines-fp16 --candidate engines-int8 [--images 8]
       [--prompts docs/img/t2i_prompts.txt]  (a folder that takes prompts)

The inputs are the verify calls of an actual greedy SD run on the reference folder (trees over real prefixes),
replayed on both folders' verify graphs (cast to each folder's dtypes), and that run's tokens decoded by both.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402


class Recorder:
    def __init__(self, inner, keep: list):
        self.inner, self.spec, self.keep = inner, inner.spec, keep

    def run(self, **inputs):
        self.keep.append({k: v.clone() for k, v in inputs.items()})
        return self.inner.run(**inputs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", default="engines")
    parser.add_argument("--candidate", default="engines-int8")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", default=None, help="a prompts file, for folders that take prompts")
    args = parser.parse_args()
    ref = load_engines(args.reference, "onnxruntime", threads=args.threads)
    cand = load_engines(args.candidate, "onnxruntime", threads=args.threads)
    calls: list[dict] = []
    ref.graphs["target_verify"] = Recorder(ref.graphs["target_verify"], calls)
    if args.prompts:
        lines = [line.strip() for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        labels = [lines[i % len(lines)] for i in range(args.images)]
    else:
        labels = torch.arange(args.images) % ref.target.num_classes
    gen = Pipeline(ref).generate(labels, mode="sd", temperature=0, seed=0, decode_images=False)
    errors, rel, agree = [], [], []
    for inputs in calls[:: max(1, len(calls) // 40)]:
        a = ref.graphs["target_verify"].inner.run(**inputs)["logits"]
        b = cand.graphs["target_verify"].run(**{k: v.to(cand.dtype) if v.is_floating_point() and k != "cfg_mix"
                                                 else v for k, v in inputs.items()})["logits"]
        errors.append(float((a - b).abs().max()))
        rel.append(float((a - b).abs().max() / a.abs().max()))
        agree.append(float((a.argmax(-1) == b.argmax(-1)).float().mean()))
    print(f"verify calls compared: {len(errors)}")
    print(f"max |logit error|: median {statistics.median(errors):.3f}, worst {max(errors):.3f} "
          f"(relative to max |logit|: median {statistics.median(rel):.3%})")
    print(f"top-1 agreement with the reference: mean {statistics.fmean(agree):.3%}, worst call {min(agree):.3%}")
    pixels_a = ref.graphs["vq_decode"].run(codes=gen.tokens)["image"]
    pixels_b = cand.graphs["vq_decode"].run(codes=gen.tokens)["image"]
    mse = float(((pixels_a - pixels_b) ** 2).mean())
    print(f"VQ decoder: max |pixel error| {float((pixels_a - pixels_b).abs().max()) * 255:.2f} / 255, "
          f"PSNR {10 * math.log10(1 / max(mse, 1e-20)):.1f} dB against the reference")


if __name__ == "__main__":
    main()
