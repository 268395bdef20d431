"""Per-call costs at an official size with the official vocabulary: a target step, verifies of several widths,
one ``draft_tree`` call per tree shape (as a fraction of a target step), and the runtime's own milliseconds per
cycle. Random weights (per-call costs do not depend on the values; acceptance does, so speed-ups come from
``vvs-bench --scale``); ONNX Runtime CPU, one image with guidance.

Usage: python bench/call_costs.py [--size GPT-B] [--vocab 16384] [--folder DIR] [--drafter-weights int8|int4]
[--threads 2] [--json F]

The folder (default ``engines-random-GPT-B``) is exported once and reused; ``--folder`` of an existing engine
folder measures that one. Runtime per cycle comes from decoding one image per tree shape with ``vvs`` (uniform
skips every 3rd cycle, after one warm-up image), split into draft / verify / other by the pipeline's own clock.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vvs.engines import load_engines  # noqa: E402
from vvs.engines.manifest import MANIFEST  # noqa: E402
from vvs.runtime.options import DecodeOptions, TreeShape  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402
from vvs.runtime.sampling import Processor  # noqa: E402
from vvs.tune import median_seconds  # noqa: E402

SHAPES = [TreeShape(4, 2, 1), TreeShape(59, 4, 10)]  # the chain --tune picks on CPU; EAGLE-2's published tree


def export_random(size: str, vocab: int, folder: Path, drafter_weights: str = "fp32") -> None:
    from vvs.discrete.bundle import ModelBundle
    from vvs.discrete.drafter import Drafter, DrafterConfig
    from vvs.discrete.exporter import export_folder
    from vvs.families.llamagen.gpt import GPT, gpt_config
    from vvs.models.vq import VQModel, vq_config

    torch.manual_seed(0)
    target = GPT(gpt_config(size, vocab_size=vocab)).eval()
    drafter = Drafter(DrafterConfig.for_target(target.config), target.config).eval()
    vq = VQModel(vq_config("VQ-tiny", codebook_size=vocab)).eval()  # decoding pixels is not measured here
    export_folder(ModelBundle(target, drafter, vq, "llamagen"), folder, force=True, drafter_weights=drafter_weights,
                  decoding_defaults=dict(zip(("tree_size", "depth", "draft_top_k"), SHAPES[0])))


def verify_cost(engines, width: int, repeats: int) -> float:
    cfg = engines.target
    rows, capacity = 2, cfg.max_positions + 12
    kv = torch.zeros(cfg.n_layer, 2, rows, cfg.n_head, capacity, cfg.head_dim, dtype=engines.dtype)
    inputs = dict(input_ids=torch.zeros(rows, width, dtype=torch.long),
                  position_ids=torch.full((rows, width), cfg.max_positions - 1),
                  attn_mask=torch.ones(rows, 1, width, capacity + width, dtype=torch.bool), past_kv=kv,
                  cfg_mix=torch.tensor([[3.0, -2.0]]))
    return median_seconds(lambda: engines.graphs["target_verify"].run(**inputs), repeats)


def draft_cost(engines, tree: TreeShape, repeats: int, **filters) -> float:
    """One ``draft_tree`` call as a decoding cycle makes it: a full drafter cache, the widest stable update;
    ``filters``: sampling settings other than the defaults (top-k and top-p together select top-k's survivors)."""
    cfg, e = engines.target, engines.draft_tree(tree)
    rows, m = 2, tree.depth + 2
    slots = cfg.max_positions + 2 * m
    opts = DecodeOptions(**filters)
    processor = Processor(opts.temperature, opts.top_k, opts.top_p, vocab_size=cfg.vocab_size)
    inputs = dict(features=torch.randn(rows, m, cfg.dim, dtype=engines.dtype),
                  input_ids=torch.randint(0, cfg.vocab_size, (rows, m)),
                  position_ids=torch.arange(cfg.max_positions - 40, cfg.max_positions - 40 + m).expand(rows, -1),
                  past_kv=torch.randn(engines.drafter_layers, 2, rows, cfg.n_head, slots, cfg.head_dim,
                                      dtype=engines.dtype),
                  past_len=torch.tensor([cfg.max_positions - 40]), new_count=torch.tensor([m]),
                  root_position=torch.tensor([cfg.max_positions - 40 + m - 1]), cfg_mix=torch.tensor([[3.0, -2.0]]),
                  **processor.graph_inputs())
    return median_seconds(lambda: e.run(**inputs), repeats)


def runtime_split(pipe: Pipeline, tree: TreeShape) -> dict:
    options = dict(mode="vvs", skip_policy="uniform", skip_interval=3, tree_size=tree.tree_size, depth=tree.depth,
                   draft_top_k=tree.draft_top_k)
    pipe.generate(torch.tensor([1]), seed=1, decode_images=False, **options)  # warm-up: buffers, tables, sessions
    s = pipe.generate(torch.tensor([0]), seed=0, decode_images=False, **options).stats[0]
    cycles = len(s.trace)
    return {"cycles": cycles, "draft_ms": s.draft_seconds / cycles * 1e3, "verify_ms": s.verify_seconds / cycles * 1e3,
            "other_ms": s.other_seconds / cycles * 1e3}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="GPT-B")
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--folder", default=None)
    parser.add_argument("--drafter-weights", default="fp32", choices=("fp32", "int8", "int4"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-decode", action="store_true", help="skip the runtime-per-cycle decodes")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = Path(args.folder or f"engines-random-{args.size}" + ("" if args.drafter_weights == "fp32" else f"-{args.drafter_weights}"))
    if not (folder / MANIFEST).is_file():
        export_random(args.size, args.vocab, folder, args.drafter_weights)
    engines = load_engines(folder, "onnxruntime", threads=args.threads)
    step = verify_cost(engines, 1, args.repeats)
    result = {"folder": str(folder), "target_step_ms": step * 1e3, "verify_ms": {}, "draft_tree": {}}
    print(f"target step (1 new position): {step * 1e3:.1f} ms")
    for width in (4, 8, 64):
        result["verify_ms"][width] = verify_cost(engines, width, args.repeats) * 1e3
        print(f"verify {width} positions: {result['verify_ms'][width]:.1f} ms "
              f"({result['verify_ms'][width] / (step * 1e3):.2f} steps)")
    pipe = Pipeline(engines, max_batch=1)
    for tree in SHAPES:
        cost = draft_cost(engines, tree, args.repeats)
        entry = {"ms": cost * 1e3, "steps": cost / step}
        if not args.no_decode:
            entry.update(runtime_split(pipe, tree))
        filtered = draft_cost(engines, tree, args.repeats, top_k=1000, top_p=0.9)
        entry["with_top_k_1000_top_p_0.9_ms"] = filtered * 1e3
        result["draft_tree"][tree.name] = entry
        print(f"draft_tree {tree.name}: {cost * 1e3:.1f} ms = {cost / step:.2f} target steps "
              f"({filtered * 1e3:.1f} ms with top-k 1000 and top-p 0.9)"
              + ("" if args.no_decode else f"; decoding: {entry['cycles']} cycles, draft {entry['draft_ms']:.1f} / "
                 f"verify {entry['verify_ms']:.1f} / runtime {entry['other_ms']:.1f} ms per cycle"))
    pipe.close()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
