"""vvs beside what Janus-Pro and Lumina-mGPT users run today, on the same weights, in one run.

- Janus-Pro: transformers' ``JanusForConditionalGeneration.generate(generation_mode="image")`` (which reproduces
  deepseek-ai's own loop), at Janus-Pro-1B's sizes: 576 codes, guidance 5, temperature 1 over the whole codebook.
- Lumina-mGPT: the official sampling procedure (Alpha-VLLM's ``FlexARInferenceSolver``: Hugging Face ``generate``
  with its guidance, layout and top-k logits processors, rewritten here from its description in
  ``shared/docs/families-and-jacobi.md``) over transformers' ``ChameleonForConditionalGeneration``, at
  Lumina-mGPT-7B's width (4,096, 32 heads, feed-forward 11,008, the 65,536-id head) and ``--lumina-layers`` of its
  32 layers (float32 at full depth needs 28 GB; both sides run the same layers), guidance 3, image top-k 2000.

The official checkpoints cannot be fetched here, so the script writes random weights of those sizes in
transformers' layout (``save_pretrained``, bfloat16 as released; both sides compute in float32), exports them with
``vvs-export --checkpoint`` at each weight precision, and times one image per setting and seed, each in its own
process so that its peak resident memory is its own:

- transformers: PyTorch on the CPU, float32;
- vvs: the drafter-free modes (``ar``, ``sjd``, ``sjd-pac``, ``gsd``) with the same sampling, ONNX Runtime on the
  CPU, at each precision. VVS and the other drafter modes need a drafter trained on the target, which random
  weights do not have.

Random weights put near-uniform distributions on the codes, so drafts are rarely accepted: the speculative modes'
ratios here are a floor (the shipped pairs' acceptance at these sizes: ``vvs-bench --scale``). Greedy parity comes
first: both sides' greedy tokens for one prompt, and the prefix they share.

    .venv/bin/python bench/peers.py --family janus-pro --out bench/results/peers-janus-1b
    .venv/bin/python bench/peers.py --family lumina-mgpt --out bench/results/peers-lumina-7b
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROMPT = "a photo of a cat"
THREADS = 2
MODES = ("ar", "sjd", "sjd-pac", "gsd")
WEIGHTS = ("fp32", "int8", "int4", "int4-head8")


@dataclass(frozen=True)
class Peer:
    """One family's comparison: the checkpoint it writes, how transformers generates from it, and how vvs exports
    and samples it."""
    family: str  # vvs-export --model
    checkpoint: str  # the folder's name under --work
    sampling: dict  # both sides: guidance, temperature, top-k
    write: Callable  # (folder, peer): the random checkpoint
    generate: Callable  # (folder, peer, seed, greedy) -> (seconds, image tokens): transformers' side
    to_ids: Callable = list  # vvs's image tokens as transformers generates them
    export_args: tuple[str, ...] = ()
    layers: int | None = None  # Lumina: the depth both sides run

    def at_depth(self, layers: int) -> "Peer":
        return replace(self, layers=layers) if self.layers is not None else self

    @property
    def name(self) -> str:
        return self.checkpoint if self.layers is None else f"{self.checkpoint}-{self.layers}"


# ------------------------------------------------------------------------------------------------- Janus-Pro

# Janus-Pro-1B (deepseek-ai/Janus-Pro-1B config.json): its language model, SigLIP-L at 384 px, VQ-16
JANUS_TEXT = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
                  num_key_value_heads=16, vocab_size=102400, rms_norm_eps=1e-6, max_position_embeddings=16384,
                  bos_token_id=100000, pad_token_id=100015, eos_token_id=100001)
JANUS_BOI, JANUS_IMAGE_TOKEN = 100016, 100581
JANUS_WORDS = ["a", "photo", "of", "cat", "dog", "red", "house", "on", "the", "hill"]


def write_janus(folder: Path, peer: Peer) -> None:
    """Random Janus-Pro-1B weights and a word-level tokenizer with its special ids, as transformers saves them."""
    import torch
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import JanusConfig, JanusForConditionalGeneration, LlamaConfig
    from transformers.models.janus.configuration_janus import JanusVisionConfig, JanusVQVAEConfig

    from vvs.families.janus_pro.loading import SPECIAL_TOKENS

    torch.manual_seed(0)
    config = JanusConfig(text_config=LlamaConfig(**JANUS_TEXT), vision_config=JanusVisionConfig(),
                         vq_config=JanusVQVAEConfig(num_patches=24), image_token_id=JANUS_IMAGE_TOKEN)
    model = JanusForConditionalGeneration(config).eval().to(torch.bfloat16)
    text = JANUS_TEXT
    model.generation_config.bos_token_id = text["bos_token_id"]
    model.generation_config.pad_token_id = text["pad_token_id"]
    model.save_pretrained(folder)
    ids = dict(zip(SPECIAL_TOKENS.values(), (text["bos_token_id"], text["pad_token_id"], JANUS_BOI)))
    vocab = {"<unk>": 0, **ids, "<|User|>": 3, "<|Assistant|>": 4, ":": 5,
             **{w: 6 + i for i, w in enumerate(JANUS_WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in (*ids, "<|User|>", "<|Assistant|>")])
    tokenizer.save(str(folder / "tokenizer.json"))


def generate_janus(folder: Path, peer: Peer, seed: int, greedy: bool) -> list[int]:
    import torch
    from transformers import JanusForConditionalGeneration

    from vvs.families.janus_pro.loading import official_config
    from vvs.families.janus_pro.prompts import PromptIds

    config, _ = official_config(folder, 64, 24)
    ids = torch.tensor([PromptIds.from_file(folder / "tokenizer.json", config).ids(PROMPT)])
    model = JanusForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.generation_kwargs = {"boi_token_id": JANUS_BOI}  # save_pretrained does not keep it
    torch.manual_seed(seed)
    with torch.no_grad():
        start = time.perf_counter()
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                                do_sample=not greedy, temperature=1.0, top_k=0, top_p=1.0,
                                guidance_scale=peer.sampling["cfg_scale"])
        seconds = time.perf_counter() - start
    return seconds, tokens[0].tolist()


# ----------------------------------------------------------------------------------------------- Lumina-mGPT

# Lumina-mGPT-7B (Alpha-VLLM/Lumina-mGPT-7B-*: Chameleon-7B's decoder and vocabulary)
LUMINA_TEXT = dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32,
                   vocab_size=65536, rms_norm_eps=1e-5, max_position_embeddings=4096)
LUMINA_GRID = 16  # 256 px: 272 tokens (the released folders paint 512-1024 px, 1,056-4,160 tokens)
FIRST_CODE, CODES, EOL = 4, 8192, 8803


def write_lumina(folder: Path, peer: Peer) -> None:
    """Random Lumina-mGPT-7B-width weights over Chameleon's vocabulary layout in transformers' layout
    (``save_pretrained`` of a transformers Chameleon: query/key norms per head, which transformers needs and vvs
    reads as well as Lumina-mGPT's one row per shard), and Chameleon's tokenizer folder beside it (a word-level
    tokenizer and a small random VQGAN, which is not timed)."""
    import torch
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from tests.lumina_reference import BOS, PAD, vocabulary, write_tokenizer_folder

    torch.manual_seed(0)
    vocab = vocabulary(size=LUMINA_TEXT["vocab_size"])
    config = ChameleonConfig(**LUMINA_TEXT, num_hidden_layers=peer.layers, vocabulary_map=vocab, bos_token_id=BOS,
                             pad_token_id=PAD)
    model = ChameleonForConditionalGeneration(config).eval().to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="1GB")  # shards and their index, as the released folders hold
    write_tokenizer_folder(folder.with_name(folder.name + "-tokenizer"), size=LUMINA_TEXT["vocab_size"])


class UnbatchedGuidance:
    """Lumina-mGPT's ``LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor`` once the image has
    begun: the unconditional sequence is the start and size tokens and the image so far, with its own cache and
    positions from 0, run as a second single-row forward each step; logits ``u + s·(c - u)``."""

    def __init__(self, model, scale: float, prompt_length: int):
        self.model, self.scale, self.prompt_length, self.cache, self.fed = model, scale, prompt_length, None, 0

    def __call__(self, input_ids, scores):
        sequence = input_ids[:, self.prompt_length - 3:]  # the start tag, the two size tokens, the image so far
        out = self.model(input_ids=sequence[:, self.fed:], past_key_values=self.cache, use_cache=True)
        self.cache, self.fed = out.past_key_values, sequence.shape[1]
        unconditional = out.logits[:, -1].float()
        return unconditional + self.scale * (scores - unconditional)


class ImageLayout:
    """Lumina-mGPT's ``MultiModalLogitsProcessor`` inside an image of ``grid`` x ``grid`` codes: the end-of-line
    id alone at each row's end, otherwise the image ids alone; then its ``InterleavedTopKLogitsWarper`` (the image
    top-k; 0: none)."""

    def __init__(self, prompt_length: int, grid: int, top_k: int):
        self.prompt_length, self.grid, self.top_k = prompt_length, grid, top_k

    def __call__(self, input_ids, scores):
        n = input_ids.shape[1] - self.prompt_length
        allowed = [EOL] if (n + 1) % (self.grid + 1) == 0 else slice(FIRST_CODE, FIRST_CODE + CODES)
        out = scores.new_full(scores.shape, float("-inf"))
        out[:, allowed] = scores[:, allowed]
        if self.top_k and self.top_k < out.shape[-1]:
            kth = out.topk(self.top_k, dim=-1).values[:, -1:]
            out = out.masked_fill(out < kth, float("-inf"))
        return out


def lumina_image(model, ids, grid: int, sampling: dict, greedy: bool) -> list[int]:
    """The official sampling procedure on a transformers Chameleon, from prompt ids ending in the image's start
    and size tokens (as vvs writes them; the official solver samples those three): the image's rows, each closed by
    its end-of-line id."""
    import torch
    from transformers import LogitsProcessorList

    # transformers' class sets every image id's logit to the dtype's minimum (it generates text only);
    # Lumina-mGPT's own class (ChameleonXLLMXForConditionalGeneration) does not: lift that mask
    model.model.vocabulary_mapping.__dict__["image_tokens"] = []
    processors = LogitsProcessorList([UnbatchedGuidance(model, sampling["cfg_scale"], ids.shape[1]),
                                      ImageLayout(ids.shape[1], grid, sampling["top_k"])])
    with torch.no_grad():
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), logits_processor=processors,
                                max_new_tokens=grid * (grid + 1), min_new_tokens=0, do_sample=not greedy,
                                temperature=sampling["temperature"], top_k=0, top_p=1.0)
    return tokens[0, ids.shape[1]:].tolist()


def generate_lumina(folder: Path, peer: Peer, seed: int, greedy: bool) -> tuple[float, list[int]]:
    import torch
    from transformers import ChameleonForConditionalGeneration

    from vvs.families.lumina_mgpt.loading import official_config
    from vvs.families.lumina_mgpt.prompts import PromptIds

    config, _ = official_config(folder, 128, LUMINA_GRID, {})  # the prompt's ids only: no weights needed
    tokenizer = folder.with_name(folder.name + "-tokenizer") / "text_tokenizer.json"
    ids = torch.tensor([PromptIds.from_file(tokenizer, config).ids(PROMPT)])
    model = ChameleonForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    start = time.perf_counter()
    tokens = lumina_image(model, ids, LUMINA_GRID, peer.sampling, greedy)
    return time.perf_counter() - start, tokens


def lumina_stream_to_ids(tokens: list[int]) -> list[int]:
    """vvs's image stream (code index c, or the end-of-line index CODES) as the joint vocabulary's ids."""
    return [EOL if t == CODES else FIRST_CODE + t for t in tokens]


PEERS = {
    "janus-pro": Peer("janus-pro", "Janus-Pro-1B-random", dict(cfg_scale=5.0, temperature=1.0, top_k=0, top_p=1.0),
                      write_janus, generate_janus),
    "lumina-mgpt": Peer("lumina-mgpt", "Lumina-mGPT-7B-random",
                        dict(cfg_scale=3.0, temperature=1.0, top_k=2000, top_p=1.0), write_lumina, generate_lumina,
                        lumina_stream_to_ids, ("--resolution", str(LUMINA_GRID * 16)), layers=4),
}


# ------------------------------------------------------------------------------------------------ the runs

def run_vvs(engine: Path, peer: Peer, mode: str, seed: int, greedy: bool) -> tuple[float, list[int], int]:
    from vvs.engines import load_engines
    from vvs.engines.manifest import read_manifest
    from vvs.families.registry import pipeline_of

    engines = load_engines(engine, "onnxruntime", threads=THREADS)
    pipe = pipeline_of(engines, read_manifest(engine))
    sampling = dict(peer.sampling, temperature=0.0) if greedy else peer.sampling
    pipe.options = pipe.options_for(mode=mode, **sampling)
    start = time.perf_counter()
    out = pipe.generate([PROMPT], seed=seed, decode_images=False)
    return time.perf_counter() - start, peer.to_ids(out.tokens[0].tolist()), out.stats[0].target_forwards


def child(args) -> None:
    import torch

    from vvs.memory import peak_resident_bytes

    torch.set_num_threads(THREADS)
    peer, folder = PEERS[args.family].at_depth(args.lumina_layers), Path(args.path)
    if args.side == "transformers":
        seconds, tokens = peer.generate(folder, peer, args.seed, args.greedy)
        forwards = len(tokens)
    else:
        seconds, tokens, forwards = run_vvs(folder, peer, args.mode, args.seed, args.greedy)
    print(json.dumps({"seconds": seconds, "tokens": tokens, "target_forwards": forwards,
                      "peak_gib": peak_resident_bytes() / 2**30}), flush=True)
    # the result is out: skip the interpreter's teardown, which ONNX Runtime's thread pools aborted once after a
    # finished run ("terminate called without an active exception")
    os._exit(0)


def measure(args, side: str, path: Path, mode: str = "ar", seed: int = 0, greedy: bool = False) -> dict:
    command = [sys.executable, __file__, "child", side, str(path), "--family", args.family, "--mode", mode,
               "--seed", str(seed), "--lumina-layers", str(args.lumina_layers)]
    out = subprocess.run(command + (["--greedy"] if greedy else []), capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"{side} {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(PEERS), default="janus-pro")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "peers")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=1, help="images per setting (medians over them)")
    parser.add_argument("--weights", nargs="+", default=list(WEIGHTS), choices=WEIGHTS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--lumina-layers", type=int, default=PEERS["lumina-mgpt"].layers,
                        help="Lumina-mGPT-7B's layers both sides run (32 at full depth)")
    parser.add_argument("--no-parity", action="store_true", help="skip the greedy parity check")
    args = parser.parse_args()
    peer = PEERS[args.family].at_depth(args.lumina_layers)
    name = peer.name
    checkpoint = args.work / name
    if not (checkpoint / "config.json").is_file():
        peer.write(checkpoint, peer)
    extra = ("--tokenizer-dir", str(checkpoint.with_name(name + "-tokenizer"))) if peer.family == "lumina-mgpt" else ()
    engines = {}
    for weights in args.weights:
        engines[weights] = args.work / f"engines-{name}-{weights}"
        if not (engines[weights] / "manifest.json").is_file():
            subprocess.run([str(ROOT / ".venv" / "bin" / "vvs-export"), "--model", peer.family, "--checkpoint",
                            str(checkpoint), "--no-drafter", "--weights", weights, "--out", str(engines[weights]),
                            *peer.export_args, *extra], check=True, cwd=ROOT)
    report = {"family": peer.family, "layers": peer.layers, "sampling": peer.sampling, "rows": {}}
    if not args.no_parity:
        theirs = measure(args, "transformers", checkpoint, greedy=True)
        ours = measure(args, "vvs", engines[args.weights[0]], greedy=True)
        shared = next((i for i, (a, b) in enumerate(zip(theirs["tokens"], ours["tokens"])) if a != b),
                      min(len(ours["tokens"]), len(theirs["tokens"])))
        report["parity"] = {"weights": args.weights[0], "greedy_tokens": len(ours["tokens"]),
                            "transformers_tokens": len(theirs["tokens"]), "shared_prefix": shared}
        print(f"greedy parity: {shared} of {len(ours['tokens'])} tokens identical from the start", flush=True)
    rows = report["rows"]
    settings = [("transformers", "fp32", "generate")] + [("vvs", w, m) for w in args.weights for m in args.modes]
    for side, weights, mode in settings:
        runs = [measure(args, side, checkpoint if side == "transformers" else engines[weights], mode, seed)
                for seed in range(args.seeds)]
        rows[f"{side} {mode} {weights}"] = {
            "seconds": statistics.median(r["seconds"] for r in runs), "all_seconds": [r["seconds"] for r in runs],
            "target_forwards": statistics.median(r["target_forwards"] for r in runs),
            "peak_gib": max(r["peak_gib"] for r in runs)}
        print(side, mode, weights, json.dumps(rows[f"{side} {mode} {weights}"]), flush=True)
    base = rows["transformers generate fp32"]["seconds"]
    lines = ["| implementation | mode | weights | s/image (median) | vs transformers | target forwards | peak GiB |",
             "|---|---|---|---|---|---|---|"]
    for key, row in rows.items():
        side, mode, weights = key.split()
        lines.append(f"| {side} | {mode} | {weights} | {row['seconds']:.1f} | {base / row['seconds']:.2f}x | "
                     f"{row['target_forwards']:.0f} | {row['peak_gib']:.2f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        parser = argparse.ArgumentParser()
        parser.add_argument("child")
        parser.add_argument("side", choices=("transformers", "vvs"))
        parser.add_argument("path")
        parser.add_argument("--family", choices=sorted(PEERS), default="janus-pro")
        parser.add_argument("--mode", default="ar")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--lumina-layers", type=int, default=PEERS["lumina-mgpt"].layers)
        parser.add_argument("--greedy", action="store_true")
        child(parser.parse_args())
    else:
        main()
