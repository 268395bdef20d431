"""Quality per weight precision of a shipped pair (for docs/performance.md, "Weight-only int8 and int4 targets"):
the target's top-1 agreement and logit error against fp32 on a real decode's calls, and the quality instruments per
seed set, with fp32's seed-set spread as the yardstick.

    .venv/bin/python bench/weight_quality.py --model llamagen|janus-pro|lumina-mgpt [--work runs/quality]
                                             [--out DIR] [--seed-sets 3] [--images N] [--weights fp32,int8,int4,int4-head8,w8a8]

1. Exports the shipped pair once per weight precision (``vvs-export --model M --weights W --out WORK/M-W --force``)
   or reuses the folder when its stamp (``WORK/M-W.export.json``: the command and a hash of the shipped weights'
   records) still matches; ``--reexport`` exports anew.
2. Decodes AR with the folders' decoding defaults (the shipped ones), ONNX Runtime, ``--threads`` threads, seed set
   after seed set, every precision in each. A seed set (``vvs.quality``): class-to-image, classes 0-15 twice (32
   images); text-to-image, each photograph's four shipped captions (64 prompts); image i of set k gets seed
   ``k * size + i`` in every precision. ``--images N`` keeps the first N of each set with the same seeds (a smoke
   run).
3. During fp32's first seed set every ``target_prefill`` and ``target_verify`` call also runs through the other
   precisions' graphs (``vvs.quality.TargetCallComparison``): top-1 agreement pooled over the scored positions and
   its worst call, the largest |logit error| per call (median and worst over calls, and relative to the call's
   largest |logit|), and KL(fp32 || W) of the softmaxed logits per position, the logits guided as sampled.
4. Per seed set the instruments (``vvs.quality.Instruments``) score each precision's images: the share the photo
   classifier assigns to their class (c2i: class accuracy) or to the photograph their prompt describes (t2i:
   recognition rate), the domain FID (compare only sets of the same size), and for the class-conditional model the
   NLL of the tokens under the fp32 target. A precision is within fp32's seed spread when each median is no worse
   than fp32's worst set (``vvs.bench.within_ar_spread``).

Writes ``OUT/table.md``, ``OUT/results.json`` (every seed set's numbers, the seeds, the options, the folders, wall
and CPU seconds per stage) and ``OUT/samples_W.png`` (the first seed set's images per precision).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxruntime  # noqa: E402
import torch  # noqa: E402

from vvs.bench import load_instruments, machine, spread, within_ar_spread  # noqa: E402
from vvs.engines import load_engines  # noqa: E402
from vvs.engines.manifest import read_manifest  # noqa: E402
from vvs.families.base import Family  # noqa: E402
from vvs.output import atomic_write, grid_image, save_png  # noqa: E402
from vvs.quality import Instruments, TargetCallComparison, caption_sets, class_sets  # noqa: E402
from vvs.runtime.pipeline import Pipeline  # noqa: E402
from vvs.shipped import SHIPPED_DIR  # noqa: E402
from vvs.train.shipped import load_classifier  # noqa: E402

MODELS = ("llamagen", "janus-pro", "lumina-mgpt")  # the shipped pairs vvs-export --weights applies to
WEIGHTS = ("fp32", "int8", "int4", "int4-head8", "w8a8")
# the top-1 agreement each precision aims at, and quality within fp32's seed spread
GOAL = {"int4": 0.95, "int4-head8": 0.95, "w8a8": 0.97}


def cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its finished children (the exports)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def commit() -> str | None:
    """The checkout's commit, with ``+`` when its tracked files differ from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root).returncode
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+" if dirty else "")


