"""The shipped Janus-Pro pair: a small target of Janus-Pro's generation architecture and its EAGLE drafter, trained
on the shipped tokenizer's codes of the shipped photographs with their hand-written captions (the text-to-image
LlamaGen pair's data), so that a fresh machine runs exactly the code an official Janus-Pro checkpoint runs.

Janus-Pro reads prompts with its own language model, so there is no text encoder: a Unigram tokenizer trained on
the captions (with Janus-Pro's special tokens) turns the chat-templated prompt into ids, and the target learns their
embeddings from scratch with everything else.

Stages (each skipped when its result exists, training resumes from checkpoints): tokenizer -> crop codes ->
target -> drafter -> ``weights_janus/``.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, SentencePieceUnigramTokenizer, Tokenizer

from vvs.discrete.loading import load_drafter
from vvs.discrete.train_data import CAPTIONS, caption_list, random_captions, tokenize_crops
from vvs.discrete.train_drafter import train_drafter
from vvs.families.janus_pro.loading import SPECIAL_TOKENS, load_janus
from vvs.families.janus_pro.model import JanusGen, janus_config
from vvs.families.janus_pro.prompts import ASSISTANT, USER, PromptIds
from vvs.models.layers import caption_causal_mask
from vvs.models.loading import save_model
from vvs.train.loop import Schedule, train
from vvs.train.shipped import TRAIN_CROPS
from vvs.train.tokenizer import IMAGE_SIZE

SIZE = "Janus-vvs-S"
PROMPT_SLOTS = 48  # the longest caption is 32 tokens with the chat template; room for longer prompts
TOKENIZER_VOCAB = 256
DROPOUT = 0.1  # a prompt replaced by guidance's null, as Janus-Pro trains for classifier-free guidance
JANUS_DECODING = {"cfg_scale": 3.0, "top_k": 0, "lantern_k": 32}
TOKENIZER = "janus_tokenizer.json"


def train_prompt_tokenizer(path: Path) -> Path:
    """A Unigram tokenizer of the captions whose first ids are Janus-Pro's special tokens and chat roles."""
    specials = ["<unk>", *SPECIAL_TOKENS.values(), USER, ASSISTANT]
    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(caption_list()[0], vocab_size=TOKENIZER_VOCAB, special_tokens=specials,
                                unk_token="<unk>")
    unigram.add_special_tokens([AddedToken(t, special=True) for t in specials[1:]])
    unigram.save(str(path))
    return path


def train_janus_target(ids: torch.Tensor, masks: torch.Tensor, caption_photo: torch.Tensor, labels: torch.Tensor,
                       tokens: torch.Tensor, config, out_dir: Path, seed: int, steps: int = 1100, batch: int = 32,
                       lr: float = 1e-3) -> JanusGen:
    """The target from scratch on (a random caption of the crop's photo, the crop's codes); a dropped prompt is
    guidance's null of that prompt under the same padding."""
    torch.manual_seed(seed)
    model = JanusGen(config)
    length = PROMPT_SLOTS + tokens.shape[1] - 1

    def step_fn(step: int, gen: torch.Generator):
        pick = torch.randint(0, len(tokens), (batch,), generator=gen)
        choice = random_captions(caption_photo, labels[pick], gen)
        drop = torch.rand(batch, generator=gen) < DROPOUT
        prompt = ids[choice]
        prompt = torch.where(drop[:, None], model.null_condition(prompt), prompt)
        seq = tokens[pick]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model.teacher_forced(prompt, seq[:, :-1], caption_causal_mask(masks[choice], length)).logits
        # output position PROMPT_SLOTS - 1 + i predicts image token i
        return F.cross_entropy(logits[:, PROMPT_SLOTS - 1:].float().flatten(0, 1), seq.flatten()), {}

    train("janus_target", model, step_fn, Schedule(steps=steps, lr=lr, warmup=100, weight_decay=0.05), out_dir, seed)
    return model.eval()


def reproduce_janus(out_dir: Path, vq_path: Path, seed: int = 0) -> Path:
    """Train the pair into ``out_dir`` and write ``out_dir/weights_janus`` (the files that ship) on the tokenizer
    at ``vq_path``."""
    from vvs.models.loading import load_vq

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    started = time.time()
    tokenizer_path = out_dir / TOKENIZER
    if not tokenizer_path.is_file():
        train_prompt_tokenizer(tokenizer_path)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    vq = load_vq(vq_path).eval()
    ids_of = {field: tokenizer.token_to_id(name) for field, name in SPECIAL_TOKENS.items()}
    config = janus_config(SIZE, text_vocab_size=tokenizer.get_vocab_size(), vocab_size=vq.config.codebook_size,
                          code_dim=vq.config.codebook_embed_dim, cls_token_num=PROMPT_SLOTS, **ids_of)
    texts, caption_photo = caption_list()
    ids, masks = PromptIds(tokenizer, config).encode(texts)
    tokens_path = out_dir / "tokens.safetensors"
    if not tokens_path.is_file():
        labels, tokens = tokenize_crops(vq, TRAIN_CROPS, IMAGE_SIZE, seed)
        save_file({"labels": labels, "tokens": tokens}, tokens_path)
    data = load_file(tokens_path)
    target_path = out_dir / "janus_target.safetensors"
    if target_path.is_file():
        target = load_janus(target_path)
    else:
        target = train_janus_target(ids, masks, caption_photo, data["labels"], data["tokens"], config, out_dir, seed)
        save_model(target, target_path, "janus")
    drafter_path = out_dir / "janus_drafter.safetensors"
    if drafter_path.is_file():
        drafter = load_drafter(drafter_path, target.config)
    else:
        per_crop = random_captions(caption_photo, data["labels"], torch.Generator().manual_seed(seed))
        drafter = train_drafter(target, ids[per_crop], data["tokens"], out_dir, seed, steps=600,
                                caption_mask=masks[per_crop])
        save_model(drafter, drafter_path, "drafter")
    return ship_janus(out_dir, target, drafter.eval(), tokenizer_path, seed, time.time() - started)


def ship_janus(out_dir: Path, target, drafter, tokenizer_path: Path, seed: int, seconds: float) -> Path:
    from vvs.train.shipped import ship_prompt_pair

    info = {
        "description": "vvs's shipped Janus-Pro pair: a target of Janus-Pro's generation architecture (Llama "
                       "language model, gen_embed / gen_aligner / gen_head) and its EAGLE drafter, trained from "
                       "scratch on the shipped tokenizer's codes of the shipped photographs with their hand-written "
                       "captions, and a Unigram tokenizer of the captions with Janus-Pro's special tokens.",
        "seed": seed,
        "training_seconds": round(seconds, 1),
        "reproduce": f"vvs-train janus-pro --out {out_dir} --seed {seed}",
        "captions": CAPTIONS,
        "decoding_defaults": JANUS_DECODING,
    }
    return ship_prompt_pair(out_dir / "weights_janus", "janus", {"target": (target, "janus"),
                                                                 "drafter": (drafter, "drafter")},
                            tokenizer_path, TOKENIZER, info)
