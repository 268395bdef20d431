"""How often a mode commits a code that the target's filtered distribution gives probability 0.

A skipped cycle commits the drafter's path without the target, and LANTERN's neighbours and GSD's group lend mass to
a drafted code; with top-k and top-p on, any of them could commit a code outside the target's filtered support, and
vvs refuses all three (the verification after a skip withdraws such a code; lending goes only to codes the filter
keeps). This decodes the shipped class-conditional pair with ``sd``, ``lantern``, ``vvs-uniform``, ``gsd`` and
SJD-PAC's released walk (``sjd-pac-official``), teacher-forces the target on the committed tokens with the same
guidance and filter, and counts committed codes of probability 0 (and the withdrawals that kept VVS's count at 0).

Usage: python bench/unverified_support.py [--engine engines] [--images 32] [--top-k 100] [--top-p 0.8]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.discrete.folder_models import folder_target  # noqa: E402
from vvs.engines import load_engines  # noqa: E402
from vvs.engines.manifest import read_manifest  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402
from vvs.runtime.sampling import Processor, cfg_matrix, mix  # noqa: E402


@torch.no_grad()
def zero_probability_codes(target, classes: torch.Tensor, tokens: torch.Tensor, cfg: float, proc: Processor) -> int:
    n = len(classes)
    cond = torch.cat([classes, target.null_condition(classes)])
    out = target.teacher_forced(cond, tokens.repeat(2, 1))
    logits = mix(cfg_matrix(n, cfg), out.logits[:, target.config.cls_token_num - 1 : -1])
    probs = proc.probs(logits)
    return int((probs.gather(-1, tokens[..., None]) == 0).sum())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="engines")
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--top-p", type=float, default=0.8)
    args = parser.parse_args()
    torch.set_num_threads(2)
    engines = load_engines(Path(args.engine), "onnxruntime", threads=2)
    target = folder_target(Path(args.engine), read_manifest(Path(args.engine)))
    pipe = Pipeline(engines, max_batch=8)
    classes = torch.arange(args.images) % target.config.num_classes
    settings = dict(temperature=1.0, top_k=args.top_k, top_p=args.top_p)
    proc = Processor(1.0, args.top_k, args.top_p)
    runs = (("sd", "sd", {}), ("lantern", "lantern", {}), ("vvs-uniform", "vvs", {"skip_policy": "uniform"}),
            ("gsd", "gsd", {}), ("sjd-pac-official", "sjd-pac", {"pac_rule": "official"}))
    for name, mode, extra in runs:
        result = pipe.generate(classes, mode=mode, seed=0, decode_images=False, **settings, **extra)
        zeros = zero_probability_codes(target, classes, result.tokens, pipe.options.cfg_scale, proc)
        total = result.aggregate()
        print(f"{name}: {zeros} of {result.tokens.numel()} committed codes have target probability 0 "
              f"(top-k {args.top_k}, top-p {args.top_p}, cfg {pipe.options.cfg_scale}; "
              f"{total['skipped_verifications']} skipped verifications, {total['withdrawals']} withdrawals of "
              f"{total['withdrawn_tokens']} tokens)")
    pipe.close()


if __name__ == "__main__":
    main()
