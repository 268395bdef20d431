"""The shipped text-to-image pair: a text-conditional target and drafter on the shipped tokenizer's codes of the
shipped photographs, each photograph described by several captions, and the T5 encoder that reads them.

The encoder is a T5 of the official architecture, **randomly initialised and never trained**, with a Unigram
tokenizer trained on the captions: a fixed random map from captions to features. The target's caption projection
learns to read those features, as LlamaGen's learns to read FLAN-T5-XL's. Prompts made of the captions' words
steer the pair; other words are mostly unknown pieces to it.

Stages (each skipped when its result exists, training resumes from checkpoints): text encoder -> caption
features -> target (from the shipped class-conditional target) -> drafter -> ``weights_t2i/``.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from vvs.discrete.loading import load_drafter
from vvs.discrete.train_data import CAPTIONS, caption_list, random_captions, tokenize_crops
from vvs.discrete.train_drafter import train_drafter
from vvs.engines.manifest import sha256
from vvs.families.llamagen.gpt import GPT, gpt_config
from vvs.families.llamagen.loading import load_gpt
from vvs.files import follow_umask
from vvs.models.layers import caption_causal_mask
from vvs.models.loading import save_model
from vvs.train.loop import Schedule, train
from vvs.train.shipped import TRAIN_CROPS
from vvs.train.text_encoder import save_text_encoder, t5_encoder, train_tokenizer
from vvs.train.tokenizer import IMAGE_SIZE

SLOTS = 32  # caption slots: the captions are short (LlamaGen's checkpoints use 120)
ENCODER = dict(width=64, layers=2, heads=4, head_dim=16, ff=128)
TOKENIZER_VOCAB = 256
DROPOUT = 0.1  # a caption replaced by the unconditional one, as LlamaGen trains (the CFG null)
T2I_DECODING = {"cfg_scale": 3.0, "top_k": 0, "lantern_k": 32}


def build_text_encoder(folder: Path, seed: int) -> Path:
    texts, _ = caption_list()
    tokenizer = train_tokenizer(texts, TOKENIZER_VOCAB)
    return save_text_encoder(t5_encoder(len(tokenizer), seed=seed, **ENCODER), tokenizer, folder)


@torch.no_grad()
def caption_features(text_folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded features ``[captions, SLOTS, width]`` and masks of every caption, through the runtime's own
    prompt path (cleaning, tokenizer, encoder, left padding)."""
    from vvs.discrete.engines import torch_text_encoder

    return torch_text_encoder(text_folder, SLOTS).encode(caption_list()[0])


def train_t2i_target(features, masks, caption_photo, labels, tokens, out_dir: Path, seed: int, start: GPT,
                     steps: int = 400, batch: int = 32, lr: float = 5e-4) -> GPT:
    """The target on (random caption of the crop's photo, crop codes); a dropped caption is the unconditional one
    over all slots. It starts from ``start``, the class-conditional target of the same images: every weight but
    the condition embedding carries over (image tokens keep their rotary phases whatever the slot count), so a few
    hundred steps teach it to read captions instead of class ids."""
    torch.manual_seed(seed)
    model = GPT(gpt_config("GPT-vvs-S", model_type="t2i", cls_token_num=SLOTS, caption_dim=features.shape[-1]))
    carried = {k: v for k, v in start.state_dict().items() if not k.startswith("cls_embedding.")}
    missing, unexpected = model.load_state_dict(carried, strict=False)
    assert not unexpected and all(k.startswith("cls_embedding.") for k in missing), (missing, unexpected)
    length = SLOTS + tokens.shape[1] - 1

    def step_fn(step: int, gen: torch.Generator):
        pick = torch.randint(0, len(tokens), (batch,), generator=gen)
        choice = random_captions(caption_photo, labels[pick], gen)
        drop = torch.rand(batch, generator=gen) < DROPOUT
        cond = torch.where(drop[:, None, None], model.cls_embedding.uncond_embedding, features[choice])
        mask = torch.where(drop[:, None], True, masks[choice])
        seq = tokens[pick]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model.teacher_forced(cond, seq[:, :-1], caption_causal_mask(mask, length)).logits
        # output position SLOTS - 1 + i predicts image token i
        return F.cross_entropy(logits[:, SLOTS - 1:].float().flatten(0, 1), seq.flatten()), {}

    train("t2i_target", model, step_fn, Schedule(steps=steps, lr=lr, warmup=50, weight_decay=0.05), out_dir, seed)
    return model


