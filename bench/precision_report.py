"""One precision against another on ONNX Runtime CPU (for docs/performance.md; TPF and quality come from
vvs-bench on both folders): logit error and top-1 agreement of the verify graph on real decoding inputs, and the
pixel error of the VQ decoder on the decoded images.

Usage: python bench/precision_report.py --reference engines-fp16 --candidate engines-int8 [--images 8]
       [--prompts docs/img/t2i_prompts.txt]  (a folder that takes prompts)

The inputs are the verify calls of an actual greedy SD run on the reference folder (trees over real prefixes), each
also run through the candidate's verify graph (cast to its dtypes; ``vvs.quality.TargetCallComparison``), and that
run's tokens decoded by both. For weight-only int8/int4 folders against fp32 on sampled AR decodes, with the quality
instruments: bench/weight_quality.py.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.quality import TargetCallComparison  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402


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
    if args.prompts:
        lines = [line.strip() for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        labels = [lines[i % len(lines)] for i in range(args.images)]
    else:
        labels = torch.arange(args.images) % ref.target.num_classes
    with TargetCallComparison(ref, {"candidate": cand}, graphs=("target_verify",)) as comparison:
        gen = Pipeline(ref).generate(labels, mode="sd", temperature=0, seed=0, decode_images=False)
    c = comparison.summary()["candidate"]
    print(f"verify calls compared: {c['calls']}")
    print(f"max |logit error|: median {c['max_logit_error']['median']:.3f}, worst {c['max_logit_error']['worst']:.3f} "
          f"(relative to max |logit|: median {c['relative_logit_error']:.3%})")
    print(f"top-1 agreement with the reference: {c['top1_agreement']:.3%} of positions, worst call "
          f"{c['top1_agreement_worst_call']:.3%}; KL(reference || candidate) {c['kl']:.4f} nats per position")
    pixels_a = ref.graphs["vq_decode"].run(codes=gen.tokens)["image"]
    pixels_b = cand.graphs["vq_decode"].run(codes=gen.tokens)["image"]
    mse = float(((pixels_a - pixels_b) ** 2).mean())
    print(f"VQ decoder: max |pixel error| {float((pixels_a - pixels_b).abs().max()) * 255:.2f} / 255, "
          f"PSNR {10 * math.log10(1 / max(mse, 1e-20)):.1f} dB against the reference")


if __name__ == "__main__":
    main()
