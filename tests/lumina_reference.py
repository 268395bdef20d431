"""Stand-ins for Lumina-mGPT tests: a tiny random ``transformers`` Chameleon (the reference implementation of the
architecture) with Chameleon's vocabulary layout, written as an official Hugging Face folder (config.json with its
``vocabulary_map``, safetensors shards with their index), and Chameleon's tokenizer folder (``text_tokenizer.json``,
``vqgan.yaml``, ``vqgan.ckpt``) holding a small random VQGAN of Chameleon's architecture. The official weights
cannot be fetched here; the folders have their formats, key names and token ids, with random values and small
sizes.

A reference greedy decoder written from the official solver's description (``FlexARInferenceSolver``: the prompt
its item processor builds, an unconditional sequence of its own starting at the image's start tag, guidance
``u + s·(c - u)``, image ids 4..8195 only inside a row, the end-of-line id forced at each row's end) runs the
transformers model, so vvs's whole path can be compared token for token.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

HEADS, HEAD_DIM, GRID, VOCAB, SLOTS = 4, 16, 4, 9000, 32
BOS, PAD, SEP, BOI, EOI, EOL = 1, 3, 8710, 8197, 8196, 8803
WORDS = ["Generate", "an", "image", "of", "according", "to", "the", "following", "prompt", ":", "a", "photo", "cat",
         "on", "sofa", "red", "bird", "branch", "bowl", "soup", "dog", "at", "night", f"{GRID * 16}x{GRID * 16}"]


def vocabulary(codes_reversed: bool = True, size: int = VOCAB) -> dict[str, int]:
    """Chameleon's layout over ``size`` ids: specials 0-3, the image ids 4..8195 named by their code (here in
    reverse order, so the name table matters), the image tags, reserved ids 8704..8843, words above them."""
    letters = "ABCDEFGHIJ"
    vocab = {"<unk>": 0, "<s>": BOS, "</s>": 2, "<pad>": PAD, "<eoss>": EOI, "<racm3:break>": BOI}
    for i in range(8192):
        code = 8191 - i if codes_reversed else i
        vocab["IMGIMG" + "".join(letters[int(d)] for d in str(code)) + "Z"] = 4 + i
    for n in range(8700, 8840):
        vocab[f"<reserved{n:05d}>"] = n + 4
    for i, word in enumerate(WORDS):
        vocab[word] = 8844 + i
    for i in range(8844 + len(WORDS), size):
        vocab[f"t{i}"] = i
    return vocab


def hf_chameleon(per_head_norms: bool, seed: int = 0):
    """A random ``ChameleonForConditionalGeneration``; its query/key norm rows differ per head only if
    ``per_head_norms`` (Lumina-mGPT's folders store one row for all heads)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    torch.manual_seed(seed)
    config = ChameleonConfig(
        vocab_size=VOCAB, hidden_size=HEADS * HEAD_DIM, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=256, rms_norm_eps=1e-5,
        vocabulary_map=vocabulary(), bos_token_id=BOS, pad_token_id=PAD,
        vq_config=dict(embed_dim=32, num_embeddings=8192, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 2], num_res_blocks=1, resolution=32))
    model = ChameleonForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight", "q_norm.bias", "k_norm.bias")):
                rows = torch.randn(HEADS if per_head_norms else 1, HEAD_DIM) * 0.3 + (1.0 if "weight" in name else 0.0)
                p.copy_(rows.expand(HEADS, -1))
            elif p.dim() >= 2:
                p.normal_(0, 0.05)
    return model


def write_official_folder(model, folder: Path, lumina_layout: bool) -> Path:
    """transformers' own save (sharded safetensors and an index); in Lumina-mGPT's layout the query/key norms keep
    one row and the VQGAN encoder is left out, as Alpha-VLLM's converter writes them."""
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="300KB")
    if lumina_layout:
        rewrite(folder, lambda k, v: None if k.startswith("model.vqmodel.") else
                (v[:1].clone() if "self_attn" in k and k.endswith(("_norm.weight", "_norm.bias")) else v))
    return folder


def rewrite(folder: Path, change) -> None:
    """Apply ``change(key, tensor)`` to every tensor of a sharded folder, index included: it returns the tensor to
    keep, None to drop it, or ``(new_key, tensor)`` to rename it."""
    from safetensors.torch import load_file, save_file

    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for shard in sorted(set(index["weight_map"].values())):
        state = {}
        for key, value in load_file(folder / shard).items():
            new = change(key, value)
            if new is None or isinstance(new, tuple):
                index["weight_map"].pop(key)
            if isinstance(new, tuple):
                key, new = new
                index["weight_map"][key] = shard
            if new is not None:
                state[key] = new
        save_file(state, folder / shard, metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))


def write_tokenizer_folder(folder: Path, seed: int = 0, size: int = VOCAB) -> Path:
    """Chameleon's tokenizer folder: a word-level ``text_tokenizer.json`` over :func:`vocabulary` (the reserved ids
    and tags as special tokens, as Chameleon's tokenizer has them) and a small random VQGAN of Chameleon's
    architecture as ``vqgan.yaml`` + ``vqgan.ckpt``."""
    import yaml

    from vvs.families.lumina_mgpt.vqgan import ChameleonVQGAN, VQGANConfig

    folder.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary(size=size)
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in vocab
                                  if name.startswith("<") and name != "<unk>"])
    tokenizer.save(str(folder / "text_tokenizer.json"))
    torch.manual_seed(seed)
    config = VQGANConfig(embed_dim=16, n_embed=8192, z_channels=32, resolution=32, ch=32, ch_mult=(1, 2),
                         num_res_blocks=1)
    vqgan = ChameleonVQGAN(config)
    with torch.no_grad():
        for name, p in vqgan.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5 / math.sqrt(p[0].numel()))
    (folder / "vqgan.yaml").write_text(yaml.safe_dump({"model": {"params": {
        "embed_dim": config.embed_dim, "n_embed": config.n_embed,
        "ddconfig": {"double_z": False, "z_channels": config.z_channels, "resolution": config.resolution,
                     "in_channels": 3, "out_ch": 3, "ch": config.ch, "ch_mult": list(config.ch_mult),
                     "num_res_blocks": config.num_res_blocks, "attn_resolutions": [], "dropout": 0.0}}}}))
    state = {k: v for k, v in vqgan.state_dict().items() if k != "quantize.stream_codes"}
    torch.save({"state_dict": state}, folder / "vqgan.ckpt")
    return folder


