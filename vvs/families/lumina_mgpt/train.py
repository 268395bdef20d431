"""The shipped Lumina-mGPT pair: a small target of the Chameleon architecture and its EAGLE drafter, trained from
scratch on the shipped photographs' codes with their hand-written captions (the text-to-image pairs' data), with an
image tokenizer of Chameleon's VQGAN architecture and a text tokenizer in Chameleon's vocabulary layout, so that a
fresh machine runs exactly the code an official Lumina-mGPT folder runs.

- **Image tokenizer.** The shipped VQ tokenizer (LlamaGen's architecture, 1,024 codes, 8x at 128 px) is taming's
  VQGAN too: the same blocks, an attention level at 16 x 16 (``attn_resolutions``), a codebook whose nearest code
  by L2 distance is the nearest by cosine once its rows have unit length. Renamed into Chameleon's parameter names
  it encodes and paints exactly as the shipped one (its decoder pads by reflection: ``decoder_padding``).
- **Text tokenizer.** A BPE tokenizer of the captions and the instruction template, its pieces numbered after
  Chameleon's 8,844 reserved ids (specials 0-3, image ids from 4, the image tags and ``<reservedNNNNN>`` ids where
  Chameleon has them), so prompts carry the official special ids.
- **Target and drafter** learn (a random caption of the crop's photograph, the crop's stream: 16 rows of codes,
  each closed by the end-of-line token); a dropped prompt is guidance's null, the start and size tokens alone.

Stages (each skipped when its result exists; training resumes from checkpoints): text tokenizer -> crop codes ->
target -> drafter -> ``weights_lumina/``.
"""
from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, SentencePieceBPETokenizer, Tokenizer

from vvs.discrete.loading import load_drafter
from vvs.discrete.train_data import CAPTIONS, caption_list, random_captions, tokenize_crops
from vvs.discrete.train_drafter import train_drafter
from vvs.families.lumina_mgpt.loading import IMAGE_PREFIX, PAD_TOKEN, SPECIAL_TOKENS, load_lumina
from vvs.families.lumina_mgpt.model import ChameleonConfig, ChameleonGen, lumina_config
from vvs.families.lumina_mgpt.prompts import PromptIds, instruction, null
from vvs.families.lumina_mgpt.vqgan import ChameleonVQGAN, VQGANConfig
from vvs.models.layers import caption_causal_mask
from vvs.models.loading import save_model
from vvs.models.vq import VQModel
from vvs.train.loop import Schedule, train
from vvs.train.shipped import TRAIN_CROPS
from vvs.train.tokenizer import IMAGE_SIZE

SIZE = "Lumina-vvs-S"
PROMPT_SLOTS = 48  # the longest caption is 31 tokens in the instruction template; room for longer prompts
FIRST_TEXT_ID = 8844  # Chameleon's text pieces start above its reserved ids
TEXT_PIECES = 512  # more than the captions' words: BPE merges each into one piece
DROPOUT = 0.1  # a prompt replaced by guidance's null, for classifier-free guidance
LUMINA_DECODING = {"cfg_scale": 3.0, "top_k": 0, "lantern_k": 32}
TOKENIZER = "lumina_tokenizer.json"


# --------------------------------------------------------------------------- tokenizers


def chameleon_names(num_codes: int) -> list[str]:
    """The name of each id below :data:`FIRST_TEXT_ID` in Chameleon's vocabulary: ``<unk> <s> </s> <pad>``, the image
    ids (``IMGIMG`` + the code's digits as letters A-J + ``Z``), ``<eoss>`` and ``<racm3:break>``, then
    ``<reservedNNNNN>``. Image ids past the tokenizer's ``num_codes`` stay reserved."""
    names = ["<unk>", SPECIAL_TOKENS["bos_id"], "</s>", PAD_TOKEN]
    names += [IMAGE_PREFIX + "".join("ABCDEFGHIJ"[int(d)] for d in str(code)) + "Z" for code in range(num_codes)]
    names += [f"<reserved{i - 4:05d}>" for i in range(len(names), 8196)]
    names += [SPECIAL_TOKENS["eoi_id"], SPECIAL_TOKENS["boi_id"]]
    names += [f"<reserved{i - 4:05d}>" for i in range(len(names), FIRST_TEXT_ID)]
    return names


