"""vvs beside what Janus-Pro users run today, on the same weights, in one run: transformers'
``JanusForConditionalGeneration.generate(generation_mode="image")`` (which reproduces deepseek-ai's own loop).

The official checkpoint cannot be fetched here, so the script writes random weights of Janus-Pro-1B's sizes in
transformers' layout (``save_pretrained``, bfloat16 as released; both sides compute in float32), exports them with
``vvs-export --checkpoint`` at float32, int8 and int4 weights, and times one 384 px image (576 codes) per setting,
each setting in its own process so that its peak resident memory is its own:

- transformers: sampling at temperature 1 over the whole codebook with guidance 5 (Janus-Pro's published setting),
  PyTorch on the CPU;
- vvs: the drafter-free modes (``ar``, ``sjd``, ``sjd-pac``, ``gsd``) with the same sampling, ONNX Runtime on the
  CPU, at each precision. VVS and the other drafter modes need a drafter trained on the target, which random
  weights do not have.

Random weights put near-uniform distributions on the 16,384 codes, so drafts are rarely accepted: the speculative
modes' ratios here are a floor (the shipped pairs' acceptance at these sizes: ``vvs-bench --scale Janus-Pro-1B``).
Greedy parity comes first: both sides' greedy tokens for one prompt, and the prefix they share.

    .venv/bin/python bench/peers.py --out bench/results/peers-janus-1b
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a photo of a cat"
GUIDANCE = 5.0
THREADS = 2
MODES = ("ar", "sjd", "sjd-pac", "gsd")
WEIGHTS = ("fp32", "int8", "int4")
# Janus-Pro-1B (deepseek-ai/Janus-Pro-1B config.json): its language model, SigLIP-L at 384 px, VQ-16
TEXT = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
            num_key_value_heads=16, vocab_size=102400, rms_norm_eps=1e-6, max_position_embeddings=16384,
            bos_token_id=100000, pad_token_id=100015, eos_token_id=100001)
BOI, IMAGE_TOKEN = 100016, 100581
WORDS = ["a", "photo", "of", "cat", "dog", "red", "house", "on", "the", "hill"]


def write_checkpoint(folder: Path) -> None:
    """Random Janus-Pro-1B weights and a word-level tokenizer with its special ids, as transformers saves them."""
    import torch
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import JanusConfig, JanusForConditionalGeneration, LlamaConfig
    from transformers.models.janus.configuration_janus import JanusVisionConfig, JanusVQVAEConfig

    from vvs.families.janus_pro.loading import SPECIAL_TOKENS

    torch.manual_seed(0)
    config = JanusConfig(text_config=LlamaConfig(**TEXT), vision_config=JanusVisionConfig(),
                         vq_config=JanusVQVAEConfig(num_patches=24), image_token_id=IMAGE_TOKEN)
    model = JanusForConditionalGeneration(config).eval().to(torch.bfloat16)
    model.generation_config.bos_token_id, model.generation_config.pad_token_id = TEXT["bos_token_id"], TEXT["pad_token_id"]
    model.save_pretrained(folder)
    ids = dict(zip(SPECIAL_TOKENS.values(), (TEXT["bos_token_id"], TEXT["pad_token_id"], BOI)))
    vocab = {"<unk>": 0, **ids, "<|User|>": 3, "<|Assistant|>": 4, ":": 5, **{w: 6 + i for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in (*ids, "<|User|>", "<|Assistant|>")])
    tokenizer.save(str(folder / "tokenizer.json"))


def prompt_ids(folder: Path):
    import torch

    from vvs.families.janus_pro.loading import official_config
    from vvs.families.janus_pro.prompts import PromptIds

    config, _ = official_config(folder, 64, 24)
    return torch.tensor([PromptIds.from_file(folder / "tokenizer.json", config).ids(PROMPT)])


def run_transformers(folder: Path, seed: int, greedy: bool) -> dict:
    import torch
    from transformers import JanusForConditionalGeneration

    torch.set_num_threads(THREADS)
    ids = prompt_ids(folder)
    model = JanusForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.generation_kwargs = {"boi_token_id": BOI}  # save_pretrained does not keep it
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.no_grad():
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                                do_sample=not greedy, temperature=1.0, top_k=0, top_p=1.0, guidance_scale=GUIDANCE)
    return {"seconds": time.perf_counter() - start, "tokens": tokens[0].tolist(), "target_forwards": tokens.shape[1]}


def run_vvs(engine: Path, mode: str, seed: int, greedy: bool) -> dict:
    from vvs.engines import load_engines
    from vvs.engines.manifest import read_manifest
    from vvs.families.registry import pipeline_of

    engines = load_engines(engine, "onnxruntime", threads=THREADS)
    pipe = pipeline_of(engines, read_manifest(engine))
    pipe.options = pipe.options_for(mode=mode, temperature=0.0 if greedy else 1.0, top_k=0, top_p=1.0,
                                    cfg_scale=GUIDANCE)
    start = time.perf_counter()
    out = pipe.generate([PROMPT], seed=seed, decode_images=False)
    return {"seconds": time.perf_counter() - start, "tokens": out.tokens[0].tolist(),
            "target_forwards": out.stats[0].target_forwards}


def child(args) -> None:
    from vvs.memory import peak_resident_bytes

    folder = Path(args.path)
    result = (run_transformers(folder, args.seed, args.greedy) if args.side == "transformers" else
              run_vvs(folder, args.mode, args.seed, args.greedy))
    result["peak_gib"] = peak_resident_bytes() / 2**30
    print(json.dumps(result))


def measure(side: str, path: Path, mode: str = "ar", seed: int = 0, greedy: bool = False) -> dict:
    command = [sys.executable, __file__, "child", side, str(path), "--mode", mode, "--seed", str(seed)]
    out = subprocess.run(command + (["--greedy"] if greedy else []), capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"{side} {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "peers")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "peers-janus-1b")
    parser.add_argument("--seeds", type=int, default=1, help="images per setting (medians over them)")
    parser.add_argument("--weights", nargs="+", default=list(WEIGHTS), choices=WEIGHTS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    args = parser.parse_args()
    checkpoint = args.work / "Janus-Pro-1B-random"
    if not (checkpoint / "config.json").is_file():
        write_checkpoint(checkpoint)
    engines = {}
    for weights in args.weights:
        engines[weights] = args.work / f"engines-{weights}"
        if not (engines[weights] / "manifest.json").is_file():
            subprocess.run([str(ROOT / ".venv" / "bin" / "vvs-export"), "--model", "janus-pro", "--checkpoint",
                            str(checkpoint), "--no-drafter", "--weights", weights, "--out", str(engines[weights])],
                           check=True, cwd=ROOT)
    rows = {}
    theirs, ours = measure("transformers", checkpoint, greedy=True), measure("vvs", engines["fp32"], greedy=True)
    shared = next((i for i, (a, b) in enumerate(zip(theirs["tokens"], ours["tokens"])) if a != b), len(ours["tokens"]))
    parity = {"greedy_tokens": len(ours["tokens"]), "shared_prefix": shared}
    print(f"greedy parity: {shared} of {len(ours['tokens'])} tokens identical from the start", flush=True)
    settings = [("transformers", "fp32", "generate")] + [("vvs", w, m) for w in args.weights for m in args.modes]
    for side, weights, mode in settings:
        runs = [measure(side, checkpoint if side == "transformers" else engines[weights], mode, seed)
                for seed in range(args.seeds)]
        rows[f"{side} {mode} {weights}"] = {
            "seconds": statistics.median(r["seconds"] for r in runs), "all_seconds": [r["seconds"] for r in runs],
            "target_forwards": statistics.median(r["target_forwards"] for r in runs),
            "peak_gib": max(r["peak_gib"] for r in runs)}
        print(side, mode, weights, json.dumps(rows[f"{side} {mode} {weights}"]), flush=True)
    base = rows["transformers generate fp32"]["seconds"]
    lines = ["| implementation | mode | weights | s/image (median) | vs transformers | target forwards | peak GiB |",
             "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        side, mode, weights = name.split()
        lines.append(f"| {side} | {mode} | {weights} | {row['seconds']:.1f} | {base / row['seconds']:.2f}x | "
                     f"{row['target_forwards']:.0f} | {row['peak_gib']:.2f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"parity": parity, "rows": rows}, indent=2) + "\n")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        parser = argparse.ArgumentParser()
        parser.add_argument("child")
        parser.add_argument("side", choices=("transformers", "vvs"))
        parser.add_argument("path")
        parser.add_argument("--mode", default="ar")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--greedy", action="store_true")
        child(parser.parse_args())
    else:
        main()