def reproduce_t2i(out_dir: Path, vq_path: Path, c2i_target_path: Path, seed: int = 0) -> Path:
    """Train the pair into ``out_dir`` and write ``out_dir/weights_t2i`` (the files that ship), on the tokenizer
    at ``vq_path`` and starting from the class-conditional target at ``c2i_target_path``."""
    from vvs.models.loading import load_vq

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    started = time.time()
    text_folder = out_dir / "text_encoder"
    if not (text_folder / "model.safetensors").is_file():
        build_text_encoder(text_folder, seed)
    features, masks = caption_features(text_folder)
    _, caption_photo = caption_list()
    tokens_path = out_dir / "tokens.safetensors"
    if not tokens_path.is_file():
        labels, tokens = tokenize_crops(load_vq(vq_path).eval(), TRAIN_CROPS, IMAGE_SIZE, seed)
        save_file({"labels": labels, "tokens": tokens}, tokens_path)
    data = load_file(tokens_path)
    target_path = out_dir / "t2i_target.safetensors"
    if target_path.is_file():
        target = load_gpt(target_path)
    else:
        target = train_t2i_target(features, masks, caption_photo, data["labels"], data["tokens"], out_dir, seed,
                                  load_gpt(c2i_target_path))
        save_model(target, target_path, "gpt")
    target.eval()
    drafter_path = out_dir / "t2i_drafter.safetensors"
    if drafter_path.is_file():
        drafter = load_drafter(drafter_path, target.config)
    else:
        per_crop = random_captions(caption_photo, data["labels"], torch.Generator().manual_seed(seed))
        drafter = train_drafter(target, features[per_crop], data["tokens"], out_dir, seed, steps=600,
                                caption_mask=masks[per_crop])
        save_model(drafter, drafter_path, "drafter")
    return ship_t2i(out_dir, target, drafter.eval(), text_folder, seed, time.time() - started)


def ship_t2i(out_dir: Path, target, drafter, text_folder: Path, seed: int, seconds: float) -> Path:
    import shutil

    from vvs.train.shipped import ship_model

    weights = out_dir / "weights_t2i"
    weights.mkdir(exist_ok=True)
    files = {name: ship_model(model, weights / f"t2i_{name}.safetensors", kind)
             for name, model, kind in (("target", target, "gpt"), ("drafter", drafter, "drafter"))}
    shutil.copytree(text_folder, weights / "text_encoder", dirs_exist_ok=True)
    follow_umask(weights / "text_encoder")  # safetensors writes its files 0600
    for path in sorted((weights / "text_encoder").iterdir()):
        files[f"text_encoder/{path.name}"] = {"file": f"text_encoder/{path.name}", "sha256": sha256(path),
                                              "bytes": path.stat().st_size}
    info = {
        "description": "vvs's shipped text-to-image pair: a LlamaGen t2i-architecture target and EAGLE drafter on "
                       "the shipped tokenizer's codes of the shipped photographs, captioned by hand, with a "
                       "randomly initialised (untrained) T5 encoder and a tokenizer trained on the captions.",
        "seed": seed,
        "training_seconds": round(seconds, 1),
        "reproduce": f"vvs-train t2i --out {out_dir} --seed {seed}",
        "captions": CAPTIONS,
        "decoding_defaults": T2I_DECODING,
        "files": files,
    }
    (weights / "shipped_t2i.json").write_text(json.dumps(info, indent=2) + "\n")
    return weights