def random_drafter(target, seed: int = 0):
    """An EAGLE drafter of the target's layer kind with random weights and the target's embedding table: every mode
    runs; drafts are rarely accepted, which does not matter to where forced tokens stand."""
    from vvs.discrete.drafter import Drafter, DrafterConfig

    torch.manual_seed(seed)
    drafter = Drafter(DrafterConfig.for_target(target.config), target.config).eval()
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(target.embedding_table())
    return drafter


# --------------------------------------------------------------------------- the official solver, greedily


def official_prompt(prompt: str, tokenizer_file: Path) -> list[int]:
    """What ``FlexARItemProcessor.process_item`` gives for a text-to-image request: BOS, then the conversation's
    text (the human turn closed by the separator) through the Hugging Face tokenizer without its special tokens."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))
    side = GRID * 16
    turn = f"Generate an image of {side}x{side} according to the following prompt:\n{prompt}" + "<reserved08706>"
    return [BOS] + tokenizer.encode(turn, add_special_tokens=False)


@torch.no_grad()
def official_greedy(model, prompt_ids: list[int], cfg: float) -> list[int]:
    """The image ids the official solver would produce greedily for ``prompt_ids`` once the model has emitted the
    start tag and the size tokens: each step the conditional logits over the whole sequence, the unconditional ones
    over ``[start, h, w, ...]`` alone, mixed, then restricted as ``MultiModalLogitsProcessor`` restricts them."""
    size = 8804 + GRID // 2
    image = [BOI, size, size]
    generated: list[int] = []
    for n in range(GRID * (GRID + 1)):
        cond = model.lm_head(model.model(input_ids=torch.tensor([prompt_ids + image + generated])).last_hidden_state)
        uncond = model.lm_head(model.model(input_ids=torch.tensor([image + generated])).last_hidden_state)
        logits = uncond[0, -1] + cfg * (cond[0, -1] - uncond[0, -1])
        if (n + 1) % (GRID + 1) == 0:
            generated.append(EOL)
            continue
        allowed = torch.full_like(logits, float("-inf"))
        allowed[4:8196] = 0
        generated.append(int((logits + allowed).argmax()))
    return generated


# --------------------------------------------------------------------------- a tiny pair for the exactness test

TINY_WORDS = ["Generate", "an", "image", "of", "64x64", "according", "to", "the", "following", "prompt", ":", "a",
              "red", "bird", "cat", "on", "hill"]


def tiny_lumina_bundle(tmp: Path, seed: int = 0, **sizes):
    """A Lumina-tiny target (64 image ids, a 300-id vocabulary, a 4 x 4 grid; its head sharpened so that sampling
    has structure), a word-level tokenizer numbering the instruction's words, a small VQGAN, and a drafter of
    Chameleon layers trained briefly on the target's own guided samples, so that drafts get accepted: small enough
    for thousands of images. ``sizes`` override Lumina-tiny's."""
    from vvs.discrete.bundle import ModelBundle
    from vvs.discrete.engines import torch_engines
    from vvs.discrete.train_drafter import train_drafter
    from vvs.families.lumina_mgpt.model import ChameleonGen, lumina_config
    from vvs.families.lumina_mgpt.prompts import PromptIds, null
    from vvs.families.lumina_mgpt.vqgan import ChameleonVQGAN, VQGANConfig
    from vvs.runtime.options import DecodeOptions
    from vvs.runtime.pipeline import Pipeline

    torch.manual_seed(seed)
    config = lumina_config("Lumina-tiny", cls_token_num=24, **sizes)
    target = ChameleonGen(config).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(40)
    vocab = {"<unk>": 2, **{word: 100 + i for i, word in enumerate(TINY_WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp / "tokenizer.json"
    tokenizer.save(str(path))
    vq = ChameleonVQGAN(VQGANConfig(embed_dim=8, n_embed=64, z_channels=32, resolution=32, ch=32, ch_mult=(1, 2),
                                    num_res_blocks=1)).eval()
    gen = torch.Generator().manual_seed(seed)
    words = TINY_WORDS[11:]
    prompts = [" ".join(words[j] for j in torch.randint(0, len(words), (int(k),), generator=gen).tolist())
               for k in torch.randint(1, 5, (64,), generator=gen)]
    sampler = Pipeline(torch_engines(ModelBundle(target, None, vq, "lumina-mgpt", path)),
                       DecodeOptions(mode="ar", cfg_scale=2.0, top_k=0), max_batch=64)
    tokens = sampler.generate(prompts, seed=seed, decode_images=False).tokens
    ids, mask = PromptIds.from_file(path, config).encode(prompts)
    drafter = train_drafter(target, ids, tokens, tmp, seed, steps=300, batch=16, lr=3e-3, caption_mask=mask,
                            null=lambda conditions, slots: null(conditions, slots, config))
    return ModelBundle(target, drafter, vq, "lumina-mgpt", path)