def shipped_records() -> str:
    """A hash of the shipped weights' records (their sha256 and configs): a folder exported before the weights
    changed is exported anew."""
    digest = hashlib.sha256()
    for path in sorted(SHIPPED_DIR.glob("*.json")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def export_folders(model: str, work: Path, weights: list[str], reexport: bool, log) -> tuple[dict, dict]:
    """``{weights: folder}`` and ``{weights: export record}``, exporting what is missing or stale."""
    work.mkdir(parents=True, exist_ok=True)
    exporter = str(Path(sys.executable).parent / "vvs-export")
    folders, records = {}, {}
    for w in weights:
        folder = work / f"{model}-{w}"
        stamp = work / f"{model}-{w}.export.json"
        command = ["vvs-export", "--model", model, "--weights", w, "--out", str(folder), "--force"]
        want = {"command": command, "shipped_records": shipped_records()}
        old = json.loads(stamp.read_text()) if stamp.is_file() else {}
        if not reexport and (folder / "manifest.json").is_file() and all(old.get(k) == v for k, v in want.items()):
            log(f"{w}: reusing {folder} (exported {old.get('when')})")
            records[w] = {**old, "reused": True}
        else:
            log(f"{w}: {' '.join(command)}")
            wall, cpu = time.time(), cpu_seconds()
            done = subprocess.run([exporter, *command[1:]], capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
            records[w] = {**want, "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                          "wall_seconds": round(time.time() - wall, 1), "cpu_seconds": round(cpu_seconds() - cpu, 1),
                          "says": done.stdout.strip().splitlines()[-2:]}
            atomic_write(stamp, lambda tmp: tmp.write_text(json.dumps(records[w], indent=1) + "\n"))
            records[w]["reused"] = False
            log(f"{w}: exported in {records[w]['wall_seconds']:.0f} s")
        folders[w] = folder
    return folders, records


def cell(entry: dict, key: str, fmt: str) -> str:
    if key not in entry:
        return "-"
    s = entry[key]
    return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"


def markdown(results: dict) -> str:
    rows, c2i = results["weights"], results["conditions"] == "class"
    accuracy = "class accuracy" if c2i else "recognition rate"
    head = ["weights", "top-1 agreement vs fp32 (worst call)", "max \\|logit error\\| per call: median (worst); "
            "relative, median", "KL(fp32 \\|\\| w), nats per position", f"{accuracy}: median [min-max]",
            "domain FID: median [min-max]", "NLL under fp32: median [min-max]", "within fp32's seed spread", "images"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w, e in rows.items():
        a = e.get("agreement")
        agree = "1 (itself)" if w == "fp32" else f"{a['top1_agreement']:.2%} ({a['top1_agreement_worst_call']:.1%})"
        error = "0" if w == "fp32" else (f"{a['max_logit_error']['median']:.3f} ({a['max_logit_error']['worst']:.3f}); "
                                         f"{a['relative_logit_error']:.2%}")
        kl = "0" if w == "fp32" else f"{a['kl']:.4f}"
        within = "(yardstick)" if w == "fp32" else ("yes" if e["within_fp32_spread"] else "**no**")
        lines.append(f"| {w} | {agree} | {error} | {kl} | {cell(e, 'class_accuracy', '.3f')} | "
                     f"{cell(e, 'domain_fid', '.1f')} | {cell(e, 'nll', '.3f')} | {within} | "
                     f"{e['images']} ({results['seed_sets']} x {results['set_size']}) |")
    sets = results["seed_sets"]
    lines += ["", f"Per seed set ({accuracy} / domain FID{' / NLL' if c2i else ''}; set k: seeds "
              f"{results['set_stride']}k .. {results['set_stride']}k+{results['set_size'] - 1}):", "",
              "| weights | " + " | ".join(f"set {k}" for k in range(sets)) + " |", "|---|" + "---|" * sets]
    for w, e in rows.items():
        lines.append(f"| {w} | " + " | ".join(
            " / ".join(f"{q[key]:{fmt}}" for key, fmt in (("class_accuracy", ".3f"), ("domain_fid", ".1f"),
                                                           ("nll", ".3f")) if key in q)
            for q in e["per_seed_set"]) + " |")
    a = results.get("agreement_decode")
    if a:
        lines += ["", f"Agreement and logit error: {a['calls']} target calls ({a['positions']} positions per "
                  f"precision) of fp32's AR decode of seed set 0."]
    for w, goal in results.get("goal", {}).items():
        lines += ["", f"Goal ({w}: top-1 agreement >= {goal['top1_agreement']:.0%}, quality within "
                  f"fp32's seed spread): {'met' if goal['met'] else 'not met'}."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--work", default="runs/quality", help="where the engine folders are exported (reused)")
    ap.add_argument("--out", default=None, help="results folder (default: WORK/MODEL-weights)")
    ap.add_argument("--weights", default=",".join(WEIGHTS), help="fp32 first, then any of " + ", ".join(WEIGHTS[1:]))
    ap.add_argument("--seed-sets", type=int, default=3)
    ap.add_argument("--images", type=int, default=None, help="the first N images of each seed set (a smoke run)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reexport", action="store_true", help="export every folder anew")
    args = ap.parse_args()
    weights = args.weights.split(",")
    if weights[0] != "fp32" or not set(weights) <= set(WEIGHTS) or len(set(weights)) != len(weights):
        ap.error(f"--weights {args.weights}: fp32 first, then any of {', '.join(WEIGHTS[1:])}, each once")
    if args.seed_sets < 1 or (args.images is not None and args.images < 2):
        ap.error("--seed-sets at least 1, --images at least 2 (the FID needs two images)")
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    out = Path(args.out) if args.out else work / f"{args.model}-weights"
    start, start_cpu = time.time(), cpu_seconds()

    def log(message: str) -> None:
        print(f"[{time.time() - start:6.0f} s] {message}", flush=True)

    folders, exports = export_folders(args.model, work, weights, args.reexport, log)
    export_cpu = cpu_seconds() - start_cpu
    manifest = read_manifest(folders["fp32"])
    prompts = Family.takes_prompts(manifest)
    sets = caption_sets() if prompts else class_sets(len(manifest["model"]["classes"]))
    if args.images is not None:
        sets = sets.first(args.images)
    # the class-conditional model's instruments score tokens by the fp32 folder's target too (NLL)
    instruments = None if prompts else load_instruments(folders["fp32"], manifest)
    instruments = instruments or Instruments(load_classifier(SHIPPED_DIR / "classifier.safetensors"))
    engines = {w: load_engines(folders[w], "onnxruntime", threads=args.threads) for w in weights}
    pipes = {w: Pipeline(engines[w]) for w in weights}
    options = {w: pipes[w].options_for(mode="ar").to_dict() for w in weights}
    if any(o != options["fp32"] for o in options.values()):
        sys.exit(f"the folders' decoding defaults differ: {options}")
    quality = {w: [] for w in weights}
    samples, seconds = {}, {w: [] for w in weights}
    comparison = TargetCallComparison(engines["fp32"], {w: engines[w] for w in weights[1:]})
    decode_cpu = cpu_seconds()
    for k in range(args.seed_sets):
        for w in weights:
            t, c = time.time(), cpu_seconds()
            if k == 0 and w == "fp32" and len(weights) > 1:
                with comparison:
                    gen = pipes[w].generate(sets.conditions, mode="ar", seed=sets.seed(k))
            else:
                gen = pipes[w].generate(sets.conditions, mode="ar", seed=sets.seed(k))
            q = instruments.evaluate(gen.images, gen.tokens, sets.photos)
            quality[w].append(q)
            seconds[w].append({"wall": round(time.time() - t, 2), "cpu": round(cpu_seconds() - c, 2),
                               "with_comparison": k == 0 and w == "fp32" and len(weights) > 1})
            if k == 0:
                samples[w] = gen.images
            log(f"seed set {k} {w}: " + "  ".join(f"{key} {v:.3f}" for key, v in q.items())
                + f"  ({seconds[w][-1]['wall']:.0f} s)")
    decode_cpu = cpu_seconds() - decode_cpu
    agreement = comparison.summary()
    rows = {}
    for w in weights:
        entry = {key: spread([q[key] for q in quality[w]]) for key in quality[w][0]}
        entry.update(per_seed_set=quality[w], images=len(sets) * args.seed_sets, seconds=seconds[w],
                     folder=str(folders[w]), export=exports[w])
        if w != "fp32":
            entry["agreement"] = agreement[w]
            entry["within_fp32_spread"] = within_ar_spread(entry, rows["fp32"])
        rows[w] = entry
    results = {
        "model": args.model, "conditions": "text" if prompts else "class", "seed_sets": args.seed_sets,
        "set_size": len(sets), "set_stride": sets.stride,
        "seeds": [[sets.seed(k), sets.seed(k) + len(sets) - 1] for k in range(args.seed_sets)],
        "conditions_per_set": sets.conditions if prompts else sets.conditions.tolist(),
        "photos_per_set": sets.photos.tolist(), "options": options["fp32"], "backend": "onnxruntime",
        "threads": args.threads, "machine": {**machine(), "onnxruntime": onnxruntime.__version__},
        "commit": commit(), "weights": rows,
        "wall_seconds": round(time.time() - start, 1),
        "cpu_seconds": {"exports": round(export_cpu, 1), "decodes_and_instruments": round(decode_cpu, 1),
                        "total": round(cpu_seconds() - start_cpu, 1)},
    }
    if len(weights) > 1:
        first = next(iter(agreement.values()))
        results["agreement_decode"] = {"calls": first["calls"], "positions": first["positions"]}
    results["goal"] = {w: {"top1_agreement": goal, "met": rows[w]["agreement"]["top1_agreement"] >= goal
                           and rows[w]["within_fp32_spread"]} for w, goal in GOAL.items() if w in rows}
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(results)
    atomic_write(out / "results.json", lambda tmp: tmp.write_text(json.dumps(results, indent=1) + "\n"))
    atomic_write(out / "table.md", lambda tmp: tmp.write_text(table))
    for w, images in samples.items():
        save_png(grid_image(images), out / f"samples_{w}.png")
    print(table)
    log(f"wrote {out}/table.md, results.json, samples_*.png; CPU {results['cpu_seconds']}")


if __name__ == "__main__":
    main()
