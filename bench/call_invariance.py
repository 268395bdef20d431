"""Does a position's logits depend on the call that computes it? Teacher-forces one image's greedy ``ar`` tokens
through an engine folder's own target graphs three ways, as the runtime calls them -- one-position steps
against the static KV buffer (``ar``), windows of ``--window`` positions (``sjd``, ``sjd-pac``, ``gsd``), and the
same steps beside other images of a batch -- and prints, per way, how many positions' logits differ from the
steps' bitwise, the largest difference, and how many change the greedy token.

Usage: python bench/call_invariance.py FOLDER [--class 0] [--window 16] [--batch 4] [--threads 1]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.runtime.options import DecodeOptions  # noqa: E402
from vvs.runtime.pipeline import Pipeline, as_conditions  # noqa: E402
from vvs.runtime.sampling import cfg_matrix  # noqa: E402


def greedy_tokens(engines, conditions) -> torch.Tensor:
    pipe = Pipeline(engines, DecodeOptions.from_dict(engines.default_options))
    return pipe.generate(conditions, mode="ar", temperature=0, decode_images=False).tokens


def prefilled(engines, conditions, cfg: float):
    """The prefill's guided logits and a static KV buffer holding the condition slots, as the runtime lays it."""
    C, N = engines.target.cls_token_num, engines.target.num_image_tokens
    rows = torch.cat([conditions, engines.conditioning.null(engines, conditions, None)[0]])
    mask = torch.ones(len(rows), 1, C, C, dtype=torch.bool).tril()
    first = engines.graphs["target_prefill"].run(condition=rows, attn_mask=mask,
                                                 cfg_mix=cfg_matrix(len(conditions), cfg))
    new_kv = first["new_kv"]
    kv = torch.zeros(*new_kv.shape[:4], C + N + 1, new_kv.shape[-1], dtype=new_kv.dtype)
    kv[..., :C, :] = new_kv
    return first["logits"], kv


def verify(engines, kv, tokens, start: int, width: int, cfg: float) -> torch.Tensor:
    """Guided logits of positions ``start .. start + width - 1`` of the image stream, in one call, against the
    buffer's first ``C + start`` slots; writes their keys/values to their slots."""
    C = engines.target.cls_token_num
    n = tokens.shape[0]
    rows = kv.shape[2]
    ids = tokens[:, start:start + width].repeat(rows // n, 1)
    positions = (C + start + torch.arange(width)).expand(rows, -1).contiguous()
    past = (torch.arange(kv.shape[4]) < C + start).expand(rows, 1, width, -1)
    new = torch.ones(width, width, dtype=torch.bool).tril().expand(rows, 1, -1, -1)
    out = engines.graphs["target_verify"].run(input_ids=ids, position_ids=positions,
                                              attn_mask=torch.cat([past, new], -1).contiguous(), past_kv=kv,
                                              cfg_mix=cfg_matrix(n, cfg))
    kv[..., C + start:C + start + width, :] = out["new_kv"]
    return out["logits"]


def walk(engines, conditions, tokens, width: int, cfg: float) -> torch.Tensor:
    """``[n, N, V]`` logits of every image position, computed ``width`` positions a call."""
    first, kv = prefilled(engines, conditions, cfg)
    N = tokens.shape[1]
    parts = [first[:, None]]
    for start in range(0, N - 1, width):
        parts.append(verify(engines, kv, tokens, start, min(width, N - 1 - start), cfg))
    return torch.cat(parts, 1)


def compare(name: str, steps: torch.Tensor, other: torch.Tensor) -> None:
    differ = (steps != other).any(-1)
    flips = (steps.argmax(-1) != other.argmax(-1))
    print(f"{name:<24} positions differing {int(differ.sum()):>5} of {differ.numel()}; largest |diff| "
          f"{(steps - other).abs().max().item():.3g}; greedy token changed at {int(flips.sum())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--class", dest="label", type=int, default=0)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    engines = load_engines(args.folder, "onnxruntime", threads=args.threads)
    cfg = DecodeOptions.from_dict(engines.default_options).cfg_scale
    conditions = as_conditions(list(range(args.label, args.label + args.batch)))
    tokens = greedy_tokens(engines, conditions)
    with torch.no_grad():
        steps = walk(engines, conditions[:1], tokens[:1], 1, cfg)
        compare(f"window of {args.window}", steps, walk(engines, conditions[:1], tokens[:1], args.window, cfg))
        compare(f"steps beside {args.batch - 1} images", steps,
                walk(engines, conditions, tokens, 1, cfg)[:1])
        compare("one call for the image", steps, walk(engines, conditions[:1], tokens[:1], tokens.shape[1], cfg))


if __name__ == "__main__":
    main()