def train_text_tokenizer(path: Path, num_codes: int, pixels: int) -> Path:
    """A BPE tokenizer (Chameleon's kind) of the captions inside the instruction template, its pieces numbered from
    :data:`FIRST_TEXT_ID`. The names below it are reachable only as ids (no merge spells them); the specials and
    image tags are also special tokens, as in Chameleon's tokenizer."""
    bpe = SentencePieceBPETokenizer(unk_token="<unk>")
    texts = [instruction(caption, pixels, pixels) for caption in caption_list()[0]]
    bpe.train_from_iterator(texts, vocab_size=TEXT_PIECES, special_tokens=["<unk>"])
    data = json.loads(bpe.to_str())
    names = chameleon_names(num_codes)
    pieces = sorted((piece for piece in data["model"]["vocab"] if piece != "<unk>"), key=data["model"]["vocab"].get)
    data["model"]["vocab"] = {name: i for i, name in enumerate([*names, *pieces])}
    data["added_tokens"] = []
    tokenizer = Tokenizer.from_str(json.dumps(data))
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in [*names[:4], *names[8196:8198]]])
    tokenizer.save(str(path))
    return path


def chameleon_vqgan(vq: VQModel) -> ChameleonVQGAN:
    """The shipped VQ tokenizer as a Chameleon VQGAN: the same parameters under Chameleon's names, the codebook's rows
    at unit length; it gives the same codes and the same pictures."""
    c = vq.config
    config = VQGANConfig(embed_dim=c.codebook_embed_dim, n_embed=c.codebook_size, z_channels=c.z_channels,
                         resolution=IMAGE_SIZE, ch=c.base_channels, ch_mult=c.encoder_ch_mult,
                         num_res_blocks=c.num_res_blocks, attn_resolutions=(IMAGE_SIZE // c.downsample,),
                         decoder_padding=c.decoder_padding)
    vqgan = ChameleonVQGAN(config)
    last = len(c.encoder_ch_mult) - 1
    middle = {"0": "block_1", "1": "attn_1", "2": "block_2"}

    def rename(key: str) -> str:  # LlamaGen numbers the decoder's levels from the deepest, taming from the top
        if m := re.fullmatch(r"(encoder|decoder)\.conv_blocks\.(\d+)\.(res|attn|downsample|upsample)(.*)", key):
            level = int(m[2]) if m[1] == "encoder" else last - int(m[2])
            part = "down" if m[1] == "encoder" else "up"
            return f"{m[1]}.{part}.{level}.{'block' if m[3] == 'res' else m[3]}{m[4]}"
        if m := re.fullmatch(r"(encoder|decoder)\.mid\.(\d)\.(.*)", key):
            return f"{m[1]}.mid.{middle[m[2]]}.{m[3]}"
        return key

    state = {rename(k): v for k, v in vq.state_dict().items()}
    state["quantize.embedding.weight"] = vq.quantize.codebook()
    state["quantize.stream_codes"] = vqgan.quantize.stream_codes
    vqgan.load_state_dict(state)
    return vqgan.eval()


def stream_of(codes: torch.Tensor, config: ChameleonConfig) -> torch.Tensor:
    """Codes ``[M, grid * grid]`` -> the image streams ``[M, grid * (grid + 1)]``: each row closed by end-of-line."""
    rows = codes.view(len(codes), config.grid_size, config.grid_size)
    eol = rows.new_full((len(codes), config.grid_size, 1), config.eol)
    return torch.cat([rows, eol], dim=2).flatten(1)


# --------------------------------------------------------------------------- target and drafter


def train_lumina_target(ids: torch.Tensor, masks: torch.Tensor, caption_photo: torch.Tensor, labels: torch.Tensor,
                        streams: torch.Tensor, config: ChameleonConfig, out_dir: Path, seed: int, steps: int = 1100,
                        batch: int = 32, lr: float = 1e-3) -> ChameleonGen:
    """The target from scratch on (a random caption of the crop's photograph, the crop's stream). Embedding rows of
    ids no prompt or stream holds start (and, with no gradient, stay) at zero."""
    torch.manual_seed(seed)
    model = ChameleonGen(config)
    used = torch.zeros(config.joint_vocab_size, dtype=torch.bool)
    used[ids.flatten()] = True
    used[FIRST_TEXT_ID:] = True  # every text piece: a user's prompt may hold pieces the captions do not
    used[model.stream_ids] = True
    with torch.no_grad():
        model.model.embed_tokens.weight[~used] = 0
    length = config.cls_token_num + streams.shape[1] - 1

    def step_fn(step: int, gen: torch.Generator):
        pick = torch.randint(0, len(streams), (batch,), generator=gen)
        choice = random_captions(caption_photo, labels[pick], gen)
        drop = torch.rand(batch, generator=gen) < DROPOUT
        prompt, slots = ids[choice], masks[choice]
        nulls, null_slots = null(prompt, slots, config)
        prompt = torch.where(drop[:, None], nulls, prompt)
        slots = torch.where(drop[:, None], null_slots, slots)
        seq = streams[pick]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model.teacher_forced(prompt, seq[:, :-1], caption_causal_mask(slots, length)).logits
        # output position C - 1 + i predicts stream token i; the forced end-of-line tokens are learnt too, as the
        # official model learns them (the stream's scores at a row's end never reach sampling)
        return F.cross_entropy(logits[:, config.cls_token_num - 1:].float().flatten(0, 1), seq.flatten()), {}

    train("lumina_target", model, step_fn, Schedule(steps=steps, lr=lr, warmup=100, weight_decay=0.05), out_dir, seed)
    return model.eval()


class StageSeconds:
    """The seconds each stage took, kept in ``out_dir/stage_seconds.json``: a resumed run reports every stage's."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / "stage_seconds.json"
        self.seconds = json.loads(self.path.read_text()) if self.path.is_file() else {}

    @contextmanager
    def stage(self, name: str):
        started = time.time()
        yield
        self.seconds[name] = round(time.time() - started, 1)
        self.path.write_text(json.dumps(self.seconds, indent=1) + "\n")


def reproduce_lumina(out_dir: Path, vq_path: Path, seed: int = 0) -> Path:
    """Train the pair into ``out_dir`` and write ``out_dir/weights_lumina`` (the files that ship) from the VQ
    tokenizer at ``vq_path``."""
    from vvs.models.loading import load_vq

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    clock = StageSeconds(out_dir)
    vq = load_vq(vq_path).eval()
    tokenizer_path = out_dir / TOKENIZER
    if not tokenizer_path.is_file():
        train_text_tokenizer(tokenizer_path, vq.config.codebook_size, IMAGE_SIZE)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    config = lumina_config(SIZE, cls_token_num=PROMPT_SLOTS, num_codes=vq.config.codebook_size,
                           code_pixels=vq.config.downsample, grid_size=IMAGE_SIZE // vq.config.downsample,
                           joint_vocab_size=tokenizer.get_vocab_size())
    texts, caption_photo = caption_list()
    ids, masks = PromptIds(tokenizer, config).encode(texts)
    codes_path = out_dir / "tokens.safetensors"
    if not codes_path.is_file():
        with clock.stage("crop codes"):
            labels, tokens = tokenize_crops(vq, TRAIN_CROPS, IMAGE_SIZE, seed)
            save_file({"labels": labels, "tokens": tokens}, codes_path)
    data = load_file(codes_path)
    streams = stream_of(data["tokens"], config)
    target_path = out_dir / "lumina_target.safetensors"
    if target_path.is_file():
        target = load_lumina(target_path)
    else:
        with clock.stage("target"):
            target = train_lumina_target(ids, masks, caption_photo, data["labels"], streams, config, out_dir, seed)
            save_model(target, target_path, "chameleon")
    drafter_path = out_dir / "lumina_drafter.safetensors"
    if drafter_path.is_file():
        drafter = load_drafter(drafter_path, target.config)
    else:
        with clock.stage("drafter"):
            per_crop = random_captions(caption_photo, data["labels"], torch.Generator().manual_seed(seed))
            drafter = train_drafter(target, ids[per_crop], streams, out_dir, seed, steps=600,
                                    caption_mask=masks[per_crop], null=lambda c, m: null(c, m, target.config))
            save_model(drafter, drafter_path, "drafter")
    return ship_lumina(out_dir, {"target": target, "drafter": drafter.eval(), "vqgan": chameleon_vqgan(vq)},
                       tokenizer_path, seed, clock.seconds)


def ship_lumina(out_dir: Path, models: dict, tokenizer_path: Path, seed: int, stage_seconds: dict) -> Path:
    from vvs.train.shipped import ship_prompt_pair

    kinds = {"target": "chameleon", "drafter": "drafter", "vqgan": "chameleon-vqgan"}
    info = {
        "description": "vvs's shipped Lumina-mGPT pair: a target of the Chameleon architecture and its EAGLE "
                       "drafter, trained from scratch on the shipped photographs' codes with their hand-written "
                       "captions; the shipped VQ tokenizer as a VQGAN of Chameleon's architecture; a BPE text "
                       "tokenizer of the captions in Chameleon's vocabulary layout.",
        "seed": seed,
        "training_seconds": round(sum(stage_seconds.values()), 1),
        "stage_seconds": stage_seconds,  # the crop codes' stage is absent where they were copied from another run
        "reproduce": f"vvs-train lumina-mgpt --out {out_dir} --seed {seed}",
        "captions": CAPTIONS,
        "decoding_defaults": LUMINA_DECODING,
    }
    return ship_prompt_pair(out_dir / "weights_lumina", "lumina",
                            {role: (model, kinds[role]) for role, model in models.items()}, tokenizer_path, TOKENIZER,
                            info)
